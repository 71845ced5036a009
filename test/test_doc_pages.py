"""The pages of README.md, docs/ and research/ hold together: every relative link reaches a file of
the repository, and docs/training.md stays a how-to (its measurements live on
docs/training_results.md, which it links)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# [text](target) or [text](target "title"); code blocks and inline code are not links.
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
CODE = re.compile(r'```.*?```|`[^`\n]*`', re.S)
HOW_TO_MAX_LINES = 250


def pages(root: Path = ROOT) -> list[Path]:
    return [root / 'README.md'] + sorted((root / 'docs').rglob('*.md')) + \
        sorted((root / 'research').glob('*.md'))


def relative_links(text: str) -> list[str]:
    """The links of a markdown text to files (not to a web address or an anchor of the
    page itself), without their ``#anchor``."""
    targets = (m.group(1) for m in LINK.finditer(CODE.sub('', text)))
    return [t.split('#')[0] for t in targets
            if not re.match(r'^[A-Za-z][A-Za-z0-9+.-]*:', t) and not t.startswith('#')]


def broken_links(page: Path) -> list[str]:
    return [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]


@pytest.mark.parametrize('page', [str(p.relative_to(ROOT)) for p in pages()])
def test_relative_links_reach_a_file(page):
    broken = broken_links(ROOT / page)
    assert not broken, f'{page}: links to files that do not exist: {broken}'


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / 'docs' / 'page.md'
    page.parent.mkdir()
    (tmp_path / 'docs' / 'there.md').write_text('# there\n')
    page.write_text('[ok](there.md), [ok too](there.md#a-section), [web](https://example.org),\n'
                    '[anchor](#here), `[code](missing_in_code.md)`, [gone](gone.md#x),\n'
                    '```\n[block](missing_in_block.md)\n```\n[up](../README.md)\n')
    assert broken_links(page) == ['gone.md', '../README.md']


def test_training_how_to_is_short_and_links_its_results():
    text = (ROOT / 'docs' / 'training.md').read_text()
    lines = text.count('\n')
    assert lines <= HOW_TO_MAX_LINES, (
        f'docs/training.md has {lines} lines, over {HOW_TO_MAX_LINES}: it is the how-to; '
        'measurements and research go to docs/training_results.md')
    assert 'training_results.md' in relative_links(text)
    assert '<!-- report:' not in text, 'generated tables of results belong on docs/training_results.md'
