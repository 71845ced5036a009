"""How each generated part of the docs is built from its result files: the table builders
that ``docs/results/report.yaml`` names (``table: NAME``), each called with the part's
parameters from that file (the files, labels and runs it shows).

``act-ros report`` (``act_ros/report.py``) loads this module from the checkout; a builder
takes the part's :class:`act_ros.report.Sources` (every file it reads is named in the
part's footer with its provenance) and returns the part's markdown.
"""

from __future__ import annotations

import collections
import math
import re
import statistics
from typing import Any

from act_ros.report import ReportError, Sources, table

# The builders a part may name (``table: NAME``), each called as NAME(src, **parameters).
__all__ = ['shipped_policies', 'poses_policy', 'demo_result', 'evaluations_by_mode',
           'ship_candidates', 'vision_training', 'in_process_against_ros', 'expert_runs',
           'recipe_stages', 'dagger_iterations', 'recipe_curve', 'levers', 'pose_probe',
           'input_probe', 'pose_pretrain_by_kind', 'pose_pretrain_variants', 'precisions',
           'runtime_loop', 'model_time', 'node_realtime', 'node_split', 'node_startup', 'faults',
           'executor', 'recording_runs', 'bench_check_margins', 'bench_check_runs',
           'aloha_expert', 'aloha_policy', 'aloha_curve', 'seam_modes', 'seam_bench_node']

def rate(value: float, count: int) -> str:
    return f'{value:.2f} ({round(value * count)}/{count})'


def failures_text(failures: dict) -> str:
    names = {'release': 'still held', 'grasp': 'grasp', 'carry': 'dropped in carry',
             'position': 'position', 'yaw': 'yaw', 'settle': 'settle'}
    items = sorted(((n, c) for n, c in failures.items() if c), key=lambda kv: -kv[1])
    return ', '.join(f'{names.get(n, n)} {c}' for n, c in items) or 'none'


def md_tables_after(text: str, heading: str) -> list[list[list[str]]]:
    """The markdown tables between ``heading`` (a line starting with it) and the next
    heading, as rows of cells (header included)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        raise ReportError(f'no section "{heading}"')
    tables, current = [], []
    for line in lines[start + 1:]:
        if line.startswith('#'):
            break
        if line.startswith('|'):
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if not all(set(c) <= {'-', ':'} for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def table_dict(rows: list[list[str]]) -> dict[str, dict[str, str]]:
    header = rows[0]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows[1:]}


# -- the shipped policies --------------------------------------------------------------------

def _poses_chunk(src: Sources, evaluations: list[str], recipe_log: str) -> dict:
    """The chunk-mode result of the first of ``evaluations`` that exists; before any is
    committed, the recipe's own printed evaluation line in ``recipe_log``."""
    for rel in evaluations:
        if src.exists(rel):
            return src.json(rel)['modes']['chunk']
    text = src.text(recipe_log)
    m = re.search(r'chunk: align_rate ([\d.]+)\s+mean_position_error ([\d.]+) cm\s+'
                  r'mean_yaw_error ([\d.]+) deg\s+\((\d+) episodes', text)
    f = re.search(r'failed at: ([^(]+)\(', text[m.end():]) if m else None
    if not m:
        raise ReportError(f'{recipe_log}: no chunk evaluation line')
    failures = {}
    for item in (f.group(1).split(',') if f else []):
        name, count = item.split()
        failures[name] = int(count)
    return {'align_rate': float(m.group(1)), 'mean_position_error': float(m.group(2)) / 100,
            'mean_yaw_error': float(m.group(3)), 'count': int(m.group(4)),
            'failures': failures}


def shipped_policies(src: Sources, poses: dict, vision: list[dict], aloha: dict,
                     expert: dict) -> str:
    """The README's policies: the object-state one (bold), the vision ones, the gym-aloha
    one when its evaluation is committed, and the scripted expert."""
    m = _poses_chunk(src, poses['evaluations'], poses['recipe_log'])
    expert_run = src.json(expert['file'])['runs']['plain']
    rows = [_poses_row(m, poses['label'], poses['inputs'])]
    for policy in vision:
        chunk = src.json(policy['file'])['modes']['chunk']
        rows.append([policy['label'], policy['inputs'], rate(chunk['align_rate'], chunk['count']),
                     _errors(chunk), failures_text(chunk['failures'])])
    if src.exists(aloha['file']):
        chunk = src.json(aloha['file'])['modes']['chunk']
        rows.append([aloha['label'], aloha['inputs'],
                     f"success {rate(chunk['success_rate'], chunk['count'])}", '-',
                     _stages_text(chunk['max_reward_counts'])])
    rows += [
        [expert['label'], expert['inputs'], rate(expert_run['align_rate'], expert_run['count']),
         f"{1000 * expert_run['mean_position_error']:.2f} mm / "
         f"{expert_run['mean_yaw_error']:.4f} deg", failures_text(expert_run.get('failures', {}))],
    ]
    return table(['policy in `models/`', 'inputs', 'align rate, chunk mode',
                  'mean position / yaw error', 'failures by stage'], rows)


def poses_policy(src: Sources, evaluations: list[str], recipe_log: str, label: str,
                 inputs: str) -> str:
    return table(['policy', 'inputs', 'align rate, chunk mode', 'mean position / yaw error',
                  'failures by stage'],
                 [_poses_row(_poses_chunk(src, evaluations, recipe_log), label, inputs)])


def _poses_row(m: dict, label: str, inputs: str) -> list[str]:
    return [label, inputs, f"**{rate(m['align_rate'], m['count'])}**", _errors(m, 2),
            failures_text(m['failures'])]


def _errors(m: dict, digits: int = 1) -> str:
    """``4.1 cm / 7.3 deg``: an evaluation's mean position and yaw errors."""
    return f"{100 * m['mean_position_error']:.{digits}f} cm / {m['mean_yaw_error']:.1f} deg"


def _val_pose(val: dict) -> str:
    """The pose head's held-out errors at a validation, ``-`` for a run without one."""
    if 'val_pose_box_xy_m' not in val:
        return '-'
    return (f"box {100 * val['val_pose_box_xy_m']:.2f} cm / {val['val_pose_box_yaw_deg']:.1f} deg, "
            f"pad {100 * val['val_pose_pad_xy_m']:.2f} cm / {val['val_pose_pad_yaw_deg']:.1f} deg")


def demo_result(src: Sources, file: str) -> str:
    """``make demo``'s summary: each policy and mode over ROS 2, the expert, the wall clock."""
    if not src.exists(file):
        return ('No run of `make demo` is committed yet: once its `summary.json` is, as '
                f'`{file}`, `act-ros report` writes its table here. The 100-seed '
                'evaluations above are what each policy reaches.\n')
    summary = src.json(file)
    rows = [_demo_row(label, m) for label, m in summary['ros_eval'].items()]
    # Summaries of demos before gym-aloha have one expert, the package task's.
    experts = summary.get('experts') or {'port_pick_align': summary['expert']}
    for task, e in experts.items():
        label = ('scripted expert (ceiling)' if len(experts) == 1
                 else f'scripted expert, {task} (ceiling)')
        rows.append(_demo_row(label, e, failures=False))
    stages = ', '.join(f'{k} {v / 60:.1f} min' for k, v in summary['stage_seconds'].items())
    return (table(['policy, mode, over ROS 2', 'success rate', 'position error (mm)',
                   'yaw error (deg)', 'failures by stage'], rows)
            + f"\n{summary['wall_seconds'] / 60:.1f} min in all ({stages}).\n")


def _demo_row(label: str, m: dict, *, failures: bool = True) -> list[str]:
    """A row of the demo's table: the success rate (the package's task: its align rate)
    and, for the package's task, its errors and failures by stage; for gym-aloha the
    episodes by the highest reward stage they reached."""
    success = m.get('success_rate', m.get('align_rate'))
    if 'mean_position_error' not in m:
        stages = m.get('max_reward_counts', {})
        reached = ', '.join(f'reward {k}: {v}' for k, v in stages.items() if v and k != '4')
        return [label, rate(success, m['count']), '-', '-',
                f'highest {reached}' if failures and reached else '']
    return [label, rate(success, m['count']), f"{1000 * m['mean_position_error']:.1f}",
            f"{m['mean_yaw_error']:.1f}", failures_text(m.get('failures', {})) if failures else '']


def evaluations_by_mode(src: Sources, policies: list[dict]) -> str:
    """Policies' evaluations (``act-ros evaluate``), one row per policy and mode."""
    rows = []
    for policy in policies:
        name, data = policy['label'], src.json(policy['file'])
        for mode, m in data['modes'].items():
            rows.append([name, mode, f"{data['seed']}+", rate(m['align_rate'], m['count']),
                         f"{100 * m['mean_position_error']:.1f} cm",
                         f"{m['mean_yaw_error']:.1f} deg", failures_text(m['failures']),
                         m.get('suppressed_releases', '')])
    return table(['policy', 'mode', 'seeds', 'align rate', 'mean position error',
                  'mean yaw error', 'failures by stage', 'open requests the gate suppressed'],
                 rows)


def _seed_pairs(base: dict[int, bool], mine: dict[int, bool]) -> tuple[int, int]:
    """Seeds aligned in ``mine`` and not in ``base``, and the reverse (a seed missing from
    one side counts as not aligned there)."""
    return (sum(ok and not base.get(k, False) for k, ok in mine.items()),
            sum(ok and not mine.get(k, False) for k, ok in base.items()))


def exact_mcnemar(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs (a binomial test of
    ``only_a`` against ``only_a + only_b`` fair coin flips)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def ship_candidates(src: Sources, candidates: list[dict]) -> str:
    """The vision policies that could ship, on the same seeds, chunk mode: align rate and
    the seeds each aligns that the first row does not (and the reverse), with the exact
    McNemar p-value of that difference."""
    runs = []
    for candidate in candidates:
        label, files = candidate['label'], candidate['files']
        episodes: dict[int, dict] = {}
        for rel in files:
            for episode in src.json(rel)['modes']['chunk']['episodes']:
                if episode['seed'] in episodes:
                    raise ReportError(f'{rel}: seed {episode["seed"]} is in two files of {label}')
                episodes[episode['seed']] = episode
        runs.append((label, episodes))
    base = runs[0][1]
    rows = []
    for label, episodes in runs:
        if set(episodes) != set(base):
            raise ReportError(f'{label}: other seeds than {runs[0][0]}')
        n = len(episodes)
        aligned = sum(e['success'] for e in episodes.values())
        only, lost = _seed_pairs({k: e['success'] for k, e in base.items()},
                                 {k: e['success'] for k, e in episodes.items()})
        position = sum(e['position_error_m'] for e in episodes.values()) / n
        yaw = sum(e['yaw_error_deg'] for e in episodes.values()) / n
        rows.append([label, f'{min(episodes)}-{max(episodes)}', rate(aligned / n, n),
                     f'{100 * position:.1f} cm / {yaw:.1f} deg', f'{only} / {lost}',
                     '' if label == runs[0][0] else f'{exact_mcnemar(only, lost):.3f}'])
    return table(['policy', 'seeds', 'align rate, chunk mode', 'mean position / yaw error',
                  'seeds aligned only here / only in the first row',
                  'exact McNemar p against the first row'], rows)


def vision_training(src: Sources, runs: list[dict], summary: str) -> str:
    """The vision stage of each vision recipe run: the backbone phase with the pose head,
    the freeze and cache, the frozen phase, and the pose head's held-out error at the
    freeze (the perception figure)."""
    rows = []
    for run in _present(src, runs):
        m = src.json(f"{run['folder']}/{summary}")
        cache = m.get('feature_cache', {}).get('layer4', {})
        frozen = cache.get('frozen_at_step')
        val = [h for h in m['val'] if h.get('val_l1') is not None]
        at_freeze = next((h for h in val if frozen is not None and h['step'] >= frozen), None)
        pose = '-' if at_freeze is None else _val_pose(at_freeze)
        best = m['best']['closed_loop_chunk']
        rows.append([run['label'], m['steps_completed'], f"{frozen} ({cache.get('cached_frames')} frames, "
                     f"{cache.get('build_s', 0) / 60:.0f} min)", f"{m['wall_time_s'] / 60:.0f} min",
                     m.get('precision', '-'), f"{min(h['val_l1'] for h in val):.3f}", pose,
                     f"{best['align_rate']:.2f} at step {best['step']}"])
    return table(['run', 'steps', 'backbone frozen and cached at step', 'wall clock',
                  'precision', 'best val L1', 'pose head at the freeze (held-out median)',
                  'align, chunk (10 trainer seeds)'], rows)


def in_process_against_ros(src: Sources, file: str) -> str:
    """``act-ros compare-eval``: each mode in process and over ROS 2 on the same seeds."""
    from act_ros.ros.evaluation.compare import equal_episodes

    data = src.json(file)
    rows = []
    for mode, m in data['modes'].items():
        ip, ros = m['in_process'], m['over_ros']
        n = len(m['episodes'])
        equal = equal_episodes(m)
        rows.append([mode, f"{rate(ip['align_rate'], n)}, {1000 * ip['mean_position_error']:.1f} mm",
                     f"{rate(ros['align_rate'], n)}, {1000 * ros['mean_position_error']:.1f} mm",
                     f"{equal} of {n} (largest difference "
                     f"{m['largest_difference_mm']:.1f} mm)", ros.get('lockstep_timeouts', 0)])
    return table(['mode', 'in process: align, mean position error', 'over ROS 2',
                  'episodes equal within 0.1 mm', 'lock-step timeouts'], rows)


# -- the expert and the object-state recipe --------------------------------------------------

def expert_runs(src: Sources, file: str) -> str:
    runs = src.json(file)['runs']
    rows = []
    for run in runs.values():
        err = (f"{1000 * run['mean_position_error']:.2f} mm / {run['mean_yaw_error']:.4f} deg"
               if run.get('mean_position_error') is not None else 'not recorded')
        rows.append([f"`{run['args']}`", run['count'], round(run['align_rate'] * run['count']),
                     err])
    return table(['`act-ros expert-eval` run', 'episodes', 'aligned',
                  'mean position / yaw error'], rows)


def _present(src: Sources, runs: list[dict]) -> list[dict]:
    """The recipe runs (``label``, ``folder``, ``evaluations``: its policy's 100-seed
    evaluation files) that have a record (``recipe.json`` in their folder)."""
    return [run for run in runs if src.exists(f"{run['folder']}/recipe.json")]


def _minutes(seconds: float | None) -> str:
    return '' if seconds is None else f'{seconds / 60:.1f} min'


def _iterations(src: Sources, folder: str) -> dict[int, dict[str, Any]]:
    """``dagger.jsonl`` by iteration (the first line of each)."""
    rows: dict[int, dict[str, Any]] = {}
    for it in src.jsonl(f'{folder}/dagger.jsonl'):
        rows.setdefault(it['iteration'], it)
    return rows


def recipe_stages(src: Sources, runs: list[dict]) -> str:
    """Stage times of recorded recipe runs side by side: the stages in the recipe's order,
    DAgger by iteration (its total is the sum of the iterations, so iterations that a later
    ``act-ros dagger`` added to the same run count too), and the policy's 100-seed result."""
    runs = _present(src, runs)
    columns, names = [], []
    for folder in (run['folder'] for run in runs):
        recipe = src.json(f'{folder}/recipe.json')
        stages = dict(recipe['stage_seconds'])
        if 'bc' not in stages and 'bc_wall_time_s' in recipe:
            stages = {'demos': stages.pop('demos', None), 'bc': recipe['bc_wall_time_s'],
                      **stages}  # recorded by the training, not the recipe
        iters = _iterations(src, folder)
        if iters:
            stages['dagger'] = sum(it['collect_s'] + it['train_s'] for it in iters.values())
        previous = None
        for name in (n for n in stages if n != 'evaluate'):  # each run's order kept
            if name not in names:
                names.insert(names.index(previous) + 1 if previous else 0, name)
            previous = name
        building = sum(v for k, v in stages.items() if k != 'evaluate' and v is not None)
        columns.append((stages, iters, building))
    n_iters = max((max(it, default=0) for _, it, _ in columns), default=0)
    rows = []
    for name in names:
        if name == 'dagger':
            for k in range(1, n_iters + 1):
                rows.append([f'dagger {k}: collect + fine-tune']
                            + [f"{it[k]['collect_s'] / 60:.1f} + {it[k]['train_s'] / 60:.1f} min"
                               if k in it else '' for _, it, _ in columns])
            rows.append(['dagger in all'] + [_minutes(st.get('dagger')) for st, _, _ in columns])
        else:
            rows.append([name] + [_minutes(st.get(name)) for st, _, _ in columns])
    rows.append(['**collection + training**']
                + [f'**{building / 60:.1f} min**' for _, _, building in columns])
    rows.append(['its policy, 100 unseen seeds: align chunk / ensemble']
                + [_policy_result(src, run['evaluations']) for run in runs])
    return table(['stage', *[run['label'] for run in runs]], rows)


def _policy_result(src: Sources, evaluations: list[str]) -> str:
    """``0.91 / 0.81`` from a policy's 100-seed evaluation files, empty where none is
    committed."""
    modes: dict[str, float] = {}
    for rel in evaluations:
        if src.exists(rel):
            for mode, result in src.json(rel)['modes'].items():
                modes.setdefault(mode, result['align_rate'])
    return ' / '.join(f'{modes[m]:.2f}' if m in modes else '-' for m in ('chunk', 'ensemble')
                      ) if modes else ''


def dagger_iterations(src: Sources, runs: list[dict]) -> str:
    rows = []
    for run in _present(src, runs):
        for it in _iterations(src, run['folder']).values():
            failed = failures_text(it.get('collection_failures', {}))
            rows.append([run['label'], it['iteration'], it['episodes'], f"{it['beta']:.2f}",
                         f"{it['collection_align_rate']:.2f} (failures: {failed})",
                         f"{it['expert_share']:.2f}", it['dataset_frames'],
                         f"{it['policy_closed_loop_align_rate']:.2f}"])
    return table(['run', 'iteration', 'episodes', 'beta',
                  'align while collecting (policy driving)', 'expert share of ticks',
                  'dataset frames', 'new policy, closed loop (10 trainer seeds)'], rows)


def recipe_curve(src: Sources, runs: list[dict]) -> str:
    """Align rate on the 100 unseen seeds against the CPU time spent so far, at each point
    of each vision recipe run that has an evaluation: after the vision stage
    (``curve/after_vision.json``) and after each DAgger iteration
    (``curve/after_dagger_K.json``; the last one is the run's policy evaluation)."""
    rows = []
    for run in _present(src, runs):
        label, folder, evaluations = run['label'], run['folder'], run['evaluations']
        stages = src.json(f'{folder}/recipe.json')['stage_seconds']
        # Everything before DAgger: the demonstrations, a pose pretraining, the vision stage.
        spent = sum(v for k, v in stages.items() if k not in ('dagger', 'evaluate'))
        points = [('vision stage', spent, f'{folder}/curve/after_vision.json')]
        iters = _iterations(src, folder)
        for k in sorted(iters):
            spent += iters[k]['collect_s'] + iters[k]['train_s']
            rel = f'{folder}/curve/after_dagger_{k}.json'
            if k == max(iters) and not src.exists(rel):
                rel = evaluations[0]
            points.append((f'DAgger iteration {k}', spent, rel))
        for name, seconds, rel in points:
            if not src.exists(rel):
                continue
            m = src.json(rel)['modes']['chunk']
            rows.append([label, name, f'{seconds / 3600:.2f}', rate(m['align_rate'], m['count']),
                         _errors(m), failures_text(m['failures'])])
    return table(['run', 'after', 'hours of the 2-core CPU (collection + training)',
                  'align rate, chunk, 100 unseen seeds', 'mean position / yaw error',
                  'failures by stage'], rows)


def levers(src: Sources, levers: list[dict]) -> str:
    """Each measured lever of a policy against its baseline (a lever's first row), on the
    same seeds: the ``evaluation`` file and, where given, the ``training`` summary (``file``,
    and ``run`` for a file of several runs) for its last validation."""
    rows = []
    for row in levers:
        m = src.json(row['evaluation'])['modes']['chunk']
        val_l1 = pose = '-'
        training = row.get('training')
        if training is not None:
            runs = src.json(training['file'])
            val = (runs['runs'][training['run']] if 'run' in training else runs)['val'][-1]
            val_l1, pose = f"{val['val_l1']:.4f}", _val_pose(val)
        rows.append([row['lever'], row['variant'], val_l1, pose, rate(m['align_rate'], m['count']),
                     _errors(m), failures_text(m['failures']), m['suppressed_releases']])
    return table(['lever', 'variant', 'val L1', 'pose head, held-out median',
                  'align rate, chunk (seeds 2000000+)', 'mean position / yaw error',
                  'failures by stage', 'open requests the gate suppressed'], rows)


def _pose_cells(errors: dict) -> list[str]:
    return [f"{errors['box_cm']:.2f} cm / {errors['box_deg']:.1f} deg",
            f"{errors['pad_cm']:.2f} cm / {errors['pad_deg']:.1f} deg"]


def pose_probe(src: Sources, rollouts: str, layouts: str) -> str:
    """Where the vision policy's features know the object poses (python -m research.pose_probe)."""
    rollouts, layouts = src.json(rollouts), src.json(layouts)
    rows = []
    drivers = {'expert': 'the expert drives', 'policy': 'the policy drives'}
    for row in rollouts['summary']:
        rows.append([f"the run's encoder pose head, {rollouts['episodes']} unseen seeds",
                     f"{drivers[row['driver']]}: {row['frames']}", row['n'],
                     *_pose_cells(row)])
    for fit in layouts['fits']:
        rows.append([f"a head fit on the shipped backbone's maps ({fit['cameras']}), "
                     f"{fit['layouts_train']} random first frames",
                     f"{fit['layouts_held_out']} held-out first frames", fit['layouts_held_out'],
                     *_pose_cells(fit['held_out'])])
    return table(['probe', 'frames', 'n', 'box: position / yaw error (median)',
                  'pad: position / yaw error (median)'], rows)


def input_probe(src: Sources, probes: list[dict]) -> str:
    """What each policy's chunk depends on (python -m research.input_probe): medians over the frames
    of each kind, arm joints, radians."""
    rows = []
    for probe in probes:
        for row in src.json(probe['file'])['summary']:
            rows.append([probe['policy'], row['frames'], row['n'], f"{row['true_vs_expert']:.3f}",
                         *(f"{row[f'{g} swapped']:.3f}" if f'{g} swapped' in row else '-'
                           for g in ('cameras', 'joints', 'object poses'))])
    return table(['policy (the expert drives 10 seeds from 3000000)', 'frames', 'n',
                  "chunk vs the expert's next actions", 'cameras swapped', 'joints swapped',
                  'object poses swapped'], rows)


def _curve_steps(history: list[dict]) -> list[dict]:
    """The rows that show a pose-pretraining curve's shape (every row is in the file)."""
    last = history[-1]['step']
    return [row for row in history if row['step'] in (0, 100, 300, last) or not row['step'] % 500]


def pose_pretrain_by_kind(src: Sources, file: str) -> str:
    """Held-out pose errors of ``act-ros pose-pretrain`` per scene kind along the run, against
    CPU hours and the scenes drawn."""
    run = src.json(file)
    kinds = [k for k in ('start', 'reach', 'held') if k in run['history'][0]]
    rows = []
    for row in _curve_steps(run['history']):
        cells = []
        for kind in kinds:
            cells.extend(_pose_cells(row[kind]))
        rows.append([row['step'], f"{row['seconds'] / 3600:.2f}",
                     row['step'] * run['batch_size'], *cells])
    names = {'start': 'first frame', 'reach': 'gripper near', 'held': 'box held'}
    header = ['step', 'hours (2-core CPU)', 'scenes drawn']
    for kind in kinds:
        n = run['history'][-1][kind]['n']
        header += [f'{names[kind]} (n={n}): box', f'{names[kind]}: pad']
    return table(header, rows)


def pose_pretrain_variants(src: Sources, files: list[str]) -> str:
    """Pose pretraining variants (backbone settings, image size, yaw readout): held-out
    errors over every scene kind along each run."""
    from act_ros.training.evaluation.rollout import checkpoint_render_size

    rows = []
    n = None
    for rel in files:
        run = src.json(rel)
        size = run.get('image_size') or checkpoint_render_size(src.root / run['checkpoint'])
        readout = run.get('yaw_readout') or 'flatten'  # files from before the choice
        frozen = run['frozen_up_to']
        backbone = (f"lr {run['lr']:g}, "
                    + ('every stage trains' if frozen == 'none' else f'frozen up to {frozen}')
                    + (', trained norms' if run.get('batch_norm') == 'train' else ', frozen norms'))
        if run.get('continues'):  # a run from an earlier run's checkpoint, fresh head
            backbone += f", continuing the run above from its step {run['continues']['step']}"
        for row in _curve_steps(run['history']):
            st = row['step']
            n = row['all']['n']
            rows.append([backbone, readout, f'{size[0]}x{size[1]}', st,
                         st * run['batch_size'], f"{row['seconds'] / 3600:.2f}",
                         *_pose_cells(row['all'])])
    return table(['backbone', 'yaw readout', 'rendered at', 'step', 'scenes drawn',
                  'hours', f'all held-out scenes (n={n}): box', 'pad'], rows)


def precisions(src: Sources, files: list[str]) -> str:
    """One policy, one backend, the same seeds, each precision: align rate and errors, and
    the episodes each precision alone aligned (paired by seed against the first)."""
    runs = [(rel, src.json(rel)) for rel in files if src.exists(rel)]
    base = {e['seed']: e['success'] for e in runs[0][1]['modes']['chunk']['episodes']}
    rows = []
    for _rel, data in runs:
        result = data['modes']['chunk']
        only, lost = _seed_pairs(base, {e['seed']: e['success'] for e in result['episodes']})
        precision = data['precision']
        precision = precision['precision'] if isinstance(precision, dict) else precision
        rows.append([f"{data['backend']} {precision}",
                     rate(result['align_rate'], result['count']), _errors(result, 2),
                     failures_text(result['failures']), f'{only} / {lost}'])
    return table(['precision', 'align rate, chunk mode', 'mean position / yaw error',
                  'failures by stage', 'seeds aligned only here / only in the first row'], rows)


# -- benchmarks ------------------------------------------------------------------------------

def runtime_loop(src: Sources, report: str, sizes: list[str]) -> str:
    """The control-loop tables of ``act-ros bench all``'s markdown report, per camera size."""
    text = src.text(report)
    rows = []
    for size in sizes:
        loop = md_tables_after(text, f'### Control loop at 30 Hz, 20 s each, cameras {size}')[0]
        for name, r in table_dict(loop).items():
            rows.append([size, name, f"{r['median ms']} / {r['p99 ms']} / {r['max ms']}",
                         r['overruns (>33.3 ms)'], r['ticks without action'],
                         r['chunks too late to play']])
    return table(['cameras', 'loop', 'median / p99 / max tick (ms)', 'overruns',
                  'ticks without action', 'chunks too late to play'], rows)


def model_time(src: Sources, report: str, sizes: list[str]) -> str:
    """The model-time tables of ``act-ros bench all``'s markdown report, per camera size."""
    # The report's column header holds two pipes of its own.
    text = src.text(report).replace('max |action diff|', 'max abs action diff')
    cols = ['LeRobot eager fp32', 'act_ros compiled fp32', 'act_ros openvino fp32',
            'act_ros onnxruntime fp32']
    rows = []
    for size in sizes:
        t = table_dict(md_tables_after(text, f'### Model time per chunk, cameras {size}')[0])
        row = [size]
        for col in cols:
            r = t[col]
            ms = float(r['ms / chunk (median)'])
            row.append(f'{ms:.0f}' if col == cols[0] else
                       f"{ms:.0f} ({float(r['speed-up vs LeRobot']):.2f}x, "
                       f"{r['max abs action diff (normalized)']})")
        rows.append(row)
    return table(['cameras', 'LeRobot eager', 'act_ros compiled fp32', 'OpenVINO fp32',
                  'ONNX Runtime fp32'], rows)


def _cpu_class(machine: str) -> str:
    """The CPU class a provenance's machine names (benchmark files say ``CPU class X``)."""
    found = re.search(r'CPU class (\S+)', machine)
    if found:
        return found.group(1).rstrip(';,')
    return 'x86-avx2' if 'AVX2' in machine and 'no AVX-512' in machine else machine


def _node_row(cpu: str, label: str, r: dict) -> list:
    feasible = str(r['realtime_feasible']) == 'True'
    verdict = (f"{'feasible' if feasible else '**not feasible**'} "
               f"({r['realtime_latency_median_ms']:.0f} ms: "
               f"{r['realtime_verdict'].split(':')[0]})")
    # A node whose every chunk comes late sends nothing: no latency, no first command.
    latency = (f"{r['latency_p50_ms']:.0f} / {r['latency_p99_ms']:.0f} ms"
               if r['latency_p50_ms'] is not None else 'no command')
    first = r['time_to_first_command_s']
    return [cpu, label, verdict, f"{r['command_rate_hz']:.2f}", f"{r['missed_periods']:.0f}",
            f"{r['chunks_late']:.0f}", latency,
            f"{r['node_cpu_percent']:.0f} % ({r['node_main_process_cpu_percent']:.0f} %)",
            f'{first:.1f} s' if first is not None else 'none']


def _node_run_label(data: dict, r: dict) -> str:
    """``240x320 input, chunk 30, openvino fp32`` from a ``bench node --json`` file."""
    size = data['model_input_size']
    size = data['camera_size'] if size == 'camera size' else size
    precision = r.get('realtime_measured_precision') or f"{data['backend']} {r.get('precision')}"
    return f"{size} input, chunk {data['chunk_size']}, {precision}"


def node_realtime(src: Sources, folder: str, runs: list[str]) -> str:
    """``act-ros bench node --json`` runs (``folder``/NAME.json, those committed), one row
    per run or compared setting."""
    rows = []
    for name in runs:
        rel = f'{folder}/{name}.json'
        if not src.exists(rel):
            continue
        data = src.json(rel)
        cpu = _cpu_class(data['provenance']['machine'])
        runs = data['settings'].values() if data.get('compared') else [data]
        rows += [_node_row(cpu, _node_run_label(data, r), r) for r in runs]
    return table(['CPU', 'run', 'verdict at configure (model latency median)', 'commands/s',
                  'missed periods', 'chunks late', 'command latency p50 / p99',
                  'CPU node (main process)', 'first command'], rows)


def node_split(src: Sources, folder: str, runs: list[dict]) -> str:
    """The latency split of ``act-ros bench node --json`` runs (``label``, else the run's
    settings; ``run``: ``folder``/NAME.json)."""
    rows = []
    for run in runs:
        label, data = run.get('label', ''), src.json(f"{folder}/{run['run']}.json")
        cpu = _cpu_class(data['provenance']['machine'])
        runs = data['settings'].values() if data.get('compared') else [data]
        for r in runs:
            rest = sum(r[f'split_{part}_ms'] for part in ('postprocess', 'return', 'other'))
            rows.append([cpu, label or _node_run_label(data, r), f"{r['split_chunks']:.0f}",
                         *(f"{r[f'split_{part}_ms']:.{digits}f}" for part, digits in
                           (('transfer', 1), ('preprocess', 2), ('model', 0))),
                         f'{rest:.1f}', f"{r['split_total_ms']:.0f}",
                         f"{r['split_model_only_ms']:.0f}",
                         f"{r['split_total_over_model_only']:.2f}",
                         f"{r['command_rate_hz']:.2f}", f"{r['missed_periods']:.0f}"])
    return table(['CPU', 'run (480x640 input, chunk 30)', 'chunks', 'transfer', 'preprocess',
                  'model', 'postprocess + return + other', 'total', 'model alone',
                  'total / model alone', 'commands/s', 'missed periods'], rows)


def node_startup(src: Sources, folder: str, runs: list[str]) -> str:
    """``act-ros bench node --startup-only --json`` runs (``folder``/NAME.json)."""
    rows = []
    for key in runs:
        r = src.json(f'{folder}/{key}.json')
        phases = {k.split('.', 1)[1][:-2].replace('_', ' '): v for k, v in r.items()
                  if k.startswith('startup.') and k.endswith('_s')
                  and k not in ('startup.time_to_first_command_s',
                                'startup.inputs_complete_at_s')}
        top = sorted(phases.items(), key=lambda kv: -kv[1])[:3]
        rows.append([r.get('backend', key), f"{r['time_to_first_command_s']:.1f} s",
                     ', '.join(f'{k} {v:.1f} s' for k, v in top)])
    return table(['backend (default ACT, 240x320 input)', 'first command after process start',
                  'largest phases'], rows)


def faults(src: Sources, file: str) -> str:
    """``act-ros bench faults``: each fault kind, and all of them with the exit at SIGTERM."""
    data = src.json(file)
    kinds: dict[str, list[dict]] = {}
    for r in data['results']:
        kinds.setdefault(r['kind'], []).append(r)
    rows = []
    for kind, items in kinds.items():
        measured = [r['recovery_s'] for r in items if r.get('recovery_s')]
        rows.append([kind, len(items), sum(bool(r['recovered']) for r in items),
                     sum(r.get('stale_commands', 0) for r in items),
                     sum(r.get('releases_outside', 0) for r in items),
                     f'{statistics.median(measured):.2f}' if measured
                     else 'not measured (the benchmark writes 0.0 when the node keeps '
                          'commanding)'])
    rows.append(['**all**', len(data['results']),
                 sum(bool(r['recovered']) for r in data['results']),
                 sum(r.get('stale_commands', 0) for r in data['results']),
                 sum(r.get('releases_outside', 0) for r in data['results']),
                 f"after SIGTERM: exited in {float(data['exit_s']):.1f} s, "
                 f"{data['children_left']} children left"])
    return table(['fault', 'injected', 'recovered', 'commands from stale inputs',
                  'releases outside the radius', 'time to recover, median (s)'], rows)


def executor(src: Sources, file: str) -> str:
    """``act-ros bench executor``'s table, as the benchmark prints it."""
    from act_ros.bench.executor import Try
    from act_ros.bench.executor import table as executor_table
    data = src.json(file)
    return executor_table([Try(**t) for t in data['tries']], data['commands']) + '\n'


def recording_runs(src: Sources, folder: str, runs: list[dict]) -> str:
    """One row per recorder or import run: memory, episodes (and the continuations a split
    made), frames, dropped ticks, save times."""
    rows = []
    for entry in runs:
        label, rel = entry['cpu'], f"{folder}/{entry['file']}"
        if not src.exists(rel):
            continue
        for run in src.json(rel)['runs']:
            dataset = run.get('dataset', {})
            opens = (f"yes ({dataset['episodes']} / {dataset['frames']})" if 'episodes' in dataset
                     else f"no: {dataset.get('error', 'not checked')}")
            if run['what'] == 'record':
                setting = (f"episodes of {run['episode_s']:g} s" if run['episode_s']
                           else 'one episode, saved at the end')
                if run.get('max_episode_frames'):
                    setting += f", cap {run['max_episode_frames']} frames"
                rec = run.get('recording')
                if rec is None:  # measured before the recorder split episodes
                    note = ', before episodes were split at dropped ticks'
                else:  # the recorder's episode metadata: why each episode ended
                    ended = rec['ended_by']
                    gaps = sum(n for why, n in ended.items() if why.startswith('a gap'))
                    caps = sum(n for why, n in ended.items()
                               if why.startswith('max_episode_frames'))
                    note = (f", {rec['continuations']} continuing the one before ({gaps} split "
                            f"at a gap, {caps} at the frame cap), {rec['flagged']} flagged for "
                            f"drops, the shortest {rec['shortest_frames']} frame"
                            + ('s' if rec['shortest_frames'] != 1 else ''))
                episodes = f"{run['episodes_saved']}{note}"
                behind = run['dropped_by_reason'].get('writer behind', 0)
                saves = run['save_s']
                rows.append([label, f"`record_node`, {run['minutes']:g} min, {setting}",
                             f"{run['peak_rss_mb'] / 1024:.2f}", episodes, run['frames'],
                             f"{run['dropped_ticks']} ({behind} writer behind)",
                             f'{min(saves):.1f}-{max(saves):.1f}' if saves else '-', opens])
            else:
                rows.append([label, f"`act-ros import-bag`, {run['minutes']:g} min bag "
                             f"({run['bag_mb'] / 1024:.2f} GiB MCAP), {run['video_codec']}",
                             f"{run['peak_rss_mb'] / 1024:.2f}", dataset.get('episodes', '-'),
                             dataset.get('frames', '-'), '-', f"import {run['import_s']:.0f}",
                             opens])
    return table(['CPU', 'run', 'peak RSS, GiB', 'episodes saved', 'frames', 'ticks dropped',
                  'saves, s', 'opens in LeRobot (episodes / frames)'], rows)


def bench_check_margins(src: Sources, file: str) -> str:
    """Per figure and CPU class: its baseline, the spread of the baseline's runs and the
    margin that spread gives (or why the figure has only its guard)."""
    from act_ros.bench.check import FIGURES, margins_of
    from act_ros.bench.margins import margin_text, num

    classes = src.json(file)['classes']
    rows = []
    for figure in FIGURES:
        if not figure.better:
            continue
        cells = []
        for entry in classes.values():
            base = entry['figures'].get(figure.name)
            margin = margins_of(entry).get(figure.name)
            if base is None or margin is None:
                cells.append('-')
                continue
            spread = ('' if margin.spread is None else
                      f', spread {margin.spread:.1%}' + (' of the whole' if figure.whole
                                                         else ''))
            cells.append(f'{num(base)}: {margin_text(figure, base, margin)} '
                         f'({margin.runs} run{"s" if margin.runs > 1 else ""}{spread})')
        rows.append([f'`{figure.name}`', figure.better, *cells])
    return table(['figure', 'better', *(f'`{k}`' for k in classes)], rows)


def bench_check_runs(src: Sources, runs: list[dict]) -> str:
    """``act-ros bench check`` runs side by side: each figure's measured value and verdict."""
    from act_ros.bench.margins import num

    runs = [(run['label'], src.json(run['file'])) for run in runs if src.exists(run['file'])]
    if not runs:
        return 'No run committed yet.\n'
    names = [r['figure'] for r in runs[0][1]['rows']]
    rows = []
    for name in names:
        cells = []
        for _, data in runs:
            row = next((r for r in data['rows'] if r['figure'] == name), None)
            cells.append('-' if row is None else
                         f"{num(row['measured'])} {row['verdict']}")
        base = next(r for r in runs[0][1]['rows'] if r['figure'] == name)
        rows.append([f'`{name}`', num(base['baseline']), base['margin'], *cells])
    return table(['figure', 'baseline', 'margin', *(f'{label}: measured, verdict'
                                                     for label, _ in runs)], rows)


# -- gym-aloha's transfer cube (docs/aloha.md) -----------------------------------------------

ALOHA_STAGES = {'0': 'never touched', '1': 'touched', '2': 'lifted, not handed over',
                '3': 'both grippers on it, still on the table'}


def aloha_expert(src: Sources, file: str) -> str:
    """The gym-aloha expert's success on the evaluation seeds: its joint-space replay (the
    demonstrations) and the end-effector plan it replays."""
    e = src.json(file)
    failed = _stages_text(e['max_reward_counts'])
    seeds = e['failed_seeds']
    first = e['provenance']['command'].split('--seed ')[1].split()[0]
    return table(['scripted expert, transfer cube', 'seeds', 'success rate',
                  'failed episodes by the stage they reached'],
                 [['joint-space replay (what the dataset records)',
                   f"{first}..{int(first) + e['count'] - 1}",
                   f"**{rate(e['success_rate'], e['count'])}**", failed],
                  ['the end-effector plan it replays', 'same',
                   rate(e['plan_success_rate'], e['count']), '']]) + (
        f"\nFailed seeds: {', '.join(str(s) for s in seeds) or 'none'}.\n")


def _stages_text(counts: dict[str, int]) -> str:
    """Failed episodes by the highest gym-aloha reward stage they reached."""
    return ', '.join(f'{ALOHA_STAGES[k]} {v}' for k, v in counts.items()
                     if v and k in ALOHA_STAGES) or 'none'


def _aloha_runs(src: Sources, evaluations: list[dict], lerobot: dict
                ) -> list[tuple[str, dict[int, tuple[bool, float]], float]]:
    """Each way the shipped transfer-cube policy was scored: (label, {seed: (success,
    highest reward)}, seconds), the in-process chunk run first."""
    runs = []
    for evaluation in evaluations:
        data = src.json(evaluation['file'])
        chunk = data.get('modes', data)['chunk']
        runs.append((evaluation['label'], {int(e['seed']): (bool(e['success']), float(e['max_reward']))
                             for e in chunk['episodes']},
                     chunk.get('seconds', chunk.get('wall_s'))))
    overall = src.json(lerobot['file'])['eval_info']['overall']
    runs.append((lerobot['label'], {int(e['seed']): (bool(e['success']), float(e['max_reward']))
                  for e in overall['per_episode']}, overall['eval_s']))
    return runs


def aloha_policy(src: Sources, evaluations: list[dict], lerobot: dict) -> str:
    """The trained transfer-cube policy scored three ways on the evaluation seeds: the
    package's evaluator, over ROS 2 through act_node, and LeRobot's own lerobot-eval; with
    the per-seed agreement of the other two with the in-process run."""
    runs = _aloha_runs(src, evaluations, lerobot)
    rows = []
    for label, episodes, seconds in runs:
        seeds = sorted(episodes)
        wins = sum(success for success, _ in episodes.values())
        stages = collections.Counter(str(int(reward)) for _, reward in episodes.values())
        rows.append([label, f'{seeds[0]}..{seeds[-1]}',
                     f'**{rate(wins / len(seeds), len(seeds))}**', _stages_text(dict(sorted(stages.items()))),
                     f'{seconds / 60:.1f} min'])
    text = table(['evaluation', 'seeds', 'success rate', 'failed episodes by the stage they '
                  'reached', 'wall clock'], rows)
    reference = runs[0][1]
    for label, episodes, _ in runs[1:]:
        shared = sorted(set(episodes) & set(reference))
        same = sum(episodes[s][0] == reference[s][0] for s in shared)
        text += (f"\n{label.split(' (')[0].split(':')[0]}: the same outcome as `act-ros "
                 f'evaluate` (chunk) on {same} of the {len(shared)} seeds both ran.\n')
    return text


def aloha_curve(src: Sources, model: str, evaluation: str, curve: str) -> str:
    """Success of the transfer-cube run's checkpoints against the time its training spent:
    on the 5 trainer seeds its selection used, and on the evaluation seeds (chunk mode): the
    best step's ``evaluation``, the others' ``curve``/step_NNNNNN.json."""
    metrics = src.json(f'{model}/training_metrics.json')
    best_step = metrics['best']['closed_loop_chunk']['step']
    rows = []
    for point in metrics['history']['closed_loop']:
        step = point['step']
        rel = evaluation if step == best_step else f'{curve}/step_{step:06d}.json'
        result = (rate(src.json(rel)['modes']['chunk']['success_rate'],
                       src.json(rel)['modes']['chunk']['count'])
                  if src.exists(rel) else 'not evaluated')
        trainer = point['chunk']
        rows.append([step, f"{point['cpu_s'] / 3600:.2f}", f"{point['wall_s'] / 3600:.2f}",
                     rate(trainer['success_rate'], trainer['count']), result])
    return table(['step', 'training CPU hours', 'training wall-clock hours',
                  'success, trainer seeds 1000000+', 'success, evaluation seeds 2000000+'],
                 rows)


def _seam_evaluation(src: Sources, folder: str, mode: str) -> tuple[str, dict] | None:
    """The largest committed evaluation of ``mode`` in ``folder`` (100 seeds, else 10)."""
    for seeds in (100, 10):
        rel = f'{folder}/evaluation_{mode}_{seeds}_seeds.json'
        if src.exists(rel):
            return rel, src.json(rel)
    return None


def seam_modes(src: Sources, folder: str, modes: list[str]) -> str:
    """Each handover mode on the same unseen seeds: align rate (with the seeds it aligns
    that chunk mode does not, and the reverse, and the exact McNemar p of that), and the
    seams of the commands it sent against the motion within chunks."""
    found = {mode: _seam_evaluation(src, folder, mode) for mode in modes}
    if not found['chunk']:
        return ('No seam evaluation is committed yet: once `act-ros evaluate` has written '
                f'`{folder}/evaluation_<mode>_100_seeds.json` (the command above), '
                '`act-ros report` writes the table here.\n')
    base = {e['seed']: e['success'] for e in found['chunk'][1]['modes']['chunk']['episodes']}
    rows = []
    for mode in modes:
        if found[mode] is None:
            rows.append([mode, 'not measured yet'] + [''] * 6)
            continue
        data = found[mode][1]
        m = data['modes'][mode]
        episodes = {e['seed']: e['success'] for e in m['episodes']}
        label = mode + (f" ({data['blend_ticks']}-tick crossfade)" if mode == 'blend' else '')
        if set(episodes) == set(base) and mode != 'chunk':
            only, lost = _seed_pairs(base, episodes)
            paired = f'{only} / {lost} (p = {exact_mcnemar(only, lost):.2f})'
        else:
            paired = '' if mode == 'chunk' else 'other seeds'
        seams = m['seams']
        rows.append([label, rate(m['align_rate'], m['count']), paired,
                     f"{seams['over_within_p99']} of {seams['handovers']} "
                     f"({100 * seams['over_within_p99_fraction']:.0f} %)",
                     f"{seams['velocity_jump_mean']:.3f} / {seams['velocity_jump_median']:.3f}",
                     f"{seams['velocity_jump_max']:.2f}",
                     f"{seams['within_chunk_velocity_step_p99']:.3f}",
                     f"{seams['acceleration_jump_median']:.1f} "
                     f"({seams['within_chunk_acceleration_step_p99']:.1f})"])
    return table(['mode', 'align rate', 'seeds aligned only here / only in chunk mode',
                  'handovers over the within-chunk p99', 'velocity jump mean / median (rad/s)',
                  'velocity jump max (rad/s)', 'within-chunk velocity step p99 (rad/s)',
                  'acceleration jump median (within-chunk p99), rad/s^2'], rows)


def seam_bench_node(src: Sources, file: str) -> str:
    """act_node at 480x640 camera load, chunk against blend mode, side by side."""
    if not src.exists(file):
        return ('No node benchmark of the modes is committed yet: `act-ros bench node --mode '
                f'chunk,blend --repeats 3 --json {file}` writes it.\n')
    data = src.json(file)
    rows = []
    for label, r in data['settings'].items():
        rows.append([label, f"{r['command_rate_hz']:.1f}", f"{r['missed_periods']:g} of "
                     f"{r['periods_in_window']:g}", f"{r['node_missed_periods_in_window']:g}",
                     f"{r['latency_p50_ms']:.0f} / {r['latency_p99_ms']:.0f} ms",
                     f"{r['node_cpu_percent']:.0f} %",
                     f"{r['seams_over_within_p99']:g} of {r['seams_handovers']:g}"])
    rounds = data.get('rounds per setting (medians shown)') or len(
        data.get('order', [])) // max(1, len(data['settings'])) or 1
    return (table(['mode', 'commands/s', 'missed periods (at the harness)',
                   'missed periods (the node)', 'command latency p50 / p99', 'CPU node',
                   'handovers over the within-chunk p99 (last 60 s)'], rows)
            + f"\n{data['camera_size']} cameras, {data['model_input_size']} model input, chunk "
            f"{data['chunk_size']}, {data['mode']}; medians of {rounds} round(s) per mode.\n")


