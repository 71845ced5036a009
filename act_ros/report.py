"""``act-ros report``: every table of figures in the README and ``docs/`` from result files.

A generated part of a page sits between two marker comments::

    <!-- report:NAME -->
    ...written by act-ros report...
    <!-- /report:NAME -->

``act-ros report`` rewrites every such part of ``README.md`` and ``docs/**/*.md`` from the
result files it names (committed under ``docs/``, and a shipped model's own evaluation
files under ``models/``); ``act-ros report --check`` writes nothing and exits 1 when a
committed page differs from what it would write (``test/test_docs_report.py`` runs it).

Every result file a part reads names the command, commit and machine that made it: a JSON
file in a top-level ``provenance`` object, any other file in the ``provenance.json`` of its
folder (``{"files": {NAME: {...}}}``). A file that holds several runs of a command (``python
-m act_ros.sim.expert_eval --output FILE --run NAME``) keeps each run's own provenance under
``provenance.runs[NAME]``, and each must name its command, commit and machine too. A file
put together by hand says so there (``assembled_by_hand``), fields added to a command's
output by hand are named with why (``hand_added``: field -> how), a run from a source
tree with local changes says what they were (``local_changes``) and a commit that was not
recorded says why (``commit``: ``not recorded; why``). Each generated part ends with a
line naming its files and, beside each, those of these that apply.

What each part shows is data, not code: ``docs/results/report.yaml`` gives every part its
table and the files, labels and runs it reads, and ``docs/results/report_tables.py`` holds
the builders of the tables that need more than ``records`` (one row per record of a file,
each column a format of its fields). To add a result (for example a new evaluation of a
shipped policy), commit the file with its provenance and name it in its part there; to add
a table, add its part there (and its builder, where ``records`` does not do).

Each ROS node's parameters file (``config/act.yaml``) and table (part
``parameters_EXECUTABLE``) are written from its declarations instead (:class:`ParameterFile`
in ``act_ros.ros.node.parameters``), and checked the same way.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from act_ros.core.arguments import HelpFormatter

ROOT = Path(__file__).resolve().parent.parent
# What each part shows (its table and the files, labels and runs it reads), and the tables'
# builders: this checkout's, whichever root a report reads its pages and results from.
DEFINITIONS = ROOT / 'docs' / 'results' / 'report.yaml'
BUILDERS = ROOT / 'docs' / 'results' / 'report_tables.py'

PROVENANCE_KEYS = ('command', 'commit', 'machine')
MARKER = re.compile(r'<!-- report:([a-z0-9_]+) -->\n(.*?)<!-- /report:\1 -->', re.S)
# A table of figures outside a generated part: its header names a measurement or a unit,
# or one of its cells (outside a column of defaults) is a measured quantity (a number with
# a unit, a decimal number).
FIGURE_HEADER = re.compile(r'(?<![\w-])(ms|s|min|h|GB|MB|kB|KB|RSS|Hz|fps|%|seconds|minutes|'
                           r'hours|time|times|latency|peak|frames|drops|align|wall clock|'
                           r'commands/s|speed-up|steps/s|samples|missed|recovered|error)'
                           r'(?![\w-])', re.I)
MEASURED_CELL = re.compile(r'^\**[~<>]?\s*[-+]?\d[\d ]*(\.\d+)?\s*(ms|s|min|h|GB|MB|kB|KB|%|Hz|'
                           r'x|fps)(?![\w-])|^\**[-+]?\d+\.\d+\**$')
DEFAULTS_COLUMN = re.compile(r'^default', re.I)


class ReportError(Exception):
    """A part cannot be generated: a missing file, or a file without its provenance."""


class Sources:
    """Reads result files relative to the repository root and remembers which were read."""

    def __init__(self, root: Path):
        self.root = root
        self.read: list[str] = []

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def text(self, rel: str) -> str:
        path = self.root / rel
        if not path.is_file():
            raise ReportError(f'{rel}: result file missing')
        if rel not in self.read:
            self.read.append(rel)
        return path.read_text()

    def json(self, rel: str) -> Any:
        return json.loads(self.text(rel))

    def jsonl(self, rel: str) -> list[dict]:
        return [json.loads(line) for line in self.text(rel).splitlines() if line.strip()]


def provenance(root: Path, rel: str) -> dict:
    """The command, commit and machine that made a result file (see the module's doc)."""
    path = root / rel
    if path.suffix == '.json':
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get('provenance'), dict):
            return data['provenance']
    folder = path.parent / 'provenance.json'
    if folder.is_file():
        entry = json.loads(folder.read_text()).get('files', {}).get(path.name)
        if isinstance(entry, dict):
            return entry
    raise ReportError(f'{rel}: no provenance (a top-level "provenance" object in a JSON file, '
                      f'else an entry in {path.parent.relative_to(root)}/provenance.json)')


def _check_commit(rel: str, entry: dict, what: str = 'provenance') -> None:
    """A commit with local changes names them; one not recorded says why."""
    commit = str(entry.get('commit', ''))
    if 'local changes' in commit and not str(entry.get('local_changes', '')).strip():
        raise ReportError(f'{rel}: {what} says "{commit}" but not what the local changes were '
                          '(expected a "local_changes" entry)')
    if commit.startswith('not recorded') and not commit.removeprefix('not recorded').strip(
            ' ;:,.'):
        raise ReportError(f'{rel}: {what} says the commit was not recorded but not why '
                          '(expected "not recorded; why")')
    hand = entry.get('hand_added', {})
    if not isinstance(hand, dict) or not all(str(v).strip() for v in hand.values()):
        raise ReportError(f'{rel}: {what}.hand_added must map each field added by hand to how '
                          'it was added')


def provenance_notes(entry: dict) -> list[str]:
    """What a part's footer says beside a file: put together by hand, fields added by
    hand, local changes, a commit not recorded."""
    notes = []
    hand = entry.get('assembled_by_hand')
    if hand:
        notes.append('assembled by hand' + (f': {hand}' if isinstance(hand, str) else ''))
    for field, how in (entry.get('hand_added') or {}).items():
        notes.append(f'`{field}` added by hand: {how}')
    commit = str(entry.get('commit', ''))
    if 'local changes' in commit:
        notes.append(f"run at {commit.split(' with local changes')[0]} with local changes: "
                     f"{entry['local_changes']}")
    if commit.startswith('not recorded'):
        notes.append(f'commit {commit}')
    for name, run in (entry.get('runs') or {}).items():
        notes += [f'{name}: {note}' for note in provenance_notes(run)]
    return notes


def check_provenance(root: Path, rel: str) -> dict:
    entry = provenance(root, rel)
    missing = [key for key in PROVENANCE_KEYS if not str(entry.get(key, '')).strip()]
    if missing:
        raise ReportError(f'{rel}: provenance lacks {", ".join(missing)}')
    _check_commit(rel, entry)
    runs = entry.get('runs', {})
    if not isinstance(runs, dict):
        raise ReportError(f'{rel}: provenance.runs is not an object (a run name to its '
                          'provenance)')
    for name, run in runs.items():
        missing = [key for key in PROVENANCE_KEYS
                   if not isinstance(run, dict) or not str(run.get(key, '')).strip()]
        if missing:
            raise ReportError(f'{rel}: provenance of run "{name}" lacks {", ".join(missing)}')
        _check_commit(rel, run, f'provenance of run "{name}"')
    return entry


# -- formatting -----------------------------------------------------------------------------

def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines) + '\n'


def records(src: Sources, file: str, rows: str, columns: dict[str, str]) -> str:
    """The report's own table: one row per record at ``rows`` (a dotted path into the file:
    a list of records, or a mapping whose keys are ``{key}``), each column a format of the
    record's fields (``'{ms_per_step:.0f}'``)."""
    found = src.json(file)
    for key in rows.split('.'):
        found = found[key]
    items = found if isinstance(found, list) else [{'key': k, **v} for k, v in found.items()]
    return table(list(columns), [[cell.format(**item) for cell in columns.values()]
                                 for item in items])


# -- the parts' definitions ------------------------------------------------------------------

@functools.cache
def definitions() -> dict[str, dict]:
    """Each part's definition from DEFINITIONS: its ``table`` (builder) and parameters."""
    return yaml.safe_load(DEFINITIONS.read_text())['parts']


@functools.cache
def builders() -> ModuleType:
    """The table builders (docs/results/report_tables.py), loaded from this checkout."""
    spec = importlib.util.spec_from_file_location('report_tables', BUILDERS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def builder(name: str) -> Callable[..., str]:
    """A table builder by the name a part gives it: ``records``, else one that BUILDERS
    lists in its ``__all__``."""
    if name == 'records':
        return records
    module = builders()
    if name not in module.__all__:
        raise ReportError(f'unknown table "{name}" (expected records or one of '
                          f'{BUILDERS.relative_to(ROOT)}: {", ".join(module.__all__)})')
    return getattr(module, name)

# -- pages -----------------------------------------------------------------------------------

def markdown_tables(text: str) -> list[tuple[int, list[list[str]]]]:
    """(first line number, rows of cells, header first) of every markdown table of
    ``text`` outside code blocks."""
    lines = text.splitlines()
    tables: list[tuple[int, list[list[str]]]] = []
    in_code, current, start = False, [], 0
    for i, line in enumerate(lines + ['']):
        if line.startswith('```'):
            in_code = not in_code
        if not in_code and line.startswith('|'):
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if not current:
                start = i + 1
            if not all(set(c) <= {'-', ':'} for c in cells) or not current:
                current.append(cells)
            continue
        if len(current) > 1:
            tables.append((start, current))
        current = []
    return tables


def is_figure_table(rows: list[list[str]]) -> bool:
    """Whether a table reports measurements: its header names a measurement or a unit, or
    a cell outside a column of defaults holds a measured quantity."""
    header = rows[0]
    if any(FIGURE_HEADER.search(cell) for cell in header):
        return True
    defaults = {i for i, cell in enumerate(header) if DEFAULTS_COLUMN.match(cell)}
    return any(MEASURED_CELL.match(cell) for row in rows[1:]
               for i, cell in enumerate(row) if i not in defaults)


def figure_tables_outside_parts(text: str) -> list[str]:
    """``line N: header`` of every table of figures outside the generated parts: typed by
    hand, it goes stale unseen (generate it from a result file with a report part)."""
    outside = MARKER.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    return [f"line {start}: | {' | '.join(rows[0])} |" for start, rows in markdown_tables(outside)
            if is_figure_table(rows)]


def written_pages(root: Path) -> list[Path]:
    """The pages written by hand: every page but a result file (a benchmark's markdown
    report names the command that wrote it in its provenance)."""
    written = []
    for page in pages(root):
        try:
            provenance(root, str(page.relative_to(root)))
        except ReportError:
            written.append(page)
    return written


def pages(root: Path) -> list[Path]:
    """The pages a report may write: README.md and every markdown page under docs/."""
    return [root / 'README.md'] + sorted((root / 'docs').rglob('*.md'))


def parameter_files() -> dict[str, Any]:
    """The ROS nodes' :class:`~act_ros.ros.node.parameters.ParameterFile` by executable."""
    from act_ros.ros.node import act_node
    from act_ros.ros.recording import record_node
    from act_ros.ros.sim_bridge import bridge

    return {f.executable: f for f in (act_node.PARAMETERS, bridge.PARAMETERS,
                                      record_node.PARAMETERS)}


def render_part(root: Path, page: Path, name: str) -> tuple[str, list[str]]:
    node = (parameter_files().get(name.removeprefix('parameters_'))
            if name.startswith('parameters_') else None)
    if node is not None:
        link = os.path.relpath(root / node.source, page.parent)
        return node.table() + ('\n<sub>Generated by `act-ros report` from the declarations in '
                               f'[`{node.source}`]({link}).</sub>\n'), []
    parts = definitions()
    if name not in parts:
        raise ReportError(f'{page.relative_to(root)}: unknown report part "{name}" '
                          f'(known: {", ".join(parts)}, parameters_EXECUTABLE)')
    params = dict(parts[name])
    kind = params.pop('table')
    make = builder(kind)
    try:
        inspect.signature(make).bind(None, **params)
    except TypeError as exc:
        raise ReportError(f'part "{name}" of {DEFINITIONS.relative_to(ROOT)}: table "{kind}" '
                          f'{exc}') from None
    src = Sources(root)
    body = make(src, **params)
    links = []
    for rel in src.read:
        entry = check_provenance(root, rel)
        link = os.path.relpath(root / rel, page.parent)
        notes = provenance_notes(entry)
        links.append(f'[`{rel}`]({link})' + (f" ({'; '.join(notes)})" if notes else ''))
    footer = (f"\n<sub>Generated by `act-ros report` from {', '.join(links)}.</sub>\n" if links
              else '\n<sub>Generated by `act-ros report`; its result file is not committed '
                   'yet.</sub>\n')
    return body + footer, src.read


def render_page(root: Path, page: Path) -> str:
    text = page.read_text()

    def replace(match: re.Match) -> str:
        name = match.group(1)
        body, _ = render_part(root, page, name)
        return f'<!-- report:{name} -->\n{body}<!-- /report:{name} -->'

    return MARKER.sub(replace, text)


def render_all(root: Path = ROOT) -> dict[Path, tuple[str, str]]:
    """Every page with a generated part, and every node's parameters file present under
    ``root``: (committed text, text the report writes)."""
    out = {}
    for page in pages(root):
        text = page.read_text()
        if '<!-- report:' in text:
            out[page] = (text, render_page(root, page))
    for node in parameter_files().values():
        if (root / node.path).is_file():
            out[root / node.path] = ((root / node.path).read_text(), node.yaml())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros report', description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument('--check', action='store_true', help='write nothing; exit 1 when a page '
                   'differs from what the report would write')
    p.add_argument('--root', type=Path, default=ROOT, help='repository root (default: this '
                   'checkout)')
    args = p.parse_args(argv)
    try:
        rendered = render_all(args.root)
    except ReportError as exc:
        print(f'act-ros report: {exc}', file=sys.stderr)
        return 1
    stale = [page for page, (old, new) in rendered.items() if old != new]
    loose = {page: figure_tables_outside_parts(page.read_text()) for page in written_pages(
        args.root)}
    for page, tables in loose.items():
        for table_line in tables:
            print(f'{page.relative_to(args.root)}: a table of figures outside a generated part '
                  f'({table_line}): generate it from a result file', file=sys.stderr)
    for page in stale:
        rel = page.relative_to(args.root)
        if args.check:
            print(f'stale: {rel} (run act-ros report)', file=sys.stderr)
        else:
            page.write_text(rendered[page][1])
            print(f'wrote {rel}')
    if (args.check and stale) or any(loose.values()):
        return 1
    if not stale:
        print(f'{len(rendered)} page(s) up to date')
    return 0


if __name__ == '__main__':
    sys.exit(main())
