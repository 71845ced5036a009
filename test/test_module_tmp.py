"""The suite's ``module_tmp`` fixture (test/conftest.py): the directories module-scoped
fixtures make are deleted when their module is done, unless a test there failed."""

import json
from pathlib import Path

pytest_plugins = ['pytester']

MODULE = '''
import json
from pathlib import Path

import pytest


@pytest.fixture(scope='module')
def data(module_tmp):
    path = module_tmp('data')
    (path / 'weights.bin').write_bytes(b'x' * 1000)
    return path


def test_uses_it(data):
    Path({record!r}).write_text(json.dumps({{'path': str(data), 'during': data.is_dir()}}))
    assert {passes}
'''

CHECK = '''
import json
from pathlib import Path


def test_after(module_tmp):
    for name in {names!r}:
        record = json.loads(Path(name).read_text())
        Path(name + '.after').write_text(json.dumps(Path(record['path']).exists()))
'''


def _run(pytester, policy: str):
    pytester.makeconftest((Path(__file__).parent / 'conftest.py').read_text())
    pytester.makeini(f'[pytest]\ntmp_path_retention_policy = {policy}\n')
    records = [str(pytester.path / f'{name}.json') for name in ('ok', 'failing')]
    pytester.makepyfile(
        test_1_ok=MODULE.format(record=records[0], passes=True),
        test_2_failing=MODULE.format(record=records[1], passes=False),
        test_3_check=CHECK.format(names=records))
    result = pytester.runpytest_subprocess('-p', 'no:cacheprovider')
    result.assert_outcomes(passed=2, failed=1)
    return [(json.loads(Path(r).read_text())['during'], json.loads(Path(r + '.after').read_text()))
            for r in records]


def test_module_dirs_are_deleted_after_their_module_unless_a_test_failed(pytester):
    # (exists while the module's tests run, exists after the module)
    assert _run(pytester, 'failed') == [(True, False), (True, True)]


def test_other_retention_policies_keep_them(pytester):
    assert _run(pytester, 'all') == [(True, True), (True, True)]
