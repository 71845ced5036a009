"""``act-ros report``: the tables of figures in README.md and docs/ are generated from the
committed result files, and a page that differs from what the report writes fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from act_ros import report

ROOT = report.ROOT
tables = report.builders()  # docs/results/report_tables.py
RESULT_SUFFIXES = {'.json', '.jsonl', '.log', '.txt', '.csv'}


def test_generated_parts_are_current():
    """The report re-run in memory equals every committed page (else: run act-ros report)."""
    rendered = report.render_all(ROOT)
    assert rendered, 'no page has a generated part'
    stale = [str(page.relative_to(ROOT)) for page, (old, new) in rendered.items() if old != new]
    assert not stale, f'stale generated tables in {stale}: run `act-ros report`'


def test_check_mode_fails_on_a_stale_page(tmp_path, capsys):
    (tmp_path / 'docs').mkdir()
    for rel in ('docs/benchmarks/faults.json',):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    page = tmp_path / 'README.md'
    page.write_text('# x\n\n<!-- report:faults -->\nan old table\n<!-- /report:faults -->\n')
    assert report.main(['--check', '--root', str(tmp_path)]) == 1
    assert 'stale: README.md' in capsys.readouterr().err
    assert page.read_text().endswith('an old table\n<!-- /report:faults -->\n')
    assert report.main(['--root', str(tmp_path)]) == 0
    text = page.read_text()
    assert '| camera stale | 2 | 2 |' in text and 'docs/benchmarks/faults.json' in text
    assert report.main(['--check', '--root', str(tmp_path)]) == 0


def test_parameter_files_and_tables_are_generated_from_the_declarations(tmp_path, capsys):
    """The nodes' parameters files and docs/parameters.md are checked like any part: a file
    edited by hand (or a declaration changed without running the report) is stale."""
    rendered = {str(page.relative_to(ROOT)) for page in report.render_all(ROOT)}
    assert {'config/act.yaml', 'config/sim_bridge.yaml', 'config/record.yaml',
            'docs/parameters.md'} <= rendered, rendered
    text = (ROOT / 'config' / 'act.yaml').read_text()
    (tmp_path / 'config').mkdir()
    (tmp_path / 'config' / 'act.yaml').write_text(text.replace('# Checkpoint directory',
                                                               '# Checkpoint folder'))
    (tmp_path / 'README.md').write_text('# x\n')
    assert report.main(['--check', '--root', str(tmp_path)]) == 1
    assert 'stale: config/act.yaml' in capsys.readouterr().err
    assert report.main(['--root', str(tmp_path)]) == 0
    assert (tmp_path / 'config' / 'act.yaml').read_text() == text


def test_a_result_file_without_provenance_is_refused(tmp_path):
    rel = 'docs/benchmarks/faults.json'
    (tmp_path / rel).parent.mkdir(parents=True)
    data = json.loads((ROOT / rel).read_text())
    del data['provenance']
    (tmp_path / rel).write_text(json.dumps(data))
    (tmp_path / 'README.md').write_text('<!-- report:faults -->\n<!-- /report:faults -->\n')
    with pytest.raises(report.ReportError, match='no provenance'):
        report.render_all(tmp_path)


def _result_files():
    for path in sorted((ROOT / 'docs' / 'results').rglob('*')):
        if path.suffix in RESULT_SUFFIXES and path.name != 'provenance.json':
            yield str(path.relative_to(ROOT))


@pytest.mark.parametrize('rel', list(_result_files()))
def test_every_result_file_names_command_commit_and_machine(rel):
    entry = report.check_provenance(ROOT, rel)
    assert all(str(entry[key]).strip() for key in report.PROVENANCE_KEYS)


@pytest.mark.parametrize('page', [str(p.relative_to(ROOT)) for p in report.written_pages(ROOT)])
def test_tables_of_figures_are_generated(page):
    """A table that reports measurements lies inside a generated part."""
    loose = report.figure_tables_outside_parts((ROOT / page).read_text())
    assert not loose, (f'{page}: tables of figures outside <!-- report:NAME --> parts '
                       f'(generate them with act-ros report): {loose}')


def test_the_guard_catches_any_table_of_figures_typed_by_hand(tmp_path, capsys):
    """Whatever its header says: an "RSS" or an "s" column, or cells that hold measured
    quantities; a table of parameters with their defaults, or of exit statuses, is not
    one, and a table inside a generated part is checked against its files instead."""
    rss = ('| what | command | peak RSS (process tree) | save time |\n|---|---|---|---|\n'
           '| recorder | `record --minutes 1.5` | 1.28 GB | 3.7, 6.1 s |\n')
    seconds = '| save | s |\n|---|---|\n| episode 1 | 3.7 |\n'
    unlabelled = '| run | result |\n|---|---|\n| import | 45 s |\n| again | 1.04 GB |\n'
    parameters = ('| parameter | default | what |\n|---|---|---|\n'
                  '| `writer_queue_s` | 2.0 | seconds of frames that may wait |\n')
    statuses = '| status | meaning |\n|---|---|\n| 0 | passed |\n| 2 | no baseline |\n'
    for table in (rss, seconds, unlabelled):
        assert report.figure_tables_outside_parts(f'# page\n\n{table}'), table
    for table in (parameters, statuses):
        assert not report.figure_tables_outside_parts(f'# page\n\n{table}'), table
    inside = f'<!-- report:faults -->\n{rss}<!-- /report:faults -->\n'
    assert not report.figure_tables_outside_parts(inside)
    assert not report.figure_tables_outside_parts(f'```\n{rss}```\n')
    # act-ros report --check fails on such a page too, naming the table.
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'README.md').write_text(f'# x\n\n{seconds}')
    assert report.main(['--check', '--root', str(tmp_path)]) == 1
    assert 'README.md: a table of figures outside a generated part (line 3: | save | s |)' \
        in capsys.readouterr().err


def test_parts_link_their_files():
    rendered = report.render_all(ROOT)
    for page, (_, new) in rendered.items():
        for match in report.MARKER.finditer(new):
            footer = match.group(2).split('Generated by')[-1]
            links = re.findall(r'\]\(([^)]+)\)', footer)
            assert links or 'not committed yet' in footer, \
                f'{page}: part {match.group(1)} names no file'
            for link in links:
                assert (page.parent / link).resolve().is_file(), (page, link)


def test_every_defined_part_is_on_a_page_and_names_a_table():
    """docs/results/report.yaml defines the parts the pages hold, each with a known table
    whose parameters it takes (a part no page shows would go stale unseen); so does each
    node's parameter table."""
    on_pages = {m.group(1) for old, _ in report.render_all(ROOT).values()
                for m in report.MARKER.finditer(old)}
    nodes = {f'parameters_{executable}' for executable in report.parameter_files()}
    assert set(report.definitions()) | nodes == on_pages
    with pytest.raises(report.ReportError, match='unknown table "nothing"'):
        report.builder('nothing')
    assert set(tables.__all__) <= {part['table'] for part in report.definitions().values()}


def test_a_part_with_a_parameter_its_table_does_not_take_is_refused(monkeypatch):
    parts = {'faults': {**report.definitions()['faults'], 'folder': 'docs/benchmarks'}}
    monkeypatch.setattr(report, 'definitions', lambda: parts)
    with pytest.raises(report.ReportError, match='part "faults" .* table "faults" .*folder'):
        report.render_part(ROOT, ROOT / 'README.md', 'faults')


def test_records_rows_are_formats_of_each_record(tmp_path):
    rel = 'r.json'
    (tmp_path / rel).write_text(json.dumps({'a': {'b': {'x': {'n': 1.25}, 'y': {'n': 2}}}}))
    body = report.records(report.Sources(tmp_path), rel, 'a.b',
                          {'name': '`{key}`', 'n': '{n:.1f} s'})
    assert body == '| name | n |\n|---|---|\n| `x` | 1.2 s |\n| `y` | 2.0 s |\n'


def test_report_is_an_act_ros_command():
    from act_ros import cli
    assert cli.COMMANDS['report'][0] == 'act_ros.report'
    assert Path(report.__file__).name == 'report.py'


def test_precision_table_pairs_episodes_by_seed(tmp_path):
    """A precision that aligns other seeds than fp32 shows them, whatever the rates."""
    def write(name, precision, successes):
        episodes = [{'seed': 10 + k, 'success': ok} for k, ok in enumerate(successes)]
        data = {'provenance': {'command': 'c', 'commit': 'x', 'machine': 'm'},
                'backend': 'openvino', 'precision': precision,
                'modes': {'chunk': {'align_rate': sum(successes) / len(successes),
                                    'count': len(successes), 'mean_position_error': 0.01,
                                    'mean_yaw_error': 1.0, 'failures': {'release': 1},
                                    'episodes': episodes}}}
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        return name

    first = write('a/fp32.json', 'fp32', [True, True, False, False])
    second = write('a/bf16.json', {'precision': 'bf16'}, [True, False, True, False])
    rows = tables.precisions(report.Sources(tmp_path),
                             files=[first, second, 'a/missing.json']).splitlines()
    assert rows[2].split('|')[1:3] == [' openvino fp32 ', ' 0.50 (2/4) ']
    assert rows[3].split('|')[1].strip() == 'openvino bf16'
    assert rows[3].split('|')[5].strip() == '1 / 1'  # seed 12 gained, seed 11 lost
    assert len(rows) == 4  # the missing file is left out


def _expert_file(tmp_path, plain_provenance: dict) -> None:
    """An expert_eval.json as ``expert_eval --output FILE --run NAME`` writes it."""
    runs = {'plain': {'args': '--episodes 4', 'count': 4, 'align_rate': 0.75,
                      'mean_position_error': 0.0012, 'mean_yaw_error': 0.01,
                      'failures': {'grasp': 1, 'yaw': 0}},
            'perturbed': {'args': '--perturb --episodes 3', 'count': 3, 'align_rate': 1.0,
                          'mean_position_error': 0.0009, 'mean_yaw_error': 0.02,
                          'by_perturbation': {'push_box': {'count': 2, 'aligned': 2},
                                              'open_gripper': {'count': 1, 'aligned': 1}}}}
    own = {'plain': plain_provenance,
           'perturbed': {'command': 'python -m act_ros.sim.expert_eval --perturb',
                         'commit': 'abc1234', 'machine': 'm'}}
    data = {'provenance': {'command': 'c1; c2', 'commit': 'abc1234', 'machine': 'm',
                           'runs': own}, 'runs': runs}
    path = tmp_path / report.definitions()['expert_runs']['file']
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_expert_runs_carry_their_own_provenance(tmp_path):
    """A file of several runs names each run's command, commit and machine; a run without
    them is refused like a file without them."""
    _expert_file(tmp_path, {'command': 'python -m act_ros.sim.expert_eval', 'commit': 'abc1234',
                            'machine': 'm'})
    page = tmp_path / 'docs' / 'page.md'
    page.parent.mkdir(exist_ok=True)
    body, read = report.render_part(tmp_path, page, 'expert_runs')
    assert read == [report.definitions()['expert_runs']['file']]
    assert '| `--episodes 4` | 4 | 3 | 1.20 mm / 0.0100 deg |' in body
    assert '| `--perturb --episodes 3` | 3 | 3 | 0.90 mm / 0.0200 deg |' in body
    assert 'assembled by hand' not in body and '(results/expert/expert_eval.json)' in body
    body, _ = report.render_part(tmp_path, page, 'expert_perturbations')
    assert '| `push_box` | 2 / 2 |' in body and '| `open_gripper` | 1 / 1 |' in body

    _expert_file(tmp_path, {'command': 'python -m act_ros.sim.expert_eval', 'machine': 'm'})
    with pytest.raises(report.ReportError, match='run "plain" lacks commit'):
        report.render_part(tmp_path, page, 'expert_runs')


def test_recipe_runs_side_by_side_keep_each_runs_stage_order(tmp_path):
    """Two recipe runs with different stages (a pose pretraining before the vision stage in
    the second): one row per stage in the order of the runs, DAgger by iteration, and the
    align-rate curve counts every stage before DAgger."""
    prov = {'command': 'c', 'commit': 'x', 'machine': 'm'}

    def run(folder, stages, iterations, rate):
        root = tmp_path / folder
        (root / 'curve').mkdir(parents=True)
        (root / 'recipe.json').write_text(json.dumps({'provenance': prov,
                                                      'stage_seconds': stages}))
        (root / 'dagger.jsonl').write_text(''.join(
            json.dumps({'iteration': k, 'collect_s': 60.0, 'train_s': 120.0}) + '\n'
            for k in iterations))
        (root / 'provenance.json').write_text(json.dumps({'files': {'dagger.jsonl': prov}}))
        (root / 'curve' / 'after_vision.json').write_text(json.dumps({
            'provenance': prov, 'modes': {'chunk': {
                'align_rate': rate, 'count': 100, 'mean_position_error': 0.05,
                'mean_yaw_error': 10.0, 'failures': {'grasp': 3}}}}))
        return {'label': folder, 'folder': folder, 'evaluations': [f'{folder}/evaluation.json']}

    runs = [run('one', {'demos': 600.0, 'vision': 1200.0, 'dagger': 360.0, 'evaluate': 60.0},
                (1, 2), 0.1),
            run('two', {'demos': 1200.0, 'pose': 3600.0, 'vision': 1800.0}, (1,), 0.2)]
    src = report.Sources(tmp_path)
    rows = [line.split('|')[1:-1] for line in
            tables.recipe_stages(src, runs).splitlines()[2:]]
    assert [r[0].strip() for r in rows][:6] == [
        'demos', 'pose', 'vision', 'dagger 1: collect + fine-tune',
        'dagger 2: collect + fine-tune', 'dagger in all']
    assert [c.strip() for c in rows[1][1:]] == ['', '60.0 min']
    assert [c.strip() for c in rows[5][1:]] == ['6.0 min', '3.0 min']
    lines = tables.recipe_curve(src, runs).splitlines()[2:]
    hours = {(line.split('|')[1].strip(), line.split('|')[2].strip()): line.split('|')[3].strip()
             for line in lines}
    assert hours[('one', 'vision stage')] == '0.50' and hours[('two', 'vision stage')] == '1.83'


def test_exact_mcnemar_matches_the_binomial_test():
    # 2 * P(X <= 1) for X ~ Binomial(10, 1/2) = 2 * 11 / 1024
    assert tables.exact_mcnemar(1, 9) == pytest.approx(22 / 1024)
    assert tables.exact_mcnemar(9, 1) == tables.exact_mcnemar(1, 9)
    assert tables.exact_mcnemar(5, 5) == 1.0 and tables.exact_mcnemar(0, 0) == 1.0


def test_ship_candidates_pair_seeds_across_files(tmp_path):
    """Each candidate's files are joined by seed and compared seed by seed with the first
    candidate; a candidate on other seeds is refused rather than compared."""
    def write(name, successes, first_seed):
        episodes = [{'seed': first_seed + k, 'success': ok, 'position_error_m': 0.02,
                     'yaw_error_deg': 4.0} for k, ok in enumerate(successes)]
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({'modes': {'chunk': {'episodes': episodes}}}))
        return name

    old = (write('a/old_1.json', [True, False], 0), write('a/old_2.json', [False, False], 2))
    new = (write('a/new_1.json', [True, True], 0), write('a/new_2.json', [True, False], 2))
    def candidates(**files):
        return [{'label': label, 'files': rels} for label, rels in files.items()]

    rows = tables.ship_candidates(report.Sources(tmp_path), candidates(old=old, new=new)
                                  ).splitlines()
    cells = [c.strip() for c in rows[3].split('|')[1:-1]]
    assert cells[:3] == ['new', '0-3', '0.75 (3/4)']
    assert cells[4] == '2 / 0' and cells[5] == f'{tables.exact_mcnemar(2, 0):.3f}'
    assert [c.strip() for c in rows[2].split('|')[1:-1]][4] == '0 / 0'

    other = (write('a/other.json', [True, True, True, True], 10),)
    with pytest.raises(report.ReportError, match='other seeds'):
        tables.ship_candidates(report.Sources(tmp_path), candidates(old=old, other=other))


def test_footers_name_hand_added_fields_local_changes_and_unrecorded_commits(tmp_path):
    rel = 'docs/benchmarks/faults.json'
    (tmp_path / rel).parent.mkdir(parents=True)
    data = json.loads((ROOT / rel).read_text())
    page = tmp_path / 'README.md'
    page.write_text('<!-- report:faults -->\n<!-- /report:faults -->\n')

    def render(**provenance):
        data['provenance'] = {'command': 'act-ros bench faults', 'machine': 'm', **provenance}
        (tmp_path / rel).write_text(json.dumps(data))
        return report.render_part(tmp_path, page, 'faults')[0].split('Generated by')[-1]

    with pytest.raises(report.ReportError, match='not what the local changes were'):
        render(commit='abc1234 with local changes')
    footer = render(commit='abc1234 with local changes', local_changes='act_ros/report.py only')
    assert '(run at abc1234 with local changes: act_ros/report.py only)' in footer
    with pytest.raises(report.ReportError, match='not why'):
        render(commit='not recorded')
    footer = render(commit='not recorded; the tool wrote none then', hand_added={
        'exit_s': 'timed with a stopwatch'})
    assert ('(`exit_s` added by hand: timed with a stopwatch; commit not recorded; the tool '
            'wrote none then)') in footer
    with pytest.raises(report.ReportError, match='hand_added'):
        render(commit='abc1234', hand_added={'exit_s': ''})


def test_a_command_run_from_a_changed_tree_names_the_changed_files(monkeypatch):
    from act_ros import provenance as prov

    monkeypatch.setattr(prov, 'source_commit', lambda: 'abc1234 with local changes')
    monkeypatch.setattr(prov, 'local_changes', lambda: ['act_ros/report.py', 'README.md'])
    monkeypatch.setattr(prov, 'machine_description', lambda: 'm')
    out = prov.result_provenance('act-ros evaluate', ['--episodes', '3'], output_path=None)
    assert out['local_changes'] == 'act_ros/report.py, README.md'
    monkeypatch.setattr(prov, 'source_commit', lambda: 'abc1234')
    assert 'local_changes' not in prov.result_provenance('c', [], output_path=None)
