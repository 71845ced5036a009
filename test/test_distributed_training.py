"""Data-parallel ``act-ros train`` under ``accelerate launch`` (DDP, gloo between CPU processes).

The multi-process tests start ``python -m accelerate.commands.launch --multi_gpu
--num_processes 2`` (Accelerate's torchrun launcher; it starts CPU processes too, and
``--device cpu`` makes them gloo processes) on loopback only: MASTER_ADDR 127.0.0.1, a
free port, ``GLOO_SOCKET_IFNAME=lo``. Tiny model, 32x48 inputs, one PyTorch thread per
process. The step-by-step comparisons use ``test/distributed_entry.py``: the trainer's CLI
with a deterministic ACT (no dropout, no VAE latent sampling), so that one step depends
only on the weights and the global batch.

At the same global batch the two runs compute the same sums in a different order (per
process, then all-reduced). The comparison runs twice: in float64 (``distributed_entry.py``
with ``ACT_ROS_TEST_FLOAT64=1``), where the runs must agree to float64 rounding, and in
float32, the trainer as users run it, within what float32 rounding can produce over the
steps compared (the derivation is at ``FLOAT32_REL``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from act_ros.core.inference.checkpoint_info import SIM_CHUNK_SIZE
from act_ros.training.distributed import LocalProcess, check_launch_env, from_environment
from act_ros.training.state import BatchOrder

pytest.importorskip('accelerate')
pytest.importorskip('lerobot.datasets.lerobot_dataset')

H, W = 48, 64  # stored in the dataset
ENTRY = str(Path(__file__).with_name('distributed_entry.py'))
STEPS = 6
# Everything the comparison depends on, given explicitly (presets may change).
COMMON = ['--model-preset', 'tiny', '--image-size', '32x48', '--steps', str(STEPS),
          '--lr', '3e-4', '--warmup-steps', '2', '--scheduler', 'cosine', '--seed', '0',
          '--max-val-batches', '0', '--early-stop-patience', '0', '--min-steps', '0',
          '--image-shift-px', '0', '--aux-object-pose-weight', '0',
          '--no-calibrate-backbone-norm', '--device', 'cpu', '--torch-threads', '1',
          '--no-progress']
SIM = ['--preset', 'sim', '--closed-loop-val-episodes', '2', '--closed-loop-te-episodes', '0',
       '--closed-loop-episode-steps', '8']
LAUNCH_TIMEOUT_S = 240

# -- tolerances of the comparison of 2 processes with 1 -------------------------------------
# float64: u = 2**-53 = 1.1e-16; sums of up to ~10**4 terms in another order: 1e-12 relative
# (observed: at most 4e-16 on every value of every step, the weights 1.3e-14 apart).
FLOAT64_REL = 1e-12
# float32, u = 2**-24 = 6e-8, over the STEPS = 6 steps compared:
# - Step 1 runs on the same weights: only the order of the batch sums differs, about
#   sqrt(n) * u for the sums of n <= ~10**3 terms here: 2e-6 (observed 1.2e-7).
FLOAT32_SAME_WEIGHTS_REL = 2e-6
# - From step 2 on the weights differ, and this training carries a difference much further
#   than a few u: AdamW divides each gradient element by its running RMS, so where
#   rounding decides the sign of an element near zero (a ReLU at its kink flips a whole
#   output channel's gradient) the runs' weights move apart by up to lr per step instead
#   of by u. How far that carries, measured in float64 from the same start
#   (distributed_entry.py, ACT_ROS_TEST_FLOAT64_NOISE: every layer's output and incoming
#   gradient perturbed by 4u or 8u, float32-sized rounding, 12 draws): one run moved by
#   at most 6e-4 relative over the 6 steps, validation included (steps 2-3: 7e-7; the
#   large ones are a few such flips, the same ones in draw after draw, from step 4 on).
#   Two runs round independently: 1.2e-3; with a factor 4 for flips no draw met: 5e-3.
#   (Observed between the float32 runs on an AVX-512 CPU: loss 1.7e-5 at step 5, gradient
#   norm 1.6e-4 at step 6.) Measure again when STEPS, the learning rate or the model
#   preset change.
FLOAT32_REL = 5e-3
# The weights: AdamW moves each by at most 1.02 x lr per step over the 6 steps
# (|m_hat| / sqrt(v_hat) <= 1.016 at step 6 with betas (0.9, 0.999), by Cauchy-Schwarz;
# the decoupled weight decay only shrinks a difference), so rounding can take two runs'
# weights up to 2 x 1.02 x (sum of the learning rates) = 2.5e-3 apart (observed 6.5e-4;
# in float64 1.3e-14).
ADAM_STEP_BOUND = 1.02


# -- helpers --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """Loopback only, one thread, temporary files where the test can check them."""
    (tmp / 'tmp').mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE='1', MUJOCO_GL=os.environ.get('MUJOCO_GL', 'egl'),
               ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', MASTER_ADDR='127.0.0.1',
               GLOO_SOCKET_IFNAME='lo', OMP_NUM_THREADS='1', TMPDIR=str(tmp / 'tmp'))
    env.pop('WORLD_SIZE', None)
    env.update(extra)
    return env


def _launcher(processes: int, script: list[str]) -> list[str]:
    return [sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu',
            '--num_processes', str(processes), '--num_machines', '1', '--mixed_precision', 'no',
            '--dynamo_backend', 'no', '--main_process_ip', '127.0.0.1',
            '--main_process_port', str(_free_port()), *script]


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open('wb') as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _finish(proc: subprocess.Popen, log: Path, timeout_s: float = LAUNCH_TIMEOUT_S) -> str:
    """Wait for ``proc`` (its whole session killed on a timeout); return its output."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f'{proc.args[:6]} did not finish in {timeout_s} s:\n{log.read_text()[-3000:]}')
    return log.read_text(errors='replace')


def _run(command: list[str], env: dict[str, str], log: Path) -> tuple[int, str]:
    proc = _start(command, env, log)
    text = _finish(proc, log)
    return proc.returncode, text


def _args(dataset: Path, *, interval: int) -> list[str]:
    """The compared run: sim preset, validation, closed loop and checkpoints every
    ``interval`` steps (and at the end)."""
    return [*SIM, *COMMON, '--dataset-root', str(dataset), '--val-interval', str(interval),
            '--checkpoint-interval', str(interval)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _metrics(out: Path) -> dict:
    return json.loads((out / 'training_metrics.json').read_text())


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(path / 'model.safetensors'))


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def _layout(out: Path) -> dict[str, list[str]]:
    """Checkpoint directories of a run and the files in each (names relative to it)."""
    return {d.name: sorted(str(f.relative_to(d)) for f in d.rglob('*') if f.is_file())
            for d in sorted(out.iterdir()) if d.is_dir()}


def _assert_complete_checkpoints(out: Path) -> None:
    """Every checkpoint directory loads: weights, config, processors; last/ its state too."""
    from act_ros.training.state import load_training_state

    hidden = [p.name for p in out.iterdir() if p.name.startswith('.')]
    assert not hidden, f'staging or candidate leftovers in {out}: {hidden}'
    for name, files in _layout(out).items():
        assert {'config.json', 'model.safetensors', 'training_info.json'} <= set(files), \
            (name, files)
        assert _weights(out / name)
        json.loads((out / name / 'config.json').read_text())
        if name == 'last':
            state = load_training_state(out / name)
            assert state['step'] == json.loads(
                (out / name / 'training_info.json').read_text())['step']


def _workers(launcher: subprocess.Popen) -> dict[int, psutil.Process]:
    """The launcher's worker processes by rank (from their environment)."""
    found = {}
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            rank = child.environ().get('RANK')
        except psutil.Error:
            continue
        if rank is not None and 'act_ros' in ' '.join(child.cmdline()):
            found[int(rank)] = child
    return found


@pytest.fixture(scope='module')
def dataset(module_tmp) -> Path:
    """4 episodes x 40 frames, PNG cameras: 3 training episodes, 1 held out."""
    from act_ros.data.synthetic import write_synthetic_dataset

    root = module_tmp('data') / 'syn'
    write_synthetic_dataset(root, episodes=4, frames=40, image_size=(H, W), video=False, seed=3)
    return root


def _one_and_two(dataset: Path, tmp: Path, **env: str) -> dict:
    """The same run (sim preset, closed-loop selection on 2 episodes) as 1 process with
    batch 4 and as 2 processes with batch 2 each: the same global batch and seed."""
    pytest.importorskip('mujoco')
    args = _args(dataset, interval=3)
    one, two = tmp / 'one', tmp / 'two'
    modules = tmp / 'modules.json'
    code1, log1 = _run([sys.executable, ENTRY, *args, '--batch-size', '4', '--output-dir',
                        str(one)],
                       _env(tmp / 'e1', ACT_ROS_TEST_MODULES_FILE=str(modules), **env),
                       tmp / 'one.log')
    assert code1 == 0, log1[-3000:]
    code2, log2 = _run(_launcher(2, [ENTRY, *args, '--batch-size', '2', '--output-dir',
                                     str(two)]), _env(tmp / 'e2', **env), tmp / 'two.log')
    assert code2 == 0, log2[-3000:]
    return {'one': one, 'two': two, 'log2': log2, 'tmp': tmp, 'modules': modules}


@pytest.fixture(scope='module')
def one_and_two(dataset, module_tmp) -> dict:
    return _one_and_two(dataset, module_tmp('one_and_two'))


@pytest.fixture(scope='module')
def one_and_two_float64(dataset, module_tmp) -> dict:
    return _one_and_two(dataset, module_tmp('one_and_two_float64'),
                        ACT_ROS_TEST_FLOAT64='1')


# -- two processes against one --------------------------------------------------------------
def _assert_trains_like_one(runs: dict, rel_at_step) -> None:
    """The 2-process run's metrics, step by step, are the 1-process run's: each value
    within ``rel_at_step(step)`` relative, ``step`` being the training step whose weights
    produced it (validation after step s: the weights of step s + 1)."""
    a, b = _metrics(runs['one']), _metrics(runs['two'])
    assert a['status'] == b['status'] == 'completed'
    assert a['steps_completed'] == b['steps_completed'] == STEPS
    assert 'distributed' not in a and a['config']['batch_size'] == 4
    assert b['distributed']['processes'] == 2 and b['distributed']['backend'] == 'gloo'
    assert b['distributed']['global_batch_size'] == 4
    assert b['distributed']['batch_size_per_process'] == 2
    # Loss terms of every step, the learning rate (the global step's) and the grad norm.
    rows_a, rows_b = a['history']['train'], b['history']['train']
    assert [r['step'] for r in rows_b] == list(range(1, STEPS + 1))
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert rb['lr'] == pytest.approx(ra['lr'], rel=1e-12), ra['step']
        for key in ('loss', 'l1', 'grad_norm'):
            assert rb[key] == pytest.approx(ra[key], rel=rel_at_step(ra['step'])), \
                (ra['step'], key)
    assert len({r['lr'] for r in rows_b}) > 3  # warm-up and cosine: the schedule moved
    # Validation reduced over both processes: the values of one process over all frames.
    assert [r['step'] for r in b['history']['val']] == [3, 6]
    for va, vb in zip(a['history']['val'], b['history']['val'], strict=True):
        for key in ('val_l1', 'val_l1_weighted'):
            assert vb[key] == pytest.approx(va[key], rel=rel_at_step(va['step'] + 1)), \
                (va['step'], key)
    # Closed loop: one episode per process, gathered: the same 2 episodes, the same result.
    for ca, cb in zip(a['history']['closed_loop'], b['history']['closed_loop'], strict=True):
        assert cb['chunk']['count'] == ca['chunk']['count'] == 2
        for key in ('align_rate', 'mean_position_error', 'mean_yaw_error'):
            assert cb['chunk'][key] == pytest.approx(ca['chunk'][key], rel=1e-4, abs=1e-6), key
        assert cb['chunk']['failures'] == ca['chunk']['failures']
    assert b['best']['closed_loop_chunk']['step'] == a['best']['closed_loop_chunk']['step']
    assert b['inference_check']['finite'] is True


@pytest.mark.slow
def test_two_processes_train_like_one_at_the_same_global_batch_in_float64(
        one_and_two_float64):
    """The same comparison in float64: the runs compute the same thing, to rounding."""
    runs = one_and_two_float64
    _assert_trains_like_one(runs, lambda step: FLOAT64_REL)
    weights = _weights(runs['one'] / 'last')
    assert {w.dtype for w in weights.values()} == {torch.float64}
    worst = _max_diff(runs['one'] / 'last', runs['two'] / 'last')
    assert worst < FLOAT64_REL * max(w.abs().max().item() for w in weights.values()), worst


@pytest.mark.slow
def test_two_processes_train_like_one_at_the_same_global_batch(one_and_two):
    """The same comparison in float32, within what float32 rounding can produce."""
    def rel(step):
        return FLOAT32_SAME_WEIGHTS_REL if step == 1 else FLOAT32_REL

    _assert_trains_like_one(one_and_two, rel)
    lrs = [r['lr'] for r in _metrics(one_and_two['one'])['history']['train']]
    worst = _max_diff(one_and_two['one'] / 'last', one_and_two['two'] / 'last')
    assert worst <= 2 * ADAM_STEP_BOUND * sum(lrs), worst


@pytest.mark.slow
def test_two_process_checkpoints_have_the_single_process_layout_and_load(one_and_two):
    from lerobot.policies.act.modeling_act import ACTPolicy

    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
    from act_ros.core.observation import Observation

    one, two = one_and_two['one'], one_and_two['two']
    assert _layout(one) == _layout(two)
    assert {'best', 'last', 'step_000003', 'step_000006'} <= set(_layout(two))
    _assert_complete_checkpoints(two)
    assert sorted(p.name for p in two.iterdir() if p.is_file()) == \
        sorted(p.name for p in one.iterdir() if p.is_file())  # metrics and plots, once
    # Only process 0 wrote; process 1's candidate copy for the simulation was removed.
    assert not list((one_and_two['tmp'] / 'e2' / 'tmp').glob('act_ros_candidate*'))
    assert json.loads(one_and_two['modules'].read_text()) == {'accelerate': False}
    assert one_and_two['log2'].count('completed: 6 steps') == 1
    state = torch.load(two / 'last' / 'training_state.pt', weights_only=False)
    assert state['world_size'] == 2 and len(state['rng_ranks']) == 2
    for name in ('best', 'last'):
        policy = ACTPolicy.from_pretrained(two / name)
        assert policy.config.chunk_size == SIM_CHUNK_SIZE  # the tiny model preset's
        rng = np.random.default_rng(0)
        with PolicyRuntime(RuntimeConfig(model_path=two / name, device='cpu', execution='sync',
                                         warmup=False)) as runtime:
            obs = Observation(images={n: rng.integers(0, 255, (H, W, 3), dtype=np.uint8)
                                      for n in ('top', 'wrist')}, state=np.zeros(6))
            action = runtime.act(obs)
            assert action.shape == (6,) and np.all(np.isfinite(action))


# -- stop, resume, a killed process ---------------------------------------------------------
@pytest.fixture(scope='module')
def interrupted(dataset, one_and_two) -> dict:
    """The 2-process run again, stopped by SIGTERM to the launcher after step 2."""
    tmp = one_and_two['tmp']
    out = tmp / 'interrupted'
    # The same run; no evaluation before the end (it does not change the weights).
    args = _args(dataset, interval=100)
    code, log = _run(_launcher(2, [ENTRY, *args, '--batch-size', '2', '--output-dir',
                                   str(out)]),
                     _env(tmp / 'e3', ACT_ROS_TEST_SIGTERM_LAUNCHER_AT='2'),
                     tmp / 'interrupted.log')
    return {'out': out, 'code': code, 'log': log, 'args': args}


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_process_and_leaves_a_complete_last(interrupted):
    out, log = interrupted['out'], interrupted['log']
    assert interrupted['code'] != 0, log[-2000:]
    assert 'SIGTERM' in log
    metrics = _metrics(out)
    assert metrics['status'] == 'interrupted', log[-2000:]
    stopped = metrics['steps_completed']
    assert 2 < stopped < STEPS, f'stopped at step {stopped}, expected after 2 and before {STEPS}'
    assert log.count('saving last/ at step') == 2  # both processes stopped at the same step
    info = json.loads((out / 'last' / 'training_info.json').read_text())
    assert info['step'] == stopped
    _assert_complete_checkpoints(out)


@pytest.mark.slow
def test_resume_under_two_processes_continues_step_count_and_schedule(interrupted, one_and_two):
    out, tmp = interrupted['out'], one_and_two['tmp']
    stopped = _metrics(out)['steps_completed']
    code, log = _run(_launcher(2, [ENTRY, *interrupted['args'], '--batch-size', '2',
                                   '--output-dir', str(out), '--resume']),
                     _env(tmp / 'e4'), tmp / 'resumed.log')
    assert code == 0, log[-3000:]
    resumed, reference = _metrics(out), _metrics(one_and_two['two'])
    assert resumed['status'] == 'completed' and resumed['resumed_from_step'] == stopped
    assert resumed['steps_completed'] == STEPS
    rows, ref = resumed['history']['train'], reference['history']['train']
    assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
    for r, q in zip(rows, ref, strict=True):
        assert r['lr'] == pytest.approx(q['lr'], rel=1e-12), r['step']
        assert r['loss'] == pytest.approx(q['loss'], rel=1e-5), r['step']
    worst = _max_diff(out / 'last', one_and_two['two'] / 'last')
    assert worst < 1e-6, worst


@pytest.mark.slow
def test_a_killed_process_fails_the_launch_without_a_half_written_checkpoint(dataset, tmp_path):
    """The real trainer (dropout, VAE), its backbone frozen mid-way: process 1 is killed
    with SIGKILL after a few checkpoints; the launcher must end every process and exit
    non-zero, naming the failed rank, and every checkpoint left must be whole."""
    out = tmp_path / 'out'
    log = tmp_path / 'killed.log'
    args = ['-m', 'act_ros.training.train', '--preset', 'synthetic', *COMMON,
            '--dataset-root', str(dataset), '--output-dir', str(out), '--batch-size', '2',
            '--steps', '400', '--val-interval', '1000', '--checkpoint-interval', '2',
            '--backbone-freeze-step', '3', '--skip-infer']
    launcher = _start(_launcher(2, args), _env(tmp_path), log)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        info = out / 'last' / 'training_info.json'
        while time.monotonic() < deadline and launcher.poll() is None:
            try:
                if json.loads(info.read_text())['step'] >= 6:  # past the freeze (DDP rebuilt)
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        assert launcher.poll() is None, log.read_text()[-3000:]
        workers = _workers(launcher)
        assert sorted(workers) == [0, 1], workers
        workers[1].kill()
        text = _finish(launcher, log, timeout_s=90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0
    assert 'ChildFailedError' in text and 'Signal 9 (SIGKILL)' in text, text[-3000:]
    assert not [p.pid for p in workers.values() if _alive(p)]
    _assert_complete_checkpoints(out)
    metrics = _metrics(out)  # process 0 saw its peer go and recorded the failure
    assert metrics['status'] == 'failed' and metrics['steps_completed'] >= 6


# -- pieces, in one process -----------------------------------------------------------------
def test_batch_shards_are_disjoint_and_make_up_the_single_process_batch():
    frames = np.arange(100, 137)  # 37 frames: batches run across epochs
    one = BatchOrder(frames, 6, seed=4)
    shards = [BatchOrder(frames, 2, seed=4, rank=r, world_size=3) for r in range(3)]
    for step in range(20):
        parts = [s.indices(step) for s in shards]
        assert np.array_equal(np.concatenate(parts), one.indices(step)), step
    epoch = np.concatenate([s.indices(step) for step in range(7) for s in shards])[:37]
    assert sorted(epoch.tolist()) == frames.tolist()  # every frame once per epoch
    with pytest.raises(ValueError, match='rank'):
        BatchOrder(frames, 2, seed=4, rank=2, world_size=2)


def test_rescaled_l1_of_the_shards_averages_to_the_global_batch_loss():
    """The gradient DDP averages is that of the global batch's loss: each process's L1 is
    weighted by its share of the valid (unpadded) action steps."""
    from act_ros.training.loss import act_loss, dimension_weights

    g = torch.Generator().manual_seed(0)
    actions, hat = torch.randn(6, 30, 6, generator=g), torch.randn(6, 30, 6, generator=g)
    pad = torch.zeros(6, 30, dtype=torch.bool)
    pad[1, 20:], pad[4, 5:], pad[5, 29:] = True, True, True  # unequal padding per shard
    weights = dimension_weights(6, grippers=(5,), gripper_weight=5.0)
    full = act_loss(hat, actions, action_is_pad=pad, dim_weights=weights).l1
    shards = [slice(0, 2), slice(2, 4), slice(4, 6)]
    valid = [int((~pad[s]).sum()) for s in shards]
    scaled = [act_loss(hat[s], actions[s], action_is_pad=pad[s], dim_weights=weights).l1
              * (v * len(shards) / sum(valid)) for s, v in zip(shards, valid)]
    assert torch.stack(scaled).mean().item() == pytest.approx(full.item(), rel=1e-6)
    plain = torch.stack([act_loss(hat[s], actions[s], action_is_pad=pad[s],
                                  dim_weights=weights).l1 for s in shards]).mean()
    assert abs(plain.item() - full.item()) > 1e-3  # without the factor it would differ


def test_one_process_needs_no_launcher_and_a_bad_launch_environment_is_explained(monkeypatch):
    for name in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        monkeypatch.delenv(name, raising=False)
    process = from_environment('cuda:1')  # one process: --device is the trainer's business
    assert type(process) is LocalProcess and not process.active and process.is_main
    assert process.share(5) == (0, 5) and process.gather_objects(3) == [3]
    assert process.step_control(7, True) == (7, True)
    monkeypatch.setenv('WORLD_SIZE', 'x')
    assert check_launch_env() == 1  # not a number: one process, as before
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(ValueError, match='RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not '
                                         'set.*accelerate launch'):
        check_launch_env()
    for name, value in (('RANK', '0'), ('LOCAL_RANK', '0'), ('MASTER_ADDR', '127.0.0.1'),
                        ('MASTER_PORT', '1')):
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="--device 'cuda:1' under 2 processes"):
        from_environment('cuda:1')  # refused before any process group is joined


def test_episode_blocks_cover_every_episode_once():
    from act_ros.training.distributed import DataParallel

    for count in range(0, 9):
        for world in (1, 2, 3, 4):
            blocks = []
            for rank in range(world):
                process = object.__new__(DataParallel)
                process.rank, process.world_size = rank, world
                blocks.append(process.share(count))
            assert blocks[0][0] == 0 and blocks[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            sizes = [end - start for start, end in blocks]
            assert max(sizes) - min(sizes) <= 1, (count, world, blocks)


def test_gathered_closed_loop_parts_summarize_all_episodes():
    from act_ros.sim.metrics import EpisodeResult, summarize_results
    from act_ros.training.loop import merge_mode_results

    episodes = [EpisodeResult(success=k == 1, position_error_m=0.01 * k, yaw_error_deg=2.0 * k,
                              released=True, box_on_pad=k == 1, box_still=True,
                              max_box_height_m=0.05, steps=10, seed=k,
                              failure_phase=None if k == 1 else 'position')
                for k in range(3)]
    parts = [{'episodes': [e.to_dict() for e in episodes[:2]], 'suppressed_releases': 1,
              'rejected_commands': 0, 'seconds': 2.0},
             {'episodes': [episodes[2].to_dict()], 'suppressed_releases': 2,
              'rejected_commands': 3, 'seconds': 1.5}, None]
    merged = merge_mode_results('chunk', parts)
    assert merged == {'mode': 'chunk', 'task': 'port_pick_align', **summarize_results(episodes),
                      'success_rate': 1 / 3, 'suppressed_releases': 3,
                      'rejected_commands': 3, 'seconds': 2.0}
    with pytest.raises(ValueError, match='no process ran an episode'):
        merge_mode_results('chunk', [None, None])


class _SecondOfTwo(LocalProcess):
    """Process 1 of 2 for a unit test, with the writes of process 0 and process 0's RNG
    state given by ``other_rng``."""

    active = True
    world_size = 2
    rank = 1

    def __init__(self, other_rng) -> None:
        self.other_rng = other_rng

    def gather_objects(self, obj):
        return [self.other_rng, obj]


def test_resume_restores_each_process_its_own_rng_and_refuses_another_process_count(tmp_path):
    from act_ros.training.loop import Trainer
    from act_ros.training.speed import synthetic_config, synthetic_inputs
    from act_ros.training.state import capture_rng

    inputs = synthetic_inputs(image_size=(32, 48), batch_size=2)
    config = synthetic_config(inputs, tmp_path, model_preset='tiny', batch_size=2, steps=4,
                              seed=0, torch_threads=1)
    torch.manual_seed(123)
    other = capture_rng()
    first = Trainer(config, inputs, dist=_SecondOfTwo(other))
    torch.manual_seed(456)
    mine = torch.get_rng_state().clone()
    first.save('last', with_state=True)
    state = torch.load(tmp_path / 'last' / 'training_state.pt', weights_only=False)
    assert state['world_size'] == 2
    assert torch.equal(state['rng_ranks'][0]['torch'], other['torch'])

    second = Trainer(config, inputs, dist=_SecondOfTwo(other))
    torch.manual_seed(789)
    second.resume()
    assert torch.equal(torch.get_rng_state(), mine)  # process 1's stream, not process 0's
    with pytest.raises(ValueError, match=r'written by a run of 2 process\(es\), this run has 1'):
        Trainer(config, inputs).resume()


# -- act-ros bench training --processes -----------------------------------------------------
def test_bench_processes_option_is_checked():
    import argparse

    from act_ros.bench.data_parallel import parse_processes

    assert parse_processes('1,2') == [1, 2] and parse_processes('4') == [4]
    for bad in ('0,1', '1,1', 'one', ''):
        with pytest.raises(argparse.ArgumentTypeError, match='--processes'):
            parse_processes(bad)


@pytest.mark.slow
def test_bench_training_reports_one_and_two_processes_side_by_side(tmp_path, monkeypatch):
    from act_ros.bench import data_parallel, training

    for name, value in _env(tmp_path).items():
        monkeypatch.setenv(name, value)
    out = tmp_path / 'scaling.md'
    assert training.main(['--processes', '1,2', '--model-preset', 'tiny', '--image-size',
                          '32x48', '--batch-size', '2', '--iters', '2', '--warmup', '1',
                          '--device', 'cpu', '--torch-threads', '1', '--no-header',
                          '--output', str(out)]) == 0
    report = out.read_text()
    assert report.startswith('## Data-parallel training') and 'backend gloo' in report
    lines = [line for line in report.splitlines() if line.startswith('| ')]
    assert lines[0] == '| ' + ' | '.join(data_parallel.COLUMNS) + ' |'
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[1:]]
    assert [row[:4] for row in rows] == [['1', '2', '2', '1'], ['2', '2', '4', '1']]
    for row in rows:
        assert all(float(cell.rstrip('x')) > 0 for cell in row[4:]), row
    assert rows[0][7] == '1.00x'
