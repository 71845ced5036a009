"""act-ros recipe: stages as child processes, skipped when done, training resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from act_ros.training.drivers import recipe as recipe_mod

pytest.importorskip('mujoco')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

pytestmark = pytest.mark.sim

# A recipe stage that collects one short expert episode at 48x64.
_DEMOS_STAGE = '''    - name: demos
      command: collect
      args: [--output, '{run}/demos', --episodes, '1', --seed, '3', --image-size, 48x64,
             --episode-steps, '245', --no-progress]
      done: '{run}/demos/meta/info.json'
      expected_min: 1
'''


def test_shipped_recipes_load_and_name_their_stages(tmp_path):
    r = recipe_mod.load_recipe('object_state')
    names = [s.name for s in r.stages]
    assert names == ['demos', 'bc', 'dagger', 'final', 'evaluate']
    assert all('{run}' in s.done for s in r.stages)
    smoke = recipe_mod.load_recipe('smoke')
    assert [s.name for s in smoke.stages] == names[:4]   # the same stages, smoke-sized
    # Expected times per CPU class, both classes measured for every stage; the vision
    # recipe was timed on one class only and says so on another.
    assert r.measured_classes() == ['x86-avx2', 'x86-avx512-bf16']
    assert r.expected_on('x86-avx512-bf16') < 120 < r.expected_on('x86-avx2')
    vision = recipe_mod.load_recipe('vision')
    assert vision.expected_on('x86-avx512-bf16') > 120 and vision.expected_on('x86-avx2') is None
    assert 'not measured on a x86-avx2 CPU; measured: x86-avx512-bf16 about ' \
        in vision.expected_line('x86-avx2')
    assert smoke.expected_on('arm64') == smoke.expected_on('x86-avx2') == 6
    # The 192x256 recipe starts from the shipped vision policy, wherever the package is.
    pose = recipe_mod.load_recipe('vision_pose')
    assert [s.name for s in pose.stages] == ['demos', 'pose', 'pose_continued', 'vision', 'dagger',
                                                'evaluate']
    cmd = recipe_mod._stage_command(pose.stages[1], tmp_path)
    source = Path(cmd[cmd.index('--checkpoint') + 1])
    assert (source / 'model.safetensors').is_file() and source.name == 'sim_port_pick_align'
    assert cmd[cmd.index('pose-pretrain') - 1] == 'act_ros.cli' and '--resume' not in cmd


def test_expected_minutes_per_cpu_class_are_printed_for_this_cpu(tmp_path, monkeypatch, capsys):
    path = tmp_path / 'recipe_t.yaml'
    path.write_text('''recipe:
  description: timing
  reference: a 2-core CPU
  stages:
    - {name: a, command: collect, args: [], done: '{run}/a', expected_min: {x86-avx2: 10, arm64: 30}}
    - {name: b, command: train, args: [], done: '{run}/b', expected_min: 5}
''')
    r = recipe_mod.load_recipe('t', path)
    assert r.expected_on('x86-avx2') == 15 and r.expected_on('arm64') == 35
    assert r.expected_on('x86-avx512') is None
    assert r.expected_line('arm64') == ('expected wall clock on this CPU (arm64): about 35 min '
                                        '(a 2-core CPU)')
    monkeypatch.setattr('act_ros.core.inference.precision.cpu_class', lambda: 'x86-avx512')
    assert recipe_mod.main(['t', '--file', str(path), '--run-dir', str(tmp_path / 'r'),
                            '--list']) == 0
    out = capsys.readouterr().out
    assert ('expected wall clock: not measured on a x86-avx512 CPU; measured: arm64 about 35 '
            'min, x86-avx2 about 15 min (a 2-core CPU)') in out
    assert 'act-ros collect        ~   ? min  to run' in out
    assert 'act-ros train          ~   5 min  to run' in out
    bad = tmp_path / 'recipe_bad.yaml'
    bad.write_text("recipe:\n  stages:\n    - {name: a, command: collect, args: [], done: x, "
                   "expected_min: soon}\n")
    with pytest.raises(ValueError, match=r"stage a: expected_min must be minutes or "
                                         r"\{cpu_class: minutes\}, got 'soon'"):
        recipe_mod.load_recipe('bad', bad)


def test_unknown_recipe_and_bad_stage_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no recipe 'nope'"):
        recipe_mod.load_recipe('nope')
    bad = tmp_path / 'recipe_x.yaml'
    bad.write_text('recipe:\n  stages:\n    - {name: a, command: rm, args: [], done: x}\n')
    with pytest.raises(ValueError, match="unknown command 'rm'"):
        recipe_mod.load_recipe('x', bad)


@pytest.mark.slow
def test_a_recipe_runs_its_stages_once_and_continues_after_a_stop(tmp_path, capsys):
    path = tmp_path / 'recipe_tiny.yaml'
    path.write_text('''recipe:
  description: smoke
  stages:
''' + _DEMOS_STAGE + '''    - name: bc
      command: train
      args: [--preset, sim, --dataset-root, '{run}/demos', --output-dir, '{run}/bc',
             --cameras, none, --environment-state, --model-preset, tiny, --steps, '6',
             --val-interval, '3', --checkpoint-interval, '3', --closed-loop-val-episodes, '0',
             --skip-infer, --torch-threads, '1', --no-progress]
      done: '{run}/bc/training_metrics.json'
      expected_min: 1
''')
    r = recipe_mod.load_recipe('tiny', path)
    run_dir = tmp_path / 'run'
    record = recipe_mod.run(r, run_dir, argv=['tiny', '--run-dir', str(run_dir)])
    assert set(record['stage_seconds']) == {'demos', 'bc'}
    # The record says what made it, without this machine's run directory.
    written = json.loads((run_dir / 'recipe.json').read_text())
    assert written['provenance']['command'] == 'act-ros recipe tiny'
    assert written['provenance']['commit'] and 'CPU class' in written['provenance']['machine']
    metrics = json.loads((run_dir / 'bc' / 'training_metrics.json').read_text())
    assert metrics['status'] == 'completed' and metrics['steps_completed'] == 6
    # Done stages are skipped: nothing is rerun.
    stamp = (run_dir / 'bc' / 'training_metrics.json').stat().st_mtime_ns
    recipe_mod.run(r, run_dir)
    assert (run_dir / 'bc' / 'training_metrics.json').stat().st_mtime_ns == stamp
    assert 'bc: done' in capsys.readouterr().out
    # A training stage stopped half-way (last/ but no finished metrics) resumes.
    (run_dir / 'bc' / 'training_metrics.json').unlink()
    cmd = recipe_mod._stage_command(r.stages[1], run_dir)
    assert cmd[-1] == '--resume' and '--init-from' not in cmd


def test_an_interrupted_training_inside_a_dagger_stage_is_not_done(tmp_path):
    """`make demo DEMO_ARGS=--full-loop` runs the object_state recipe: its dagger stage is
    done when the last iteration's training_metrics.json exists. An interrupted training
    writes that file too (status interrupted): the stage must run again (the DAgger loop
    resumes it), not count as done."""
    r = recipe_mod.load_recipe('object_state')
    (dagger,) = [s for s in r.stages if s.command == 'dagger']
    marker = Path(recipe_mod._expand(dagger.done, tmp_path))
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({'status': 'interrupted', 'steps_completed': 1200}))
    assert not recipe_mod._is_done(dagger, tmp_path)
    marker.write_text(json.dumps({'status': 'completed', 'steps_completed': 4000}))
    assert recipe_mod._is_done(dagger, tmp_path)


def test_a_pose_pretraining_stage_is_done_at_its_last_step_and_resumes(tmp_path):
    """pose-pretrain writes its result file at every validation: the stage is done only
    once the file's step is the last, and an interrupted one continues with --resume."""
    path = tmp_path / 'recipe_p.yaml'
    path.write_text('''recipe:
  stages:
    - name: pose
      command: pose-pretrain
      args: [--checkpoint, ckpt, --output-dir, '{run}/pose', --steps, '300']
      done: '{run}/pose/pose_pretrain.json'
''')
    (stage,) = recipe_mod.load_recipe('p', path).stages
    run = tmp_path / 'run'
    assert not recipe_mod._is_done(stage, run)
    assert recipe_mod._stage_command(stage, run)[-1] == '300'   # a fresh start
    result = run / 'pose' / 'pose_pretrain.json'
    (run / 'pose' / 'last').mkdir(parents=True)
    (run / 'pose' / 'last' / 'training_state.pt').write_bytes(b'')
    result.write_text(json.dumps({'step': 200, 'steps': 300}))
    assert not recipe_mod._is_done(stage, run)
    cmd = recipe_mod._stage_command(stage, run)
    assert cmd[cmd.index('pose-pretrain') + 1:] == [
        '--checkpoint', 'ckpt', '--output-dir', str(run / 'pose'), '--steps', '300', '--resume']
    result.write_text(json.dumps({'step': 300, 'steps': 300}))
    assert recipe_mod._is_done(stage, run)


@pytest.mark.slow
def test_a_stopped_recipe_stops_its_stage_keeps_its_time_and_continues(tmp_path):
    """SIGTERM to the recipe (what a session's end or `kill` sends) reaches the running
    stage, which saves its checkpoint; the stage's time so far is recorded; the same
    command then finishes the run from that checkpoint."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    path = tmp_path / 'recipe_stop.yaml'
    path.write_text('''recipe:
  description: stop and continue
  stages:
''' + _DEMOS_STAGE + '''    - name: bc
      command: train
      args: [--preset, sim, --dataset-root, '{run}/demos', --output-dir, '{run}/bc',
             --cameras, none, --environment-state, --model-preset, tiny, --steps, '300',
             --val-interval, '1000', --checkpoint-interval, '5', --closed-loop-val-episodes,
             '0', --skip-infer, --torch-threads, '1', --no-progress]
      done: '{run}/bc/training_metrics.json'
      expected_min: 1
''')
    run_dir = tmp_path / 'run'
    cmd = [sys.executable, '-m', 'act_ros.cli', 'recipe', 'stop', '--file', str(path),
           '--run-dir', str(run_dir)]
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
    with open(tmp_path / 'first.log', 'wb') as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            state = run_dir / 'bc' / 'last' / 'training_state.pt'
            deadline = time.monotonic() + 300
            while not state.is_file() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert state.is_file(), (tmp_path / 'first.log').read_text()[-3000:]
            stage = [p for p in psutil.Process(proc.pid).children()
                     if 'train' in p.cmdline()]
            assert stage
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    out = (tmp_path / 'first.log').read_text()
    assert code == 130, out[-3000:]
    assert 'interrupted; run the same command to continue' in out
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in stage)
    metrics = json.loads((run_dir / 'bc' / 'training_metrics.json').read_text())
    assert metrics['status'] == 'interrupted', metrics  # stopped by the signal, not killed
    stopped_at = metrics['steps_completed']
    assert 0 < stopped_at < 300
    first = json.loads((run_dir / 'recipe.json').read_text())['stage_seconds']
    assert first['bc'] > 0
    # The same command continues the training from its checkpoint and adds the time.
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert '--resume' in done.stdout and 'demos: done' in done.stdout
    metrics = json.loads((run_dir / 'bc' / 'training_metrics.json').read_text())
    assert metrics['status'] == 'completed' and metrics['steps_completed'] == 300
    second = json.loads((run_dir / 'recipe.json').read_text())['stage_seconds']
    assert second['demos'] == first['demos'] and second['bc'] > first['bc']
