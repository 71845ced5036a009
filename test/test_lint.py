"""Linters as tests: ruff over the package, the research probes, tests, launch files and
setup.py."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which('ruff') or str(Path(sys.executable).parent / 'ruff')
    proc = subprocess.run([ruff, 'check', '--output-format', 'concise', 'act_ros', 'research',
                           'test', 'launch', 'docs/results', 'setup.py'], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _repo_text_files():
    for folder in ('act_ros', 'research', 'config', 'launch', 'test', 'docs', 'tools', 'models',
                   'urdf'):
        for path in (ROOT / folder).rglob('*'):
            if path.is_file() and path.suffix in ('.py', '.md', '.yaml', '.xml', '.urdf', ''):
                yield path
    for name in ('README.md', 'Makefile', 'setup.py', 'setup.cfg', 'package.xml'):
        yield ROOT / name


def test_references_point_inside_the_repository():
    """Code, config and docs cite only files that the repository holds."""
    import re

    outside = re.compile(r'\b(DESIGN|STYLE|ANCHORS)\.md\b|\.\./shared/')
    cited = re.compile(r'\b((?:docs|config|launch|urdf|models|tools|research)/[\w./-]+\.'
                       r'(?:md|yaml|xml|py|urdf|png))')
    problems = []
    for path in _repo_text_files():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(errors='replace')
        for match in outside.finditer(text):
            problems.append(f'{path.relative_to(ROOT)}: cites {match.group(0)} (not in the repo)')
        for match in cited.finditer(text):
            target = match.group(1).rstrip('.')
            if '<' in target or '*' in target or 'NNN' in target:
                continue
            if not (ROOT / target).exists():
                problems.append(f'{path.relative_to(ROOT)}: cites {target}, which does not exist')
    assert not problems, '\n'.join(sorted(set(problems)))
