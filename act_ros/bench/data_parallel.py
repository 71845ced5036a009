"""Data-parallel training throughput: the trainer's step with 1, 2, ... processes.

``act-ros bench training --processes 1,2``. For each count N the real trainer step
(:meth:`~act_ros.training.loop.Trainer.train_step`: batch, normalization, loss, backward
with DDP's gradient all-reduce, clipping, AdamW, scheduler, and the per-step agreement of
the processes) runs on random in-memory frames (:func:`act_ros.training.speed.synthetic_inputs`)
in N processes, each with ``--batch-size`` samples: N = 1 is a plain process, N > 1 runs
under ``accelerate launch`` on this machine (loopback; one GPU per process where there
are GPUs, else gloo between CPU processes). A step's time is process 0's median wall
time; samples/s counts the global batch (N x ``--batch-size``).

On a CPU the processes share the cores: each gets ``cores / N`` PyTorch threads unless
``--torch-threads`` is given, so the comparison is the same cores split N ways.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.bench.report import markdown_table
from act_ros.core.arguments import HelpFormatter

COLUMNS = ('processes', 'batch / process', 'global batch', 'threads / process',
           'ms / step (median)', 'steps / s', 'samples / s', 'samples / s vs 1 process')


def parse_processes(text: str) -> list[int]:
    """``'1,2,4'`` -> ``[1, 2, 4]`` (positive, distinct)."""
    try:
        counts = [int(part) for part in text.split(',') if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f'--processes: expected comma-separated counts such as '
                                         f'1,2, got {text!r}') from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f'--processes: expected distinct counts >= 1 such as '
                                         f'1,2, got {text!r}')
    return counts


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _threads(processes: int, torch_threads: int | None) -> int:
    return torch_threads or max(1, (os.cpu_count() or 1) // processes)


def launch_command(processes: int, module_args: list[str]) -> list[str]:
    """``python -m MODULE ...`` for one process, under ``accelerate launch`` on loopback for
    several."""
    if processes == 1:
        return [sys.executable, *module_args]
    return [sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu',
            '--num_processes', str(processes), '--num_machines', '1', '--mixed_precision', 'no',
            '--dynamo_backend', 'no', '--main_process_ip', '127.0.0.1',
            '--main_process_port', str(_free_port()), *module_args]


def measure(*, processes: list[int], model_preset: str, image_size: tuple[int, int],
            batch_size: int, iters: int, warmup: int, device: str = 'cpu', seed: int = 0,
            torch_threads: int | None = None, timeout_s: float = 3600.0) -> list[dict[str, Any]]:
    """One row per process count (see module docstring)."""
    from act_ros.core.processes import ProcessSet

    if max(processes) > 1:
        try:
            import accelerate  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("--processes above 1 needs accelerate (accelerate launch): pip "
                               "install -e '.[distributed]'") from exc
    results = []
    with tempfile.TemporaryDirectory(prefix='act_ros_bench_dp_') as tmp:
        env = dict(os.environ)
        env.setdefault('MASTER_ADDR', '127.0.0.1')
        if Path('/sys/class/net/lo').exists():
            env.setdefault('GLOO_SOCKET_IFNAME', 'lo')  # one machine: loopback
        env.pop('WORLD_SIZE', None)
        children = ProcessSet(Path(tmp) / 'logs', env)
        try:
            for count in processes:
                out = Path(tmp) / f'{count}.json'
                threads = _threads(count, torch_threads)
                module_args = ['-m', __name__, '--worker', '--output', str(out),
                               '--device', device, '--model-preset', model_preset,
                               '--image-size', f'{image_size[0]}x{image_size[1]}',
                               '--batch-size', str(batch_size), '--iters', str(iters),
                               '--warmup', str(warmup), '--seed', str(seed),
                               '--torch-threads', str(threads)]
                print(f'[bench training] {count} process(es), batch {batch_size} each, '
                      f'{threads} thread(s) each ...', file=sys.stderr, flush=True)
                child = children.start(f'processes_{count}', launch_command(count, module_args))
                code = children.wait(child, timeout_s)
                if code != 0 or not out.is_file():
                    raise RuntimeError(f'{count} process(es): exit code {code}, no result; last '
                                       f'lines of its output:\n{child.log_tail(30)}')
                children.stop(child)
                results.append({**json.loads(out.read_text()), 'threads': threads})
        finally:
            children.stop_all()
    base = next((r for r in results if r['processes'] == 1), None)
    for r in results:
        r['speedup'] = r['samples_per_s'] / base['samples_per_s'] if base else None
    return results


def render(results: list[dict[str, Any]], *, model_preset: str, image_size: tuple[int, int],
           iters: int, warmup: int, device: str) -> str:
    rows = [(r['processes'], r['batch_size'], r['processes'] * r['batch_size'], r['threads'],
             f"{r['median_s'] * 1e3:.1f}", f"{r['steps_per_s']:.2f}", f"{r['samples_per_s']:.1f}",
             f"{r['speedup']:.2f}x" if r['speedup'] is not None else '-') for r in results]
    backend = ', '.join(sorted({r['backend'] for r in results if r.get('backend')})) or '-'
    return ('## Data-parallel training: 1 process vs several (`accelerate launch`, DDP)\n\n'
            f'device {device}; model preset {model_preset}; cameras {image_size[0]}x'
            f'{image_size[1]}; {iters} timed steps after {warmup} warm-up; backend {backend}.\n'
            '- A step is the trainer\'s whole step in every process (batch, normalization, '
            'forward, loss, backward with the gradient all-reduce, clipping, AdamW, scheduler); '
            'ms / step is process 0\'s median, samples / s counts the global batch.\n'
            '- On a CPU the processes share its cores (threads / process); a gain needs more '
            'cores than one process can use, or one GPU per process.\n\n'
            + markdown_table(COLUMNS, rows) + '\n')


def _worker(args: argparse.Namespace) -> int:
    """One process of a measurement (under ``accelerate launch`` when N > 1)."""
    import torch

    from act_ros.training.distributed import from_environment
    from act_ros.training.loop import Trainer
    from act_ros.training.speed import synthetic_config, synthetic_inputs

    torch.set_num_threads(args.torch_threads)
    dist = from_environment(args.device)
    try:
        device = str(dist.device) if dist.active else args.device
        inputs = synthetic_inputs(image_size=args.image_size,
                                  batch_size=args.batch_size * dist.world_size, device=device,
                                  seed=args.seed)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(synthetic_config(inputs, Path(tmp), model_preset=args.model_preset,
                                               batch_size=args.batch_size,
                                               steps=args.warmup + args.iters, seed=args.seed),
                              inputs, dist=dist)
            start = time.perf_counter()
            for _ in range(args.warmup):
                trainer.train_step()
            warmup_s = time.perf_counter() - start
            dist.barrier()
            times = []
            for _ in range(args.iters):
                if inputs.device.type == 'cuda':
                    torch.cuda.synchronize()
                start = time.perf_counter()
                trainer.train_step()
                if inputs.device.type == 'cuda':
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            trainer.history.flush()
        median = float(np.median(times))
        if dist.is_main:
            args.output.write_text(json.dumps({
                'processes': dist.world_size, 'batch_size': args.batch_size,
                'backend': dist.backend, 'device': str(inputs.device), 'median_s': median,
                'steps_per_s': 1.0 / median,
                'samples_per_s': dist.world_size * args.batch_size / median,
                'warmup_s': warmup_s}))
    finally:
        dist.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The worker entry (``--worker``); the measurement runs from ``act-ros bench training
    --processes``."""
    from act_ros.core.inference.checkpoint import PRESETS, parse_image_size

    p = argparse.ArgumentParser(prog=f'python -m {__name__}', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--worker', action='store_true', required=True,
                   help='run one process of a measurement (started by act-ros bench training)')
    p.add_argument('--output', type=Path, required=True)
    p.add_argument('--device', default='cpu')
    p.add_argument('--model-preset', choices=sorted(PRESETS), default='tiny')
    p.add_argument('--image-size', type=parse_image_size, default=(96, 128))
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--iters', type=int, default=10)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--torch-threads', type=int, default=1)
    return _worker(p.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
