"""Ctrl-C a single-process ``act-ros train`` many times and count how each run ended.

Each repetition starts ``python -X faulthandler -m act_ros.cli train`` on a small synthetic
dataset in a fresh child process (its own process group, as a terminal's foreground job),
waits until it is training (``last/`` written: ``--checkpoint-interval 1``) or, with
``--when random``, a random time after its start (start-up, dataset loading, the first
steps and the saves all get hit), sends one real SIGINT to the child and waits for it.

A clean Ctrl-C exits 130 with ``training_metrics.json`` saying ``interrupted``, or, during
start-up before the trainer's handler is installed, ends by Python's KeyboardInterrupt,
which Python finishes by killing itself with SIGINT (exit status -2, 130 in a shell). A
crash shows as another negative exit status (``-11``: SIGSEGV) or faulthandler's dump in
the run's log. Prints one line per repetition and a summary; exit status 1 if any run
crashed.

    python tools/sigint_train_repeat.py --repetitions 50 --work /tmp/sigint
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from pathlib import Path
import random
import signal
import subprocess
import sys
import time

TRAIN = ['--model-preset', 'tiny', '--image-size', '32x48', '--steps', '100000',
         '--batch-size', '2', '--val-interval', '4', '--max-val-batches', '1',
         '--checkpoint-interval', '1', '--early-stop-patience', '0', '--min-steps', '0',
         '--device', 'cpu', '--torch-threads', '1', '--skip-infer', '--no-progress']


def make_dataset(root: Path) -> Path:
    data = root / 'dataset'
    if not (data / 'meta' / 'info.json').is_file():
        subprocess.run([sys.executable, '-m', 'act_ros.cli', 'generate-synthetic',
                        '--output', str(data), '--episodes', '4', '--frames-per-episode', '40',
                        '--image-size', '48x64', '--overwrite'], check=True,
                       stdout=subprocess.DEVNULL)
    return data


def one_run(data: Path, out: Path, *, when: str, max_delay_s: float, timeout_s: float,
            extra: list[str]) -> dict:
    log = out.with_suffix('.log')
    cmd = [sys.executable, '-X', 'faulthandler', '-m', 'act_ros.cli', 'train',
           '--dataset-root', str(data), '--output-dir', str(out), *TRAIN, *extra]
    start = time.monotonic()
    with log.open('wb') as f:
        child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, process_group=0)
        if when == 'random':
            delay = random.uniform(0.0, max_delay_s)
            time.sleep(delay)
        else:  # once training: the first step's last/ is complete
            while child.poll() is None and not (out / 'last' / 'training_state.pt').is_file():
                if time.monotonic() - start > timeout_s:
                    break
                time.sleep(0.02)
            delay = time.monotonic() - start
        sent = child.poll() is None
        if sent:
            child.send_signal(signal.SIGINT)
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
            code = f'timeout ({code})'
    text = log.read_text(errors='replace')
    metrics = out / 'training_metrics.json'
    status = json.loads(metrics.read_text()).get('status') if metrics.is_file() else None
    return {'code': code, 'signal_at_s': round(delay, 2), 'sent': sent, 'status': status,
            'faulthandler': 'Fatal Python error' in text, 'log': str(log)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repetitions', type=int, default=20)
    p.add_argument('--work', type=Path, required=True, help='folder for the dataset and runs')
    p.add_argument('--when', choices=('training', 'random'), default='training')
    p.add_argument('--max-delay-s', type=float, default=20.0, help='--when random: upper bound')
    p.add_argument('--timeout-s', type=float, default=180.0)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('train_args', nargs='*', help='extra act-ros train options (after --)')
    args = p.parse_args(argv)
    random.seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    data = make_dataset(args.work)
    codes = collections.Counter()
    crashed = []
    for i in range(args.repetitions):
        out = args.work / f'run_{os.getpid()}_{i:03d}'
        result = one_run(data, out, when=args.when, max_delay_s=args.max_delay_s,
                         timeout_s=args.timeout_s, extra=args.train_args)
        codes[str(result['code'])] += 1
        code = result['code']
        bad = (not isinstance(code, int) or (code < 0 and code != -signal.SIGINT)
               or result['faulthandler'])
        if bad:
            crashed.append(result)
        print(f"{i + 1:3d}/{args.repetitions} SIGINT at {result['signal_at_s']:6.2f} s -> exit "
              f"{result['code']}, status {result['status']}"
              + ('  CRASH ' + result['log'] if bad else ''), flush=True)
    print(f'exit statuses: {dict(codes)}; crashes: {len(crashed)} of {args.repetitions}')
    return 1 if crashed else 0


if __name__ == '__main__':
    sys.exit(main())
