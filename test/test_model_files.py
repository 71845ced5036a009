"""What git tracks under ``models/``: a shipped model's own files, each named by its card,
and never an export or a cache compiled for one machine; and where exports of the
package's models go (the user cache)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from act_ros.core.inference.export import EXPORT_DIR, TensorSpec, cache_export_dir, find_export, package_model

ROOT = Path(__file__).resolve().parents[1]
CARD = 'MODEL_CARD.md'
LISTED = re.compile(r'^- `([^`]+)`')


def _tracked(under: str) -> list[str]:
    if shutil.which('git') is None or not (ROOT / '.git').exists():
        pytest.skip('not a git checkout')
    out = subprocess.run(['git', 'ls-files', '-z', under], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [p for p in out.split('\0') if p]


def card_files(card: Path) -> list[str]:
    """The files a model card lists in its ``## Files`` section (``- `name`: what``)."""
    files, inside = [], False
    for line in card.read_text().splitlines():
        if line.startswith('#'):
            inside = line.strip() == '## Files'
            continue
        match = LISTED.match(line)
        if inside and match:
            files.append(match.group(1))
    return files


def unlisted(tracked: list[str]) -> list[str]:
    """Tracked paths under models/ that no card lists: anything outside a model folder
    but models/README.md, any file of a folder without a card, any file its card does
    not name (an export, a cache, a stray checkpoint)."""
    bad = []
    for rel in tracked:
        parts = Path(rel).parts
        if parts == ('models', 'README.md'):
            continue
        if len(parts) < 3:
            bad.append(f'{rel} (not in a model folder)')
            continue
        card = ROOT / parts[0] / parts[1] / CARD
        if not card.is_file():
            bad.append(f'{rel} (its folder has no {CARD})')
        elif '/'.join(parts[2:]) not in card_files(card):
            bad.append(f'{rel} (not listed in {parts[1]}/{CARD})')
    return bad


def test_every_tracked_file_under_models_is_listed_by_its_card():
    tracked = _tracked('models')
    assert 'models/sim_port_pick_align_poses/model.safetensors' in tracked
    assert unlisted(tracked) == []
    for card in sorted({ROOT / Path(p).parent / CARD for p in tracked if p.count('/') >= 2}):
        missing = [f for f in card_files(card) if not (card.parent / f).is_file()]
        assert not missing, f'{card.relative_to(ROOT)} lists files that are not there: {missing}'


def test_an_export_or_a_cache_blob_would_fail_the_check():
    name = 'models/sim_port_pick_align_poses'
    assert unlisted([f'{name}/{EXPORT_DIR}/model_48x64.onnx.json',
                     f'{name}/{EXPORT_DIR}/openvino_cache/11ed1ed07a9de571/1.blob',
                     f'{name}/config.json', 'models/mine/model.safetensors']) == [
        f'{name}/{EXPORT_DIR}/model_48x64.onnx.json (not listed in '
        f'sim_port_pick_align_poses/{CARD})',
        f'{name}/{EXPORT_DIR}/openvino_cache/11ed1ed07a9de571/1.blob (not listed in '
        f'sim_port_pick_align_poses/{CARD})',
        f'models/mine/model.safetensors (its folder has no {CARD})']


def test_git_ignores_exports_and_compiled_caches():
    _tracked('models')
    paths = ['models/sim_port_pick_align_poses/export/model_48x64.onnx.json',
             'models/sim_port_pick_align/export/openvino_cache/ab/1.blob',
             'models/sim_port_pick_align_192x256/export/model_192x256_int8.bin']
    out = subprocess.run(['git', 'check-ignore', '--no-index', *paths], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    assert out == paths


def test_a_package_model_exports_to_the_user_cache(tmp_path, monkeypatch):
    """A model in the package's models/ folder never gets an export/ folder; a user's
    checkpoint elsewhere keeps its export beside it."""
    share = tmp_path / 'share'
    (share / 'models' / 'shipped').mkdir(parents=True)
    (tmp_path / 'mine').mkdir()
    monkeypatch.setenv('ACT_ROS_SHARE_DIR', str(share))
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    inputs = [TensorSpec('observation.state', (1, 6)),
              TensorSpec('observation.images.top', (1, 3, 48, 64))]
    output = TensorSpec('action', (1, 30, 6))
    assert package_model(share / 'models' / 'shipped')
    assert not package_model(tmp_path / 'mine')
    path, reason = find_export(share / 'models' / 'shipped', ckpt_hash='abc', inputs=inputs,
                               output=output)
    assert path == cache_export_dir('abc') / 'model_48x64.onnx'
    assert path.is_relative_to(tmp_path / 'cache' / 'act_ros' / EXPORT_DIR)
    assert reason == 'no export yet'
    assert not (share / 'models' / 'shipped' / EXPORT_DIR).exists()
    path, _ = find_export(tmp_path / 'mine', ckpt_hash='abc', inputs=inputs, output=output)
    assert path == tmp_path / 'mine' / EXPORT_DIR / 'model_48x64.onnx'
