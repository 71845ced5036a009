"""``act-ros dagger``: DAgger iterations: collect with the current policy, train, repeat.

Iteration ``i`` (1, 2, ...):

1. ``act-ros collect --dagger POLICY_i-1 --join DATA_i-1``: the current policy drives
   ``--episodes`` episodes, the scripted expert labels every frame, the expert takes over a
   chunk-long window with probability ``beta_i = beta x beta_decay^(i-1)``; the labelled
   episodes and the previous data make ``RUN/iter_i/dataset`` (``DATA_0`` is
   ``--dataset-root``, ``POLICY_0`` is ``--checkpoint``).
2. ``act-ros train --init-from POLICY_i-1 --dataset-root RUN/iter_i/dataset``: fine-tuning
   for ``--steps`` steps with the trainer options given after ``--``; the closed-loop
   selected checkpoint (``best/``, else ``last/``) is ``POLICY_i``.

Each step runs as a child process and leaves its result on disk, so an interrupted run
continues with the same command: a finished collection or training is not redone, an
interrupted training resumes (``--resume``). Each iteration's line (episodes, beta, the
align rate of the policy-driven collection episodes, the expert's share, the new policy's
closed-loop align rate, times) is appended to ``RUN/dagger.jsonl`` once, when it is done, and
printed as a table; a continued run shows the logged lines of the iterations it skips.

Every iteration's dataset holds all the data before it (LeRobot's aggregation), so
``--keep-datasets last`` deletes an iteration's dataset once the next iteration is done
and logged (2 GB each for 180 000 frames at 192x256): a continued run then recognises a
done iteration by its logged line, its training and its collection's entry in a later
iteration's dataset, and only the newest dataset is ever read again. ``all`` (the
default) keeps every one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.processes import run_stage, stage_environment

LOG_NAME = 'dagger.jsonl'
KEEP_DATASETS = ('all', 'last')
PRUNING = '.pruning'  # a dataset folder being deleted is renamed to this first
SEED_STRIDE = 10_000  # iteration i collects seeds seed + i * SEED_STRIDE, ...


@dataclass(frozen=True)
class DaggerLoopConfig:
    """Settings of ``act-ros dagger`` (see its ``--help``)."""

    dataset_root: Path
    checkpoint: Path
    run_dir: Path
    iterations: int
    episodes: int
    steps: int
    beta: float = 0.5
    beta_decay: float = 0.5
    seed: int = 500_000
    workers: int = 1
    train_args: tuple[str, ...] = ()
    keep_datasets: str = 'all'

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.episodes < 1 or self.steps < 1:
            raise ValueError('--iterations, --episodes and --steps must be >= 1, got '
                             f'{self.iterations}, {self.episodes}, {self.steps}')
        if self.keep_datasets not in KEEP_DATASETS:
            raise ValueError(f'--keep-datasets must be one of {", ".join(KEEP_DATASETS)}, got '
                             f'{self.keep_datasets!r}')
        if not 0.0 <= self.beta <= 1.0 or not 0.0 <= self.beta_decay <= 1.0:
            raise ValueError(f'--beta and --beta-decay must be in [0, 1], got {self.beta} and '
                             f'{self.beta_decay}')
        for flag in ('--dataset-root', '--output-dir', '--init-from', '--steps', '--resume'):
            if any(arg == flag or arg.startswith(flag + '=') for arg in self.train_args):
                raise ValueError(f'{flag} is set by act-ros dagger for each iteration; leave it '
                                 'out of the trainer options')
        if not (Path(self.dataset_root) / 'meta' / 'info.json').is_file():
            raise FileNotFoundError(f'--dataset-root {self.dataset_root}: not a LeRobot dataset')
        if not (Path(self.checkpoint) / 'model.safetensors').is_file():
            raise FileNotFoundError(f'--checkpoint {self.checkpoint}: not a checkpoint directory')

    def beta_at(self, iteration: int) -> float:
        return self.beta * self.beta_decay ** (iteration - 1)


def _run(cmd: list[str], log_path: Path) -> None:
    """Run a child process with its output appended to ``log_path`` (and echoed)."""
    with open(log_path, 'a') as log:
        log.write(f'\n$ {" ".join(cmd)}\n')
        log.flush()
        with stage_environment() as env:
            code = run_stage(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        tail = log_path.read_text().splitlines()[-15:]
        raise RuntimeError(f'{cmd[2]} failed with exit status {code} (log: {log_path})'
                           ':\n' + '\n'.join(tail))


def _collected(dataset: Path, iteration: int) -> dict[str, Any] | None:
    log = dataset / 'dagger_log.jsonl'
    if not (dataset / 'meta' / 'info.json').is_file() or not log.is_file():
        return None
    for line in log.read_text().splitlines():
        entry = json.loads(line) if line.strip() else {}
        if entry.get('iteration') == iteration:
            return entry
    return None


def _collected_in_run(run_dir: Path, iteration: int, last: int) -> dict[str, Any] | None:
    """The collection log entry of ``iteration`` from its own dataset or, once that was
    deleted (``--keep-datasets last``), from a later iteration's (up to ``last``), which
    carries the entries of every iteration it holds."""
    for j in range(iteration, last + 1):
        entry = _collected(run_dir / f'iter_{j}' / 'dataset', iteration)
        if entry is not None:
            return entry
    return None


def _prune_datasets(run_dir: Path, done: list[int]) -> None:
    """Delete the datasets of the done iterations but the newest one (its data holds theirs),
    and any left half-deleted by an interrupted run: renamed first, so a folder under its
    own name is always whole."""
    for leftover in run_dir.glob(f'iter_*/dataset{PRUNING}'):
        shutil.rmtree(leftover)
    for i in done[:-1]:
        dataset = run_dir / f'iter_{i}' / 'dataset'
        if dataset.is_dir():
            doomed = dataset.with_name(dataset.name + PRUNING)
            dataset.rename(doomed)
            shutil.rmtree(doomed)


def _trained(train_dir: Path) -> dict[str, Any] | None:
    metrics = train_dir / 'training_metrics.json'
    if not metrics.is_file():
        return None
    data = json.loads(metrics.read_text())
    return data if data.get('status') in ('completed', 'stopped_early') else None


def _policy_of(train_dir: Path) -> Path:
    best = train_dir / 'best'
    return best if (best / 'model.safetensors').is_file() else train_dir / 'last'


def _closed_loop_align(metrics: dict[str, Any]) -> float | None:
    """The selected checkpoint's closed-loop chunk align rate (training_metrics.json), None
    when the run selected by validation loss only."""
    best = (metrics.get('best') or {}).get('closed_loop_chunk') or {}
    return float(best['align_rate']) if 'align_rate' in best else None


def run(config: DaggerLoopConfig) -> list[dict[str, Any]]:
    """Run (or continue) the iterations; returns one summary per iteration."""
    py = sys.executable
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / 'dagger_children.log'
    data, policy = Path(config.dataset_root), Path(config.checkpoint)
    logged = _logged(run_dir / LOG_NAME)
    newest = max(logged, default=0)
    rows = []
    done: list[int] = []
    for i in range(1, config.iterations + 1):
        it_dir = run_dir / f'iter_{i}'
        dataset, train_dir = it_dir / 'dataset', it_dir / 'train'
        beta = config.beta_at(i)
        if (i in logged and _collected_in_run(run_dir, i, max(newest, i)) is not None
                and _trained(train_dir) is not None):
            # Done by an earlier run and logged with its times: shown, not logged again.
            policy, data = _policy_of(train_dir), dataset
            rows.append(logged[i])
            done.append(i)
            print(_row_text(logged[i]), flush=True)
            continue
        if config.keep_datasets == 'last':
            _prune_datasets(run_dir, done)
        # A step done by an earlier, interrupted run counts with the time it recorded.
        start = time.perf_counter()
        collected = _collected(dataset, i)
        collect_s = float(collected.get('seconds', 0.0)) if collected else None
        if collected is None:
            it_dir.mkdir(parents=True, exist_ok=True)
            _run([py, '-m', 'act_ros.training.drivers.collect', '--dagger', str(policy), '--join', str(data),
                  '--output', str(dataset), '--overwrite', '--episodes', str(config.episodes),
                  '--seed', str(config.seed + i * SEED_STRIDE), '--beta', str(beta),
                  '--dagger-iteration', str(i), '--workers', str(config.workers),
                  '--no-progress'], log_path)
            collected = _collected(dataset, i)
            if collected is None:
                raise RuntimeError(f'iteration {i}: the collection left no log in {dataset}')
            collect_s = time.perf_counter() - start
        start = time.perf_counter()
        metrics = _trained(train_dir)
        train_s = float(metrics.get('wall_time_s', 0.0)) if metrics else None
        if metrics is None:
            resume = (train_dir / 'last' / 'training_state.pt').is_file()
            cmd = [py, '-m', 'act_ros.training.train', '--dataset-root', str(dataset),
                   '--output-dir', str(train_dir), '--steps', str(config.steps),
                   *config.train_args, '--no-progress']
            cmd += ['--resume'] if resume else ['--init-from', str(policy)]
            _run(cmd, log_path)
            metrics = _trained(train_dir)
            if metrics is None:
                raise RuntimeError(f'iteration {i}: training did not complete ({train_dir})')
            train_s = time.perf_counter() - start
        policy, data = _policy_of(train_dir), dataset
        row = {'iteration': i, 'episodes': collected['episodes'], 'beta': beta,
               'collection_align_rate': collected['align_rate'],
               'expert_share': collected['expert_share'],
               'collection_failures': collected.get('failures', {}),
               'dataset_frames': _frames(dataset), 'policy': str(policy),
               'policy_closed_loop_align_rate': _closed_loop_align(metrics),
               'collect_s': round(collect_s, 1), 'train_s': round(train_s, 1)}
        rows.append(row)
        with open(run_dir / LOG_NAME, 'a') as log:
            log.write(json.dumps(row) + '\n')
        done.append(i)
        print(_row_text(row), flush=True)
    if config.keep_datasets == 'last':
        _prune_datasets(run_dir, done)
    return rows


def _logged(path: Path) -> dict[int, dict[str, Any]]:
    """The iterations already in ``dagger.jsonl`` (the first line of each: a line a
    continued run wrote again for the same iteration would carry its near-zero times)."""
    rows: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows.setdefault(int(row['iteration']), row)
    return rows


def _frames(dataset: Path) -> int:
    return int(json.loads((dataset / 'meta' / 'info.json').read_text())['total_frames'])


HEADER = ('iteration | episodes | beta | collection align (policy driving) | expert share | '
          'frames | new policy closed-loop align')


def _row_text(row: dict[str, Any]) -> str:
    align = row['policy_closed_loop_align_rate']
    return (f"{row['iteration']} | {row['episodes']} | {row['beta']:.2f} | "
            f"{row['collection_align_rate']:.2f} | {row['expert_share']:.2f} | "
            f"{row['dataset_frames']} | {'-' if align is None else f'{align:.2f}'}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='act-ros dagger', description=__doc__.splitlines()[0],
        epilog='Trainer options go after "--", e.g. -- --preset sim --environment-state '
               '--model use_vae=false (the same as the run that made --checkpoint).',
        formatter_class=HelpFormatter)
    p.add_argument('--dataset-root', type=Path, required=True,
                   help='the dataset the initial policy was trained on (never modified)')
    p.add_argument('--checkpoint', type=Path, required=True, help='the initial policy')
    p.add_argument('--run-dir', type=Path, required=True,
                   help='where each iteration writes its dataset and training run')
    p.add_argument('--iterations', type=int, default=3)
    p.add_argument('--episodes', type=int, default=50, help='episodes collected per iteration')
    p.add_argument('--steps', type=int, default=4000, help='training steps per iteration')
    p.add_argument('--beta', type=float, default=0.5,
                   help="the expert's share in the first iteration (default 0.5)")
    p.add_argument('--beta-decay', type=float, default=0.5,
                   help='beta is multiplied by this each iteration (default 0.5)')
    p.add_argument('--seed', type=int, default=500_000,
                   help=f'iteration i collects seeds SEED + i x {SEED_STRIDE}, ...')
    p.add_argument('--workers', type=int, default=1, help='collection worker processes')
    p.add_argument('--keep-datasets', choices=KEEP_DATASETS, default='all',
                   help="all: every iteration's dataset stays; last: an iteration's dataset "
                        'is deleted once the next one is done (each holds all the data '
                        'before it)')
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: list[str] = []
    if '--' in argv:
        cut = argv.index('--')
        argv, train_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    try:
        config = DaggerLoopConfig(
            dataset_root=args.dataset_root, checkpoint=args.checkpoint, run_dir=args.run_dir,
            iterations=args.iterations, episodes=args.episodes, steps=args.steps,
            beta=args.beta, beta_decay=args.beta_decay, seed=args.seed, workers=args.workers,
            train_args=tuple(train_args), keep_datasets=args.keep_datasets)
    except (ValueError, FileNotFoundError) as exc:
        print(f'act-ros dagger: {exc}', file=sys.stderr)
        return 2
    print(HEADER, flush=True)
    from act_ros.core.processes import run_continuable

    return run_continuable('act-ros dagger', lambda: run(config))[0]


if __name__ == '__main__':
    sys.exit(main())
