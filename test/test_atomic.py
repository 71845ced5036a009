"""Whole-file and whole-directory replacement: a reader never sees a partial file or a
missing directory."""

import json
import threading

import pytest

from act_ros.core import atomic


def test_replace_dir_swaps_without_a_moment_where_the_target_is_missing(tmp_path):
    target = tmp_path / 'last'
    target.mkdir()
    (target / 'v').write_text('0')
    missing = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if not target.is_dir():
                missing.append(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for k in range(1, 200):
            staging = tmp_path / f'.last.staging-{k}'
            staging.mkdir()
            (staging / 'v').write_text(str(k))
            atomic.replace_dir(staging, target)
            assert not staging.exists()
    finally:
        stop.set()
        watcher.join()
    assert (target / 'v').read_text() == '199'
    if atomic._renameat2() is not None:
        assert not missing, f'last/ was missing {len(missing)} times'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['last']


def test_replace_dir_without_exchange_still_replaces(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, 'exchange', lambda a, b: False)
    target = tmp_path / 'model'
    target.mkdir()
    staging = tmp_path / 'new'
    staging.mkdir()
    (staging / 'f').write_text('new')
    atomic.replace_dir(staging, target)
    assert (target / 'f').read_text() == 'new'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['model']
    fresh = tmp_path / 'fresh'
    other = tmp_path / 'other'
    other.mkdir()
    atomic.replace_dir(other, fresh)  # nothing there yet
    assert fresh.is_dir()


def test_atomic_writes_leave_no_partial_file(tmp_path):
    path = tmp_path / 'sub' / 'report.json'
    atomic.write_json_atomic(path, {'a': 1, 'p': tmp_path})
    assert json.loads(path.read_text()) == {'a': 1, 'p': str(tmp_path)}
    with pytest.raises(ValueError):
        atomic.write_json_atomic(path, {'a': float('nan')})  # strict JSON only
    assert json.loads(path.read_text())['a'] == 1  # the old file is intact
    assert [p.name for p in path.parent.iterdir()] == ['report.json']
