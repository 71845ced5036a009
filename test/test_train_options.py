"""``act-ros train``'s options are made from :class:`TrainConfig`'s fields: every option the
command had before stays, the defaults its ``--help`` shows are the dataclass's, and a value
on the command line wins over the preset file, which wins over the dataclass default."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

from act_ros.core.arguments import format_default
from act_ros.training.config import TrainConfig, build_parser, config_from_args, load_preset

ROOT = Path(__file__).resolve().parents[1]

# The option strings of `act-ros train --help` before the options were generated.
OPTIONS = (
    '--dataset-root', '--output-dir', '--preset', '--model-preset', '--image-size', '--task',
    '--chunk-size', '--n-action-steps', '--steps', '--batch-size', '--lr', '--lr-backbone',
    '--weight-decay', '--grad-clip-norm', '--scheduler', '--warmup-steps',
    '--gripper-loss-weight', '--kl-weight', '--device', '--torch-threads', '--val-ratio',
    '--val-interval', '--max-val-batches', '--checkpoint-interval', '--early-stop-patience',
    '--min-steps', '--closed-loop-val-episodes', '--closed-loop-te-episodes',
    '--closed-loop-seed', '--closed-loop-episode-steps', '--camera-stats',
    '--calibrate-backbone-norm', '--no-calibrate-backbone-norm', '--image-shift-px',
    '--state-noise-std', '--state-dropout', '--aux-object-pose-weight',
    '--aux-object-pose-source', '--aux-object-pose-yaw-readout', '--backbone-freeze-step',
    '--early-freeze-layer', '--early-freeze-step', '--cache-frame-stride', '--frame-store',
    '--feature-cache-dir', '--environment-state', '--no-environment-state', '--cameras',
    '--model', '--init-from', '--precision', '--compile', '--seed', '--resume', '--skip-infer',
    '--infer-only', '--contract', '--no-progress')
# Their choices then.
CHOICES = {'--preset': ('synthetic', 'sim', 'aloha', 'arm'),
           '--model-preset': ('cpu', 'default', 'tiny'), '--scheduler': ('cosine', 'none'),
           '--camera-stats': ('imagenet', 'dataset'), '--frame-store': ('auto', 'memory', 'disk'),
           '--aux-object-pose-source': ('backbone', 'encoder'),
           '--aux-object-pose-yaw-readout': ('flatten', 'attention'),
           '--early-freeze-layer': ('layer1', 'layer2', 'layer3'),
           '--precision': ('auto', 'fp32', 'bf16', 'fp16')}


def test_every_option_of_before_is_there_with_its_choices():
    parser = build_parser()
    have = parser._option_string_actions
    missing = [name for name in OPTIONS if name not in have]
    assert not missing, f'act-ros train lost options {missing}; it has {sorted(have)}'
    for name, choices in CHOICES.items():
        assert tuple(have[name].choices) == choices, (name, have[name].choices)
    # Not given, every option is None, so that the preset can fill it.
    assert all(value is None for key, value in vars(parser.parse_args(
        ['--output-dir', 'o'])).items() if key != 'output_dir')


def _help_of(parser, dest: str) -> str:
    action = next(a for a in parser._actions if a.dest == dest)
    return ' '.join(parser._get_formatter()._format_action(action).split())


def test_help_shows_the_dataclass_defaults(monkeypatch):
    """Every option whose dataclass default is a value shows that value (a plain flag and
    --preset, whose default is the dataset's, aside); change the field, the help follows."""
    parser = build_parser()
    flags = {a.dest for a in parser._actions if type(a).__name__.startswith('_Store')
             and a.nargs == 0}
    checked = []
    for f in fields(TrainConfig):
        if f.default in (MISSING, None) or f.name in flags or f.name == 'preset':
            continue
        text = _help_of(parser, f.name)
        assert f'default: {format_default(f.default)}' in text, (f.name, f.default, text)
        checked.append(f.name)
    assert len(checked) >= 35 and 'steps' in checked, checked
    steps = next(f for f in fields(TrainConfig) if f.name == 'steps')
    monkeypatch.setattr(steps, 'default', 777)
    assert _help_of(build_parser(), 'steps').endswith('default: 777')


def test_command_line_wins_over_the_preset_which_wins_over_the_dataclass(tmp_path):
    preset = yaml.safe_load((ROOT / 'config' / 'train_sim.yaml').read_text())['train']
    default = {f.name: f.default for f in fields(TrainConfig)}
    assert preset['steps'] != default['steps'] and 'seed' not in preset
    base = ['--dataset-root', str(tmp_path), '--output-dir', str(tmp_path / 'o'),
            '--preset', 'sim']
    parser = build_parser()
    config = config_from_args(parser.parse_args(base))
    assert config.steps == preset['steps'], 'the preset file lost to the dataclass default'
    assert config.seed == default['seed'] and config.scheduler == default['scheduler']
    config = config_from_args(parser.parse_args([*base, '--steps', '7', '--seed', '3']))
    assert (config.steps, config.seed) == (7, 3), 'the command line lost to the preset file'
    # An option the preset turns on is turned off on the command line.
    assert preset['calibrate_backbone_norm'] is True
    assert not config_from_args(parser.parse_args(
        [*base, '--no-calibrate-backbone-norm'])).calibrate_backbone_norm


def test_preset_keys_and_values_are_checked_against_the_fields(tmp_path):
    path = tmp_path / 'train_x.yaml'
    path.write_text('train:\n  steps: 5\n  stepz: 6\n')
    with pytest.raises(ValueError, match=r"unknown settings \['stepz'\] .*'steps'"):
        load_preset('sim', path)
    with pytest.raises(ValueError, match="unknown scheduler 'linear', expected one of"):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, scheduler='linear')
    with pytest.raises(ValueError, match=r"steps must be >= 1, got '5'"):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, steps='5')  # YAML: steps: '5'
    with pytest.raises(ValueError, match=r'lr must be > 0, got inf'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, lr=float('inf'))
    with pytest.raises(ValueError, match=r'val_ratio must be in \[0, 1\), got 1.0'):
        TrainConfig(dataset_root=tmp_path, output_dir=tmp_path, val_ratio=1.0)
    # The parser refuses what the dataclass refuses, by the same declaration.
    with pytest.raises(SystemExit):
        build_parser().parse_args(['--output-dir', 'o', '--scheduler', 'linear'])
