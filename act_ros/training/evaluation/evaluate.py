"""``act-ros evaluate``: closed-loop evaluation of a checkpoint in the simulation (no ROS).

Runs the policy through the same runtime, safety chain and release gate as the node
(:func:`~act_ros.training.evaluation.rollout.run_policy_episodes`), prints and writes ``align_rate``,
``mean_position_error`` (m) and ``mean_yaw_error`` (deg) per mode, with the seams of the
commands sent (``modes.<mode>.seams``, :mod:`act_ros.core.control.seams`), and can save a video of
chosen episodes with both cameras side by side.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.control.seams import seam_line
from act_ros.core.errors import ActRosError
from act_ros.core.inference.checkpoint import parse_image_size
from act_ros.core.inference.chunking import DEFAULT_BLEND_WINDOW, blend_window_ticks
from act_ros.core.inference.options import BACKEND_CHOICES, PRECISIONS, resolve_backend
from act_ros.core.inference.precision import AUTO, DEFAULT_TOLERANCE
from act_ros.core.logs import setup_logging
from act_ros.training.evaluation.rollout import EVAL_MODES

logger = logging.getLogger(__name__)


def _episode_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(',') if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated episode numbers like '0,1', "
                                         f"got '{text}'") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f'episode numbers must be >= 0, got {values}')
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='act-ros evaluate', description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument('--checkpoint', type=Path, required=True,
                   help='LeRobot pretrained_model directory, or a Hugging Face Hub id '
                   'org/name[@revision][/subfolder] (docs/hub_ids.md)')
    p.add_argument('--episodes', type=int, default=10)
    p.add_argument('--mode', choices=(*EVAL_MODES, 'both', 'all'), default='both',
                   help="chunk: the checkpoint's n_action_steps; ensemble: every tick, k = "
                   '--ensemble-coeff; '
                   'blend: chunks crossfaded over --blend-window; both: chunk and ensemble; '
                   'all: the three')
    p.add_argument('--seed', type=int, default=2_000_000,
                   help='episode k uses seed + k (default %(default)s: seeds used neither by '
                   "act-ros collect nor by the trainer's checkpoint selection)")
    p.add_argument('--ensemble-coeff', type=float, default=0.01)
    p.add_argument('--n-action-steps', type=int, default=None,
                   help="chunk and blend modes: actions played from each chunk before the next "
                   "query, 1 to the checkpoint's chunk size (act_node's n_action_steps; "
                   "default the checkpoint's n_action_steps; blend mode plays at most the chunk "
                   'size less the blend window)')
    p.add_argument('--blend-window', default=DEFAULT_BLEND_WINDOW,
                   help="blend mode: the crossfade, in ticks ('6') or seconds ('0.2s', at the "
                   "contract's rate), as act_node's blend_window")
    p.add_argument('--device', default='cpu', help='auto | cpu | cuda | cuda:N | mps')
    p.add_argument('--backend', choices=BACKEND_CHOICES, default='torch',
                   help='inference backend: torch, or openvino / onnxruntime on the CPU from an '
                   'ONNX export of the checkpoint (made when missing or stale), or auto as '
                   "act_node's default (openvino on a CPU where installed, else torch)")
    p.add_argument('--precision', choices=(AUTO, *PRECISIONS), default=AUTO,
                   help="as act_node's parameter: auto (the default) runs bf16 with backend "
                   'openvino on a CPU with native bfloat16 (AVX512-BF16 or AMX) when its actions '
                   'stay within --precision-tolerance of fp32 on the check observations, fp32 '
                   'everywhere else; fp32, bf16 (native only) or fp16 (CUDA/MPS) as set; int8: '
                   'backend openvino with the model act-ros export --int8 quantized, checked '
                   'against fp32 and refused over --precision-tolerance')
    p.add_argument('--precision-tolerance', type=float, default=DEFAULT_TOLERANCE,
                   help='largest normalized action difference of a reduced precision against '
                   'fp32 on the check observations (those saved beside the checkpoint, else '
                   'synthetic): auto keeps fp32 over it, int8 (or bf16 with openvino) set by '
                   'name is refused (default %(default)s)')
    p.add_argument('--render-size', type=parse_image_size, default=None,
                   help='camera HxW (default: the size the training data was recorded at)')
    p.add_argument('--episode-steps', type=int, default=None,
                   help='ticks per episode (default: config/sim.yaml; shorter only for checks)')
    p.add_argument('--video', type=Path, default=None, help='write the --video-episodes to this '
                   '.mp4/.gif file (with --mode both, one file per mode beside it: '
                   'NAME_chunk.mp4, NAME_ensemble.mp4); each path is printed')
    p.add_argument('--video-episodes', type=_episode_list, default=[0], help="e.g. '0,1'")
    p.add_argument('--latency-ms', type=float, default=None,
                   help='evaluate against simulated time as a model this slow would run on the '
                   "robot: the node's background schedule, each chunk arriving this much later "
                   'than its observation (default: synchronous, every chunk at once)')
    p.add_argument('--workers', type=int, default=1,
                   help='processes that share the episodes (each a simulation of its own, '
                   'CPU threads split between them; results identical to one process)')
    p.add_argument('--output', type=Path, default=None, help='metrics JSON to write')
    p.add_argument('--no-progress', dest='progress', action='store_false')
    return p


def evaluate(args: argparse.Namespace) -> dict:
    """Run the requested modes; returns the metrics written to ``--output``."""
    from act_ros.core.device import select_device
    from act_ros.training.evaluation.rollout import run_policy_episodes
    from act_ros.training.evaluation.video import VideoWriter, side_by_side

    select_device(args.device)  # an explicit missing device fails here, before the sim starts
    args.backend, _ = resolve_backend(args.backend, device=args.device, precision=args.precision)
    modes = {'both': ['chunk', 'ensemble'], 'all': list(EVAL_MODES)}.get(args.mode, [args.mode])
    task, contract, safety, sim_config = _task_setup(args)
    blend_ticks = blend_window_ticks(args.blend_window, contract.fps)
    latency_ticks = None
    if args.latency_ms is not None:
        if not args.latency_ms >= 0:
            raise ValueError(f'--latency-ms must be >= 0, got {args.latency_ms}')
        latency_ticks = max(1, math.ceil(args.latency_ms / 1000.0 * contract.fps - 1e-9))
    if args.n_action_steps is not None and 'ensemble' in modes:
        raise ValueError(f'--n-action-steps applies to --mode chunk or blend (ensemble mode '
                         f'queries every tick), got --mode {args.mode}')
    render_size = (task.image_size if sim_config is None
                   else (sim_config.camera_height, sim_config.camera_width))
    out = {'checkpoint': str(args.checkpoint), 'task': task.name, 'episodes': args.episodes,
           'seed': args.seed, 'render_size': list(render_size),
           'episode_steps': (sim_config.episode_steps if sim_config is not None
                             else args.episode_steps),
           'execution': 'sync' if latency_ticks is None else 'simulated',
           'latency_ticks': latency_ticks, 'ensemble_coeff': args.ensemble_coeff, 'backend': args.backend,
           'precision': args.precision, 'precision_tolerance': args.precision_tolerance,
           'modes': {}}
    if args.n_action_steps is not None:
        out['n_action_steps'] = args.n_action_steps
    if 'blend' in modes:
        out['blend_window'] = args.blend_window
        out['blend_ticks'] = blend_ticks
    if args.workers > 1:
        out['workers'] = args.workers
    for mode in modes:
        if args.workers > 1:
            out['modes'][mode] = _parallel_mode(args, mode, latency_ticks, blend_ticks)
            _print_mode(mode, out['modes'][mode], out['modes'][mode]['seconds'],
                        out['modes'][mode]['suppressed_releases'])
            continue
        writer = None
        if args.video is not None:
            path = args.video if len(modes) == 1 else args.video.with_name(
                f'{args.video.stem}_{mode}{args.video.suffix}')
            writer = VideoWriter(path, fps=contract.fps)
        try:
            result = run_policy_episodes(
                args.checkpoint, episodes=args.episodes, mode=mode, seed=args.seed,
                device=args.device, sim_config=sim_config, contract=contract, safety=safety,
                ensemble_coeff=args.ensemble_coeff,
                frame_sink=(lambda _k, images, w=writer: w.add(side_by_side(images)))
                if writer else None,
                sink_episodes=args.video_episodes, progress=args.progress, backend=args.backend,
                latency_ticks=latency_ticks, precision=args.precision,
                precision_tolerance=args.precision_tolerance,
                n_action_steps=args.n_action_steps,
                episode_steps=args.episode_steps if sim_config is None else None,
                blend_ticks=blend_ticks if mode == 'blend' else None)
        finally:
            if writer is not None:
                writer.close()
        out['modes'][mode] = result.to_dict()
        if writer is not None:
            out['modes'][mode]['video'] = str(writer.path)
        _print_mode(mode, out['modes'][mode], result.seconds, result.suppressed_releases)
        if writer is not None:
            print(f'{"":>8}  video: {writer.path} (episodes '
                  f'{", ".join(map(str, args.video_episodes))})')
    return out


def _task_setup(args: argparse.Namespace) -> tuple:
    """The checkpoint's task, its robot's contract and node limits, and (for the package's
    own task) its simulation settings; None for a gym-aloha task, configured by gym-aloha."""
    from act_ros.core.contract import load_contract
    from act_ros.training.evaluation.rollout import _checkpoint_task, make_sim_config, sim_safety

    task = _checkpoint_task(args.checkpoint)
    contract = load_contract(task.contract_path())
    safety = sim_safety(contract, task.node_params_path())
    if task.is_aloha:
        if args.render_size is not None:
            raise ValueError(f'--render-size: {task.name} renders at the size gym-aloha gives '
                             f'its policies ({task.image_size[0]}x{task.image_size[1]}); the '
                             "runtime resizes to the checkpoint's input")
        return task, contract, safety, None
    return task, contract, safety, make_sim_config(args.checkpoint, args.render_size,
                                                   episode_steps=args.episode_steps)


def _print_mode(mode: str, s: dict, seconds: float, suppressed: int) -> None:
    if s.get('task', 'port_pick_align') != 'port_pick_align':
        stages = ', '.join(f'{k} {v}' for k, v in s['max_reward_counts'].items())
        print(f'{mode:>8}: success_rate {s["success_rate"]:.3f} ({s["successes"]}/{s["count"]} '
              f'episodes, {seconds:.0f} s); episodes by highest reward stage: {stages}')
        if s.get('seams'):
            print(f'{"":>8}  {seam_line(s["seams"])}')
        return
    print(f'{mode:>8}: align_rate {s["align_rate"]:.3f}  mean_position_error '
          f'{s["mean_position_error"] * 100:.2f} cm  mean_yaw_error {s["mean_yaw_error"]:.1f} deg'
          f'  ({s["count"]} episodes, {seconds:.0f} s, suppressed releases {suppressed})')
    failed = {phase: n for phase, n in s['failures'].items() if n}
    if failed:
        print(f'{"":>8}  failed at: ' + ', '.join(f'{phase} {n}' for phase, n in failed.items())
              + '  (grasp: never lifted; release: still held; carry: off the pad; '
              'position/yaw: on the pad, beyond tolerance)')
    if s.get('tumbles'):
        print(f'{"":>8}  tumbles: {s["tumbles"]} (the lifted box turned in the fingers)')
    if s.get('seams'):
        print(f'{"":>8}  {seam_line(s["seams"])}')
    precision = s.get('precision') or {}
    if precision:
        check = ''
        if 'precision.check_failure' in precision:
            check = (f"; {precision['precision.candidate']} could not run here: "
                     f"{precision['precision.check_failure']}")
        elif 'precision.check_max_diff' in precision:
            check = (f"; {precision['precision.candidate']} vs fp32 max normalized action "
                     f"difference {precision['precision.check_max_diff']:.4f} (tolerance "
                     f"{precision['precision.check_tolerance']:g})")
        print(f'{"":>8}  precision {precision["precision"]} (requested '
              f'{precision["precision.requested"]}: {precision["precision.why"]}){check}')


def _blocks(episodes: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous (first, count) blocks of the episodes, one per worker, none empty."""
    workers = min(workers, episodes)
    base, extra = divmod(episodes, workers)
    blocks, first = [], 0
    for k in range(workers):
        count = base + (k < extra)
        blocks.append((first, count))
        first += count
    return blocks


def _run_block(args: argparse.Namespace, mode: str, first: int, count: int,
               latency_ticks: int | None, blend_ticks: int, threads: int) -> dict:
    """One worker's episodes (seeds ``args.seed + first`` ...), in a process of its own."""
    import torch

    from act_ros.training.evaluation.rollout import run_policy_episodes

    torch.set_num_threads(threads)
    _, contract, safety, sim_config = _task_setup(args)
    return run_policy_episodes(
        args.checkpoint, episodes=count, mode=mode, seed=args.seed + first, device=args.device,
        sim_config=sim_config, contract=contract, safety=safety,
        ensemble_coeff=args.ensemble_coeff, backend=args.backend,
        latency_ticks=latency_ticks, precision=args.precision,
        precision_tolerance=args.precision_tolerance,
        n_action_steps=args.n_action_steps,
        episode_steps=args.episode_steps if sim_config is None else None,
        blend_ticks=blend_ticks if mode == 'blend' else None).to_dict(samples=True)


def _parallel_mode(args: argparse.Namespace, mode: str, latency_ticks: int | None,
                   blend_ticks: int) -> dict:
    """One mode's episodes split over ``args.workers`` spawned processes, merged in seed
    order: the same per-episode results as one process (every episode starts from its seed)."""
    import multiprocessing
    import os
    import time
    from concurrent.futures import ProcessPoolExecutor

    from act_ros.core.processes import die_with_parent
    from act_ros.training.evaluation.rollout import merge_mode_results

    blocks = _blocks(args.episodes, args.workers)
    threads = max(1, (os.cpu_count() or 1) // len(blocks))
    start = time.monotonic()
    with ProcessPoolExecutor(len(blocks), mp_context=multiprocessing.get_context('spawn'),
                             initializer=die_with_parent) as pool:  # killed: none left behind
        futures = [pool.submit(_run_block, args, mode, first, count, latency_ticks, blend_ticks,
                               threads)
                   for first, count in blocks]
        parts = [f.result() for f in futures]
    merged = merge_mode_results(mode, parts, with_episodes=True)
    merged['seconds'] = time.monotonic() - start
    return merged


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``act-ros evaluate``."""
    setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f'--episodes must be >= 1, got {args.episodes}')
    if args.workers < 1:
        parser.error(f'--workers must be >= 1, got {args.workers}')
    if args.n_action_steps is not None and args.n_action_steps < 1:
        parser.error(f'--n-action-steps must be >= 1, got {args.n_action_steps}')
    if args.workers > 1 and args.video is not None:
        parser.error('--video records in one process: leave --workers at 1 with --video')
    try:
        out = evaluate(args)
    except (ActRosError, FileNotFoundError, ValueError) as exc:
        print(f'act-ros evaluate: {exc}', file=sys.stderr)
        return 2
    if args.output is not None:
        from act_ros.provenance import result_provenance

        out = {'provenance': result_provenance(
            'act-ros evaluate', argv if argv is not None else sys.argv[1:],
            output_path=args.output, output_option='--output'), **out}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.output, json.dumps(out, indent=2))
        print(f'wrote {args.output}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
