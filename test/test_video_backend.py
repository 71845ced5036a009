"""The video decoder is chosen once, explicitly: opening a dataset logs no torchcodec
warning, whether or not torchcodec can load its FFmpeg libraries on this machine."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import types
import warnings

import numpy as np
import pytest

from act_ros.data import video_backend as vb

FALLBACK_TEXT = ('torchcodec', 'Falling back', 'libtorchcodec')


@pytest.fixture
def fresh_choice():
    """video_backend() probes again in this test, and the real choice is restored after."""
    vb.video_backend.cache_clear()
    yield
    vb.video_backend.cache_clear()


class _BrokenDecoders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``torchcodec.decoders`` that fails to import as it does without FFmpeg."""

    def find_spec(self, name, path=None, target=None):
        if name == 'torchcodec.decoders':
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise RuntimeError('Could not load libtorchcodec. Likely causes:\n  1. FFmpeg ...')


def _fake_torchcodec(monkeypatch, decoders: types.ModuleType | None) -> None:
    package = types.ModuleType('torchcodec')
    package.__spec__ = importlib.machinery.ModuleSpec('torchcodec', None, is_package=True)
    package.__path__ = []
    monkeypatch.setitem(sys.modules, 'torchcodec', package)
    if decoders is None:
        monkeypatch.delitem(sys.modules, 'torchcodec.decoders', raising=False)
        monkeypatch.setattr(sys, 'meta_path', [_BrokenDecoders(), *sys.meta_path])
    else:
        monkeypatch.setitem(sys.modules, 'torchcodec.decoders', decoders)


def test_torchcodec_not_installed_means_pyav(monkeypatch, fresh_choice, caplog):
    monkeypatch.setitem(sys.modules, 'torchcodec', None)  # find_spec() answers None
    with caplog.at_level(logging.DEBUG, logger=vb.__name__):
        assert vb.video_backend() == 'pyav'
    assert 'not installed' in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_torchcodec_that_cannot_load_ffmpeg_means_pyav_without_a_warning(
        monkeypatch, fresh_choice, caplog):
    _fake_torchcodec(monkeypatch, decoders=None)
    with caplog.at_level(logging.DEBUG, logger=vb.__name__):
        assert vb.video_backend() == 'pyav'
    assert 'RuntimeError: Could not load libtorchcodec.' in caplog.text  # the reason, at debug
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_torchcodec_that_loads_is_chosen_and_the_choice_is_cached(monkeypatch, fresh_choice):
    _fake_torchcodec(monkeypatch, decoders=types.ModuleType('torchcodec.decoders'))
    assert vb.video_backend() == 'torchcodec'
    monkeypatch.setitem(sys.modules, 'torchcodec', None)  # no longer importable...
    assert vb.video_backend() == 'torchcodec'             # ...but probed once per process


def _fallback_messages(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage()[-200:] for r in records
            if r.levelno >= logging.WARNING and any(t in r.getMessage() for t in FALLBACK_TEXT)]


def test_a_tiny_dataset_is_written_and_opened_without_a_torchcodec_warning(tmp_path, caplog):
    pytest.importorskip('lerobot.datasets.lerobot_dataset')
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from act_ros.core.contract import load_contract
    from act_ros.data import synthetic
    from act_ros.training.data import load_frames, open_dataset

    contract = load_contract()
    root = tmp_path / 'tiny'
    with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert synthetic.main(['--output', str(root), '--episodes', '1', '--frames-per-episode',
                               '4', '--image-size', '48x64', '--seed', '1']) == 0
        dataset = open_dataset(root, contract)
        item = dataset[0]
        store = load_frames(dataset, contract, (48, 64), seg_start=np.array([0]), seg_end=np.array([4]))
    assert not _fallback_messages(caplog.records)
    assert not [str(w.message) for w in caught if 'torchcodec' in str(w.message)]
    # The backend reported is the one the dataset decodes with, and it decodes.
    try:
        importlib.import_module('torchcodec.decoders')
        expected = 'torchcodec'
    except (ImportError, OSError, RuntimeError):
        expected = 'pyav'
    assert vb.video_backend() == expected
    assert dataset._video_backend == expected  # noqa: SLF001 (LeRobot 0.6 has no accessor)
    camera = contract.cameras[0].feature
    assert tuple(item[camera].shape) == (3, 48, 64)
    assert tuple(store.images[camera].shape) == (4, 3, 48, 64)

    if expected == 'pyav' and importlib.util.find_spec('torchcodec') is not None:
        # The check above can see the message: LeRobot left to choose still logs it here.
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            LeRobotDataset(f'local/{root.name}', root=root)
        assert _fallback_messages(caplog.records)
