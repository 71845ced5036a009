"""``act-ros report``: every table of figures in the README and ``docs/`` from result files.

A generated part of a page sits between two marker comments::

    <!-- report:NAME -->
    ...written by act-ros report...
    <!-- /report:NAME -->

``act-ros report`` rewrites every such part of ``README.md`` and ``docs/**/*.md`` from the
result files it names (committed under ``docs/``, and a shipped model's own evaluation
files under ``models/``); ``act-ros report --check`` writes nothing and exits 1 when a
committed page differs from what it would write (``test/test_docs_report.py`` runs it).

Every result file a part reads names the command, commit and machine that made it: a JSON
file in a top-level ``provenance`` object, any other file in the ``provenance.json`` of its
folder (``{"files": {NAME: {...}}}``). A file that holds several runs of a command (``python
-m act_ros.sim.expert_eval --output FILE --run NAME``) keeps each run's own provenance under
``provenance.runs[NAME]``, and each must name its command, commit and machine too. A file
put together by hand says so there (``assembled_by_hand``), fields added to a command's
output by hand are named with why (``hand_added``: field -> how), a run from a source
tree with local changes says what they were (``local_changes``) and a commit that was not
recorded says why (``commit``: ``not recorded; why``). Each generated part ends with a
line naming its files and, beside each, those of these that apply.

To add a result (for example a new evaluation of a shipped policy), commit the file with
its provenance and name it in the part's source list below (``POSES_EVALUATIONS``,
``DEMO_SUMMARY``); to add a table, write a function returning its markdown and register it
in ``PARTS``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter

ROOT = Path(__file__).resolve().parent.parent

# The object-state policy's 100-seed evaluation: the first of these that exists is used;
# before any is committed, the recipe's own printed evaluation line.
POSES_EVALUATIONS = ('docs/results/sim_port_pick_align_poses/evaluation_100_seeds.json',
                     'docs/results/sim_port_pick_align_poses/evaluation.json')
POSES_RECIPE_LOG = 'docs/results/sim_port_pick_align_poses/recipe_log_excerpt.txt'
# The shipped vision policy: its 100-seed evaluation (both modes) beside the model, and the
# run of `act-ros recipe vision` that made it (recipe.json, dagger.jsonl and the vision
# stage's summary in the folder).
# The 96x128 vision policy (the vision_pose recipe's starting backbone) and the 192x256 one
# that the demo runs.
VISION_EVALUATION = 'models/sim_port_pick_align/evaluation_100_seeds.json'
VISION_192_EVALUATION = 'models/sim_port_pick_align_192x256/evaluation_100_seeds.json'
# Run2's policy, shipped as models/sim_port_pick_align_192x256 until run3's replaced it.
VISION_RUN2_SHIPPED = 'docs/results/vision_recipe/run2/shipped_fp16_evaluation_100_seeds.json'
VISION_RUNS = (('96x128 (`act-ros recipe vision`, AVX-512 + bf16 CPU)',
                'docs/results/vision_recipe/run1', (VISION_EVALUATION,)),
               ('192x256, pose-pretrained backbone (`act-ros recipe vision_pose`, AMX CPU)',
                'docs/results/vision_recipe/run2',
                (VISION_RUN2_SHIPPED, 'docs/results/vision_recipe/run2/evaluation.json')),
               ('192x256, pose pretraining continued (`act-ros recipe vision_pose` with its '
                '`pose_continued` stage, AMX CPU)', 'docs/results/vision_recipe/run3',
                ('docs/results/vision_recipe/run3/evaluation.json',)))
VISION_STAGE = 'vision_training_summary.json'
# Which vision policy ships: each candidate on the card's 100 seeds and 300 more, chunk
# mode, paired by seed against the first (label, evaluation files).
_MORE_SEEDS = 'docs/results/vision_recipe/run3/more_seeds'
VISION_SHIP_CANDIDATES = (
    ('run2, float16 (shipped before)', (VISION_RUN2_SHIPPED, f'{_MORE_SEEDS}/previous_shipped.json')),
    ('run3, float16 (shipped now)', (VISION_192_EVALUATION, f'{_MORE_SEEDS}/run3_fp16.json')),
    ('run3, float32 (the checkpoint it was packaged from)',
     ('docs/results/vision_recipe/run3/evaluation.json', f'{_MORE_SEEDS}/run3_fp32.json')))
# Levers of the vision policy, each measured on the same 100 unseen seeds (chunk mode):
# (lever, variant, evaluation file, training run: (file, run name, or None for a file of
# one run) or None); a lever's first row is its baseline.
VISION_LEVERS_DIR = 'docs/results/vision_recipe/levers'
_ENCODER_POSE = ('pose head on the transformer encoder: the 96x128 policy fine-tuned 3000 '
                 'steps on the 200 demonstrations, backbone frozen')
_STATE_DROPOUT = ('joint-state dropout in training: the 192x256 policy on the run3 pose '
                  'backbone, 6000 steps on the 200 demonstrations, backbone frozen')
VISION_LEVERS = tuple(
    ('actions played per chunk (n_action_steps), the 96x128 policy', f'{k} of 30',
     f'{VISION_LEVERS_DIR}/n_action_steps_{k}.json', None) for k in (30, 15, 10, 5)) + tuple(
    (_ENCODER_POSE, f'{variant} the pose loss', f'{VISION_LEVERS_DIR}/encoder_pose_{variant}.json',
     (f'{VISION_LEVERS_DIR}/encoder_pose_training.json', variant))
    for variant in ('without', 'with')) + (
    (_STATE_DROPOUT, 'none (the run3 vision stage)',
     'docs/results/vision_recipe/run3/curve/after_vision.json',
     (f'docs/results/vision_recipe/run3/{VISION_STAGE}', None)),
    (_STATE_DROPOUT, 'the joint state replaced by its mean in half the samples (--state-dropout 0.5)',
     f'{VISION_LEVERS_DIR}/state_dropout_with.json',
     (f'{VISION_LEVERS_DIR}/state_dropout_training.json', None)))
# act-ros pose-probe results: the encoder pose head of the A/B's "with" run on the states
# of the policy and of the expert; heads fit on the shipped backbone's maps of first frames.
VISION_POSE_PROBES = (f'{VISION_LEVERS_DIR}/pose_probe_rollouts.json',
                      f'{VISION_LEVERS_DIR}/pose_probe_layouts.json')
# act-ros input-probe results: (policy, file): the chunk's dependence on each input group.
VISION_INPUT_PROBES = (
    ("the run3 vision stage's policy (cameras and joints)",
     f'{VISION_LEVERS_DIR}/input_probe_vision_stage.json'),
    ('the same stage trained with --state-dropout 0.5',
     f'{VISION_LEVERS_DIR}/input_probe_state_dropout.json'),
    ('`sim_port_pick_align_poses` (cameras, joints and the object poses)',
     f'{VISION_LEVERS_DIR}/input_probe_poses.json'))
# act-ros pose-pretrain: the shipped backbone trained on the poses of random scenes.
VISION_POSE_PRETRAIN = f'{VISION_LEVERS_DIR}/pose_pretrain.json'
# The same pose pretraining with the scenes rendered at twice the size (--image-size), and
# with the attention yaw readout (--yaw-readout).
VISION_POSE_PRETRAIN_VARIANTS = (VISION_POSE_PRETRAIN,
                                 f'{VISION_LEVERS_DIR}/pose_pretrain_192x256.json',
                                 f'{VISION_LEVERS_DIR}/pose_pretrain_attention.json',
                                 f'{VISION_LEVERS_DIR}/pose_pretrain_trained_norms.json',
                                 f'{VISION_LEVERS_DIR}/pose_pretrain_192x256_attention.json',
                                 f'{VISION_LEVERS_DIR}/pose_pretrain_192x256_continued.json')
# The last one: the one before it (its replay in the vision_pose recipe, step 2500) trained
# further with a fresh head at half the rate (the recipe's pose_continued stage).
EXPERT = 'docs/results/expert/expert_eval.json'
DEMO_SUMMARY = 'docs/results/demo/summary.json'
BENCH_REPORT = 'docs/benchmarks/cpu-2core-epyc.md'
# act_node at camera rate, one `act-ros bench node --json` file per run (each names its
# machine), shown in this order: the AVX2 CPU's runs (in their CPU class's folder), then the
# AVX-512 + bf16 CPU's.
NODE_RUNS_DIR = 'docs/benchmarks/node'
NODE_RUNS = ('x86-avx2/in240_c30_openvino', 'x86-avx2/in480_c100_openvino',
             'x86-avx2/in480_c30_defaults',
             'in240_c30_openvino', 'in480_c100_openvino', 'in480_c30_precision',
             'in480_c30_defaults', 'x86-amx/in480_c30_precision')
FAULTS = 'docs/benchmarks/faults.json'
BENCH_BASELINES = 'docs/benchmarks/baselines.json'
# act-ros bench check runs kept as result files (--json): (what, file).
BENCH_CHECK_RUNS = (
    ('clean tree', 'docs/benchmarks/bench_check_avx2_busy.json'),
    ('--inject-slowdown 1.25', 'docs/benchmarks/bench_check_avx2_busy_slowed_1.25.json'),
)
EXECUTOR_BENCH = 'docs/benchmarks/executor.json'
COMPARISON = 'docs/results/sim_port_pick_align/comparison_20_seeds.json'
TRAINING_STEP = 'docs/results/training/step_times_cpu.json'
# Runs of `act-ros recipe object_state` (recipe.json and dagger.jsonl in each folder): the
# one that made the shipped policy, and a later run on another CPU.
# Each run: (label, folder, its policy's 100-seed evaluation files: one per mode or both
# modes in one).
_RECIPE_EVALUATION_NAMES = ('evaluation_100_seeds.json', 'evaluation_ensemble_100_seeds.json')
RECIPE_RUNS = (('the shipped policy\'s run (AVX2 CPU, shared)',
                'docs/results/sim_port_pick_align_poses',
                tuple(f'docs/results/sim_port_pick_align_poses/{n}' for n in _RECIPE_EVALUATION_NAMES)),
               ('a second run (AVX-512 + bf16 CPU, quiet)',
                'docs/results/sim_port_pick_align_poses/recipe_run2',
                tuple(f'docs/results/sim_port_pick_align_poses/recipe_run2/{n}'
                      for n in _RECIPE_EVALUATION_NAMES)))

# `act-ros bench record` runs (record_node over minutes of two 480x640 cameras,
# act-ros import-bag of a bag as long): (CPU and what changed, file).
RECORDING_DIR = 'docs/results/recording'
RECORDING_RUNS = (
    ('AVX2 EPYC', 'record_import_10min.json'),
    ('AVX-512 EPYC', 'record_import_10min_avx512.json'),
    ('AVX2 EPYC at 2.0 GHz: later episodes\' writers made by the niced saver',
     'record_import_10min_avx2_2ghz.json'),
    ('the same CPU: writers made by a preparer thread', 'record_10min_avx2_2ghz_preparer.json'),
    ('the same CPU: single-threaded executor', 'record_10min_avx2_2ghz_single_thread.json'),
    ('AVX2 EPYC shared with a training (load average 10-17): the one-hour run\'s short form, '
     'the cap lowered to 3000 frames', 'record_5min_one_take_cap3000_busy.json'),
)

# Seams of the object-state policy per handover mode, the same unseen seeds
# (`act-ros evaluate --mode <mode> --output ...`): the 100-seed runs the table shows, and
# the plotted trace (`act-ros plot-seams --trace`); act_node under camera load in chunk
# and blend mode (`act-ros bench node --mode chunk,blend --json`).
SEAMS_DIR = 'docs/results/seams'
SEAM_MODES = ('chunk', 'ensemble', 'blend')
SEAMS_BENCH_NODE = 'docs/benchmarks/node/in480_c30_modes.json'  # x86-avx512-bf16

PROVENANCE_KEYS = ('command', 'commit', 'machine')
MARKER = re.compile(r'<!-- report:([a-z0-9_]+) -->\n(.*?)<!-- /report:\1 -->', re.S)
# A table of figures outside a generated part: its header names a measurement or a unit,
# or one of its cells (outside a column of defaults) is a measured quantity (a number with
# a unit, a decimal number).
FIGURE_HEADER = re.compile(r'(?<![\w-])(ms|s|min|h|GB|MB|kB|KB|RSS|Hz|fps|%|seconds|minutes|'
                           r'hours|time|times|latency|peak|frames|drops|align|wall clock|'
                           r'commands/s|speed-up|steps/s|samples|missed|recovered|error)'
                           r'(?![\w-])', re.I)
MEASURED_CELL = re.compile(r'^\**[~<>]?\s*[-+]?\d[\d ]*(\.\d+)?\s*(ms|s|min|h|GB|MB|kB|KB|%|Hz|'
                           r'x|fps)(?![\w-])|^\**[-+]?\d+\.\d+\**$')
DEFAULTS_COLUMN = re.compile(r'^default', re.I)


class ReportError(Exception):
    """A part cannot be generated: a missing file, or a file without its provenance."""


class Sources:
    """Reads result files relative to the repository root and remembers which were read."""

    def __init__(self, root: Path):
        self.root = root
        self.read: list[str] = []

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def text(self, rel: str) -> str:
        path = self.root / rel
        if not path.is_file():
            raise ReportError(f'{rel}: result file missing')
        if rel not in self.read:
            self.read.append(rel)
        return path.read_text()

    def json(self, rel: str) -> Any:
        return json.loads(self.text(rel))

    def jsonl(self, rel: str) -> list[dict]:
        return [json.loads(line) for line in self.text(rel).splitlines() if line.strip()]


def provenance(root: Path, rel: str) -> dict:
    """The command, commit and machine that made a result file (see the module's doc)."""
    path = root / rel
    if path.suffix == '.json':
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get('provenance'), dict):
            return data['provenance']
    folder = path.parent / 'provenance.json'
    if folder.is_file():
        entry = json.loads(folder.read_text()).get('files', {}).get(path.name)
        if isinstance(entry, dict):
            return entry
    raise ReportError(f'{rel}: no provenance (a top-level "provenance" object in a JSON file, '
                      f'else an entry in {path.parent.relative_to(root)}/provenance.json)')


def _check_commit(rel: str, entry: dict, what: str = 'provenance') -> None:
    """A commit with local changes names them; one not recorded says why."""
    commit = str(entry.get('commit', ''))
    if 'local changes' in commit and not str(entry.get('local_changes', '')).strip():
        raise ReportError(f'{rel}: {what} says "{commit}" but not what the local changes were '
                          '(expected a "local_changes" entry)')
    if commit.startswith('not recorded') and not commit.removeprefix('not recorded').strip(
            ' ;:,.'):
        raise ReportError(f'{rel}: {what} says the commit was not recorded but not why '
                          '(expected "not recorded; why")')
    hand = entry.get('hand_added', {})
    if not isinstance(hand, dict) or not all(str(v).strip() for v in hand.values()):
        raise ReportError(f'{rel}: {what}.hand_added must map each field added by hand to how '
                          'it was added')


def provenance_notes(entry: dict) -> list[str]:
    """What a part's footer says beside a file: put together by hand, fields added by
    hand, local changes, a commit not recorded."""
    notes = []
    hand = entry.get('assembled_by_hand')
    if hand:
        notes.append('assembled by hand' + (f': {hand}' if isinstance(hand, str) else ''))
    for field, how in (entry.get('hand_added') or {}).items():
        notes.append(f'`{field}` added by hand: {how}')
    commit = str(entry.get('commit', ''))
    if 'local changes' in commit:
        notes.append(f"run at {commit.split(' with local changes')[0]} with local changes: "
                     f"{entry['local_changes']}")
    if commit.startswith('not recorded'):
        notes.append(f'commit {commit}')
    for name, run in (entry.get('runs') or {}).items():
        notes += [f'{name}: {note}' for note in provenance_notes(run)]
    return notes


def check_provenance(root: Path, rel: str) -> dict:
    entry = provenance(root, rel)
    missing = [key for key in PROVENANCE_KEYS if not str(entry.get(key, '')).strip()]
    if missing:
        raise ReportError(f'{rel}: provenance lacks {", ".join(missing)}')
    _check_commit(rel, entry)
    runs = entry.get('runs', {})
    if not isinstance(runs, dict):
        raise ReportError(f'{rel}: provenance.runs is not an object (a run name to its '
                          'provenance)')
    for name, run in runs.items():
        missing = [key for key in PROVENANCE_KEYS
                   if not isinstance(run, dict) or not str(run.get(key, '')).strip()]
        if missing:
            raise ReportError(f'{rel}: provenance of run "{name}" lacks {", ".join(missing)}')
        _check_commit(rel, run, f'provenance of run "{name}"')
    return entry


# -- formatting -----------------------------------------------------------------------------

def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines) + '\n'


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

def _poses_chunk(src: Sources) -> dict:
    for rel in POSES_EVALUATIONS:
        if src.exists(rel):
            return src.json(rel)['modes']['chunk']
    text = src.text(POSES_RECIPE_LOG)
    m = re.search(r'chunk: align_rate ([\d.]+)\s+mean_position_error ([\d.]+) cm\s+'
                  r'mean_yaw_error ([\d.]+) deg\s+\((\d+) episodes', text)
    f = re.search(r'failed at: ([^(]+)\(', text[m.end():]) if m else None
    if not m:
        raise ReportError(f'{POSES_RECIPE_LOG}: no chunk evaluation line')
    failures = {}
    for item in (f.group(1).split(',') if f else []):
        name, count = item.split()
        failures[name] = int(count)
    return {'align_rate': float(m.group(1)), 'mean_position_error': float(m.group(2)) / 100,
            'mean_yaw_error': float(m.group(3)), 'count': int(m.group(4)),
            'failures': failures}


def part_shipped_policies(src: Sources) -> str:
    poses = _poses_chunk(src)
    expert = src.json(EXPERT)['runs']['plain']
    rows = [
        ['`sim_port_pick_align_poses`', 'both cameras, joints, box and pad poses',
         f"**{rate(poses['align_rate'], poses['count'])}**",
         f"{100 * poses['mean_position_error']:.2f} cm / {poses['mean_yaw_error']:.1f} deg",
         failures_text(poses['failures'])]]
    for name, inputs, rel in (
            ('sim_port_pick_align_192x256', 'both cameras (192x256), joints', VISION_192_EVALUATION),
            ('sim_port_pick_align', 'both cameras (96x128), joints', VISION_EVALUATION)):
        vision = src.json(rel)['modes']['chunk']
        rows.append([f'`{name}`', inputs, rate(vision['align_rate'], vision['count']),
                     f"{100 * vision['mean_position_error']:.1f} cm / "
                     f"{vision['mean_yaw_error']:.1f} deg", failures_text(vision['failures'])])
    if src.exists(ALOHA_EVALUATION):
        aloha = src.json(ALOHA_EVALUATION)['modes']['chunk']
        rows.append(['`aloha_transfer_cube` (gym-aloha, [docs/aloha.md](docs/aloha.md))',
                     'top camera (120x160), 14 joints',
                     f"success {rate(aloha['success_rate'], aloha['count'])}", '-',
                     _stages_text(aloha['max_reward_counts'])])
    rows += [
        ['scripted expert (`act_ros/sim/expert.py`)', 'simulator state',
         rate(expert['align_rate'], expert['count']),
         f"{1000 * expert['mean_position_error']:.2f} mm / {expert['mean_yaw_error']:.4f} deg",
         failures_text(expert.get('failures', {}))],
    ]
    return table(['policy in `models/`', 'inputs', 'align rate, chunk mode',
                  'mean position / yaw error', 'failures by stage'], rows)


def part_poses_policy(src: Sources) -> str:
    m = _poses_chunk(src)
    return table(['policy', 'inputs', 'align rate, chunk mode', 'mean position / yaw error',
                  'failures by stage'],
                 [['`models/sim_port_pick_align_poses` (final)', 'cameras, joints, poses',
                   f"**{rate(m['align_rate'], m['count'])}**",
                   f"{100 * m['mean_position_error']:.2f} cm / {m['mean_yaw_error']:.1f} deg",
                   failures_text(m['failures'])]])


def part_demo_result(src: Sources) -> str:
    if not src.exists(DEMO_SUMMARY):
        return ('No run of `make demo` is committed yet: once its `summary.json` is, as '
                f'`{DEMO_SUMMARY}`, `act-ros report` writes its table here. The 100-seed '
                'evaluations above are what each policy reaches.\n')
    summary = src.json(DEMO_SUMMARY)
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


def part_vision_policy(src: Sources) -> str:
    """The shipped vision policies (float16 weights) on the 100 unseen seeds, both modes."""
    rows = []
    for name, rel in (('`sim_port_pick_align_192x256`', VISION_192_EVALUATION),
                      ('`sim_port_pick_align` (96x128)', VISION_EVALUATION)):
        data = src.json(rel)
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


def part_vision_ship_candidates(src: Sources) -> str:
    """The vision policies that could ship, on the same seeds, chunk mode: align rate and
    the seeds each aligns that the first row does not (and the reverse), with the exact
    McNemar p-value of that difference."""
    runs = []
    for label, files in VISION_SHIP_CANDIDATES:
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


def part_vision_training(src: Sources) -> str:
    """The vision stage of each vision recipe run: the backbone phase with the pose head,
    the freeze and cache, the frozen phase, and the pose head's held-out error at the
    freeze (the perception figure)."""
    rows = []
    for label, folder, _ in _present(src, VISION_RUNS):
        m = src.json(f'{folder}/{VISION_STAGE}')
        cache = m.get('feature_cache', {}).get('layer4', {})
        frozen = cache.get('frozen_at_step')
        val = [h for h in m['val'] if h.get('val_l1') is not None]
        at_freeze = next((h for h in val if frozen is not None and h['step'] >= frozen), None)
        pose = ('-' if at_freeze is None or 'val_pose_box_xy_m' not in at_freeze else
                f"box {100 * at_freeze['val_pose_box_xy_m']:.2f} cm / "
                f"{at_freeze['val_pose_box_yaw_deg']:.1f} deg, pad "
                f"{100 * at_freeze['val_pose_pad_xy_m']:.2f} cm / "
                f"{at_freeze['val_pose_pad_yaw_deg']:.1f} deg")
        best = m['best']['closed_loop_chunk']
        rows.append([label, m['steps_completed'], f"{frozen} ({cache.get('cached_frames')} frames, "
                     f"{cache.get('build_s', 0) / 60:.0f} min)", f"{m['wall_time_s'] / 60:.0f} min",
                     m.get('precision', '-'), f"{min(h['val_l1'] for h in val):.3f}", pose,
                     f"{best['align_rate']:.2f} at step {best['step']}"])
    return table(['run', 'steps', 'backbone frozen and cached at step', 'wall clock',
                  'precision', 'best val L1', 'pose head at the freeze (held-out median)',
                  'align, chunk (10 trainer seeds)'], rows)


def part_comparison_20_seeds(src: Sources) -> str:
    from act_ros.ros.evaluation.compare import equal_episodes

    data = src.json(COMPARISON)
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

def part_expert_runs(src: Sources) -> str:
    runs = src.json(EXPERT)['runs']
    rows = []
    for run in runs.values():
        err = (f"{1000 * run['mean_position_error']:.2f} mm / {run['mean_yaw_error']:.4f} deg"
               if run.get('mean_position_error') is not None else 'not recorded')
        rows.append([f"`{run['args']}`", run['count'], round(run['align_rate'] * run['count']),
                     err])
    return table(['`act-ros expert-eval` run', 'episodes', 'aligned',
                  'mean position / yaw error'], rows)


def part_expert_perturbations(src: Sources) -> str:
    data = src.json(EXPERT)['runs']['perturbed']['by_perturbation']
    return table(['perturbation', 'aligned'],
                 [[f'`{k}`', f"{v['aligned']} / {v['count']}"] for k, v in data.items()])


def _present(src: Sources, runs: tuple) -> list[tuple[str, str, tuple[str, ...]]]:
    """The runs of ``runs`` that have a record (``recipe.json`` in their folder)."""
    return [run for run in runs if src.exists(f'{run[1]}/recipe.json')]


def _minutes(seconds: float | None) -> str:
    return '' if seconds is None else f'{seconds / 60:.1f} min'


def _iterations(src: Sources, folder: str) -> dict[int, dict[str, Any]]:
    """``dagger.jsonl`` by iteration (the first line of each)."""
    rows: dict[int, dict[str, Any]] = {}
    for it in src.jsonl(f'{folder}/dagger.jsonl'):
        rows.setdefault(it['iteration'], it)
    return rows


def recipe_stages_table(src: Sources, runs: tuple) -> str:
    """Stage times of recorded recipe runs side by side: the stages in the recipe's order,
    DAgger by iteration (its total is the sum of the iterations, so iterations that a later
    ``act-ros dagger`` added to the same run count too), and the policy's 100-seed result."""
    runs = _present(src, runs)
    columns, names = [], []
    for _label, folder, _ in runs:
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
                + [_policy_result(src, evaluations) for _, _, evaluations in runs])
    return table(['stage', *[label for label, _, _ in runs]], rows)


def _policy_result(src: Sources, evaluations: tuple[str, ...]) -> str:
    """``0.91 / 0.81`` from a policy's 100-seed evaluation files, empty where none is
    committed."""
    modes: dict[str, float] = {}
    for rel in evaluations:
        if src.exists(rel):
            for mode, result in src.json(rel)['modes'].items():
                modes.setdefault(mode, result['align_rate'])
    return ' / '.join(f'{modes[m]:.2f}' if m in modes else '-' for m in ('chunk', 'ensemble')
                      ) if modes else ''


def dagger_iterations_table(src: Sources, runs: tuple) -> str:
    rows = []
    for label, folder, _ in _present(src, runs):
        for it in _iterations(src, folder).values():
            failed = failures_text(it.get('collection_failures', {}))
            rows.append([label, it['iteration'], it['episodes'], f"{it['beta']:.2f}",
                         f"{it['collection_align_rate']:.2f} (failures: {failed})",
                         f"{it['expert_share']:.2f}", it['dataset_frames'],
                         f"{it['policy_closed_loop_align_rate']:.2f}"])
    return table(['run', 'iteration', 'episodes', 'beta',
                  'align while collecting (policy driving)', 'expert share of ticks',
                  'dataset frames', 'new policy, closed loop (10 trainer seeds)'], rows)


def part_recipe_stages(src: Sources) -> str:
    """Stage times of each recorded run of ``act-ros recipe object_state``."""
    return recipe_stages_table(src, RECIPE_RUNS)


def part_dagger_iterations(src: Sources) -> str:
    return dagger_iterations_table(src, RECIPE_RUNS)


def part_vision_curve(src: Sources) -> str:
    """Align rate on the 100 unseen seeds against the CPU time spent so far, at each point
    of each vision recipe run that has an evaluation: after the vision stage
    (``curve/after_vision.json``) and after each DAgger iteration
    (``curve/after_dagger_K.json``; the last one is the run's policy evaluation)."""
    rows = []
    for label, folder, evaluations in _present(src, VISION_RUNS):
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
                         f"{100 * m['mean_position_error']:.1f} cm / "
                         f"{m['mean_yaw_error']:.1f} deg", failures_text(m['failures'])])
    return table(['run', 'after', 'hours of the 2-core CPU (collection + training)',
                  'align rate, chunk, 100 unseen seeds', 'mean position / yaw error',
                  'failures by stage'], rows)


def part_vision_levers(src: Sources) -> str:
    """Each measured lever of the vision policy against its baseline, on the same seeds."""
    rows = []
    for lever, variant, rel, training in VISION_LEVERS:
        data = src.json(rel)
        m = data['modes']['chunk']
        val_l1 = pose = '-'
        if training is not None:
            runs = src.json(training[0])
            val = (runs if training[1] is None else runs['runs'][training[1]])['val'][-1]
            val_l1 = f"{val['val_l1']:.4f}"
            if 'val_pose_box_xy_m' in val:
                pose = (f"box {100 * val['val_pose_box_xy_m']:.2f} cm / "
                        f"{val['val_pose_box_yaw_deg']:.1f} deg, pad "
                        f"{100 * val['val_pose_pad_xy_m']:.2f} cm / "
                        f"{val['val_pose_pad_yaw_deg']:.1f} deg")
        rows.append([lever, variant, val_l1, pose, rate(m['align_rate'], m['count']),
                     f"{100 * m['mean_position_error']:.1f} cm / {m['mean_yaw_error']:.1f} deg",
                     failures_text(m['failures']), m['suppressed_releases']])
    return table(['lever', 'variant', 'val L1', 'pose head, held-out median',
                  'align rate, chunk (seeds 2000000+)', 'mean position / yaw error',
                  'failures by stage', 'open requests the gate suppressed'], rows)


def _pose_cells(errors: dict) -> list[str]:
    return [f"{errors['box_cm']:.2f} cm / {errors['box_deg']:.1f} deg",
            f"{errors['pad_cm']:.2f} cm / {errors['pad_deg']:.1f} deg"]


def part_vision_pose_probe(src: Sources) -> str:
    """Where the vision policy's features know the object poses (act-ros pose-probe)."""
    rollouts, layouts = (src.json(rel) for rel in VISION_POSE_PROBES)
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


def part_vision_input_probe(src: Sources) -> str:
    """What each policy's chunk depends on (act-ros input-probe): medians over the frames
    of each kind, arm joints, radians."""
    rows = []
    for name, rel in VISION_INPUT_PROBES:
        data = src.json(rel)
        for row in data['summary']:
            rows.append([name, row['frames'], row['n'], f"{row['true_vs_expert']:.3f}",
                         *(f"{row[f'{g} swapped']:.3f}" if f'{g} swapped' in row else '-'
                           for g in ('cameras', 'joints', 'object poses'))])
    return table(['policy (the expert drives 10 seeds from 3000000)', 'frames', 'n',
                  "chunk vs the expert's next actions", 'cameras swapped', 'joints swapped',
                  'object poses swapped'], rows)


def _curve_steps(history: list[dict]) -> list[dict]:
    """The rows that show a pose-pretraining curve's shape (every row is in the file)."""
    last = history[-1]['step']
    return [row for row in history if row['step'] in (0, 100, 300, last) or not row['step'] % 500]


def part_vision_pose_pretrain(src: Sources) -> str:
    """Held-out pose errors of ``act-ros pose-pretrain`` per scene kind along the run, against
    CPU hours and the scenes drawn."""
    return _pose_pretrain_by_kind(src, VISION_POSE_PRETRAIN)


def part_vision_pose_pretrain_continued(src: Sources) -> str:
    """The same per scene kind for the 192x256 route's continued pose pretraining."""
    return _pose_pretrain_by_kind(src, VISION_POSE_PRETRAIN_VARIANTS[-1])


def _pose_pretrain_by_kind(src: Sources, rel: str) -> str:
    run = src.json(rel)
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


def part_vision_pose_pretrain_variants(src: Sources) -> str:
    """Pose pretraining variants (backbone settings, image size, yaw readout): held-out
    errors over every scene kind along each run."""
    from act_ros.training.evaluation.rollout import checkpoint_render_size

    rows = []
    n = None
    for rel in VISION_POSE_PRETRAIN_VARIANTS:
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


def part_vision_recipe_stages(src: Sources) -> str:
    """Stage times of each recorded run of ``act-ros recipe vision``."""
    return recipe_stages_table(src, VISION_RUNS)


def part_vision_dagger_iterations(src: Sources) -> str:
    return dagger_iterations_table(src, VISION_RUNS)


PRECISION_EVALUATIONS = ('docs/results/precision/openvino_fp32_chunk_100.json',
                         'docs/results/precision/openvino_bf16_chunk_100.json',
                         'docs/results/precision/openvino_int8_chunk_100.json')

# The same policy, seeds and precisions on a CPU with AMX (amx_bf16, amx_int8).
PRECISION_EVALUATIONS_AMX = tuple(rel.replace('_100.json', '_100_amx.json')
                                  for rel in PRECISION_EVALUATIONS)


def part_precision_policy(src: Sources) -> str:
    return _precision_table(src, PRECISION_EVALUATIONS)


def part_precision_policy_amx(src: Sources) -> str:
    return _precision_table(src, PRECISION_EVALUATIONS_AMX)


def _precision_table(src: Sources, files: tuple[str, ...]) -> str:
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
                     rate(result['align_rate'], result['count']),
                     f"{result['mean_position_error'] * 100:.2f} cm / "
                     f"{result['mean_yaw_error']:.1f} deg",
                     failures_text(result['failures']), f'{only} / {lost}'])
    return table(['precision', 'align rate, chunk mode', 'mean position / yaw error',
                  'failures by stage', 'seeds aligned only here / only in the first row'], rows)


# -- benchmarks ------------------------------------------------------------------------------

def part_runtime_loop(src: Sources) -> str:
    text = src.text(BENCH_REPORT)
    rows = []
    for size in ('240x320', '480x640'):
        loop = md_tables_after(text, f'### Control loop at 30 Hz, 20 s each, cameras {size}')[0]
        for name, r in table_dict(loop).items():
            rows.append([size, name, f"{r['median ms']} / {r['p99 ms']} / {r['max ms']}",
                         r['overruns (>33.3 ms)'], r['ticks without action'],
                         r['chunks too late to play']])
    return table(['cameras', 'loop', 'median / p99 / max tick (ms)', 'overruns',
                  'ticks without action', 'chunks too late to play'], rows)


def part_model_time(src: Sources) -> str:
    # The report's column header holds two pipes of its own.
    text = src.text(BENCH_REPORT).replace('max |action diff|', 'max abs action diff')
    cols = ['LeRobot eager fp32', 'act_ros compiled fp32', 'act_ros openvino fp32',
            'act_ros onnxruntime fp32']
    rows = []
    for size in ('240x320', '480x640'):
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


def part_node_realtime(src: Sources) -> str:
    rows = []
    for name in NODE_RUNS:
        rel = f'{NODE_RUNS_DIR}/{name}.json'
        if not src.exists(rel):
            continue
        data = src.json(rel)
        cpu = _cpu_class(data['provenance']['machine'])
        runs = data['settings'].values() if data.get('compared') else [data]
        rows += [_node_row(cpu, _node_run_label(data, r), r) for r in runs]
    return table(['CPU', 'run', 'verdict at configure (model latency median)', 'commands/s',
                  'missed periods', 'chunks late', 'command latency p50 / p99',
                  'CPU node (main process)', 'first command'], rows)


# `act-ros bench node --json` runs whose latency split is compared (label, file in
# NODE_RUNS_DIR): the same checkpoint before and after a change, alternated, and the
# precisions side by side.
NODE_SPLIT_RUNS = (
    ('before: images normalized in numpy (round 1)', 'x86-amx/split_before_1'),
    ('after: images normalized in the compiled model (round 1)', 'x86-amx/split_after_1'),
    ('before (round 2)', 'x86-amx/split_before_2'),
    ('after (round 2)', 'x86-amx/split_after_2'),
    ('', 'x86-amx/in480_c30_precision'),
)


def part_node_split(src: Sources) -> str:
    rows = []
    for label, name in NODE_SPLIT_RUNS:
        data = src.json(f'{NODE_RUNS_DIR}/{name}.json')
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


# `act-ros bench node --startup-only --json`, default ACT at 240x320 input, one file per
# backend (in NODE_RUNS_DIR).
NODE_STARTUP_RUNS = ('start_openvino_in240', 'start_torch_in240')


def part_node_startup(src: Sources) -> str:
    rows = []
    for key in NODE_STARTUP_RUNS:
        r = src.json(f'{NODE_RUNS_DIR}/{key}.json')
        phases = {k.split('.', 1)[1][:-2].replace('_', ' '): v for k, v in r.items()
                  if k.startswith('startup.') and k.endswith('_s')
                  and k not in ('startup.time_to_first_command_s',
                                'startup.inputs_complete_at_s')}
        top = sorted(phases.items(), key=lambda kv: -kv[1])[:3]
        rows.append([r.get('backend', key), f"{r['time_to_first_command_s']:.1f} s",
                     ', '.join(f'{k} {v:.1f} s' for k, v in top)])
    return table(['backend (default ACT, 240x320 input)', 'first command after process start',
                  'largest phases'], rows)


def part_faults(src: Sources) -> str:
    data = src.json(FAULTS)
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


def part_executor(src: Sources) -> str:
    """``act-ros bench executor``'s table, as the benchmark prints it."""
    from act_ros.bench.executor import Try
    from act_ros.bench.executor import table as executor_table
    data = src.json(EXECUTOR_BENCH)
    return executor_table([Try(**t) for t in data['tries']], data['commands']) + '\n'


def part_recording_runs(src: Sources) -> str:
    """One row per recorder or import run: memory, episodes (and the continuations a split
    made), frames, dropped ticks, save times."""
    rows = []
    for label, name in RECORDING_RUNS:
        rel = f'{RECORDING_DIR}/{name}'
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
                splits = run.get('continuations')
                if splits is None:  # measured before the recorder split episodes
                    note = ', before episodes were split at dropped ticks'
                else:
                    note = ''.join(f', {n} continuing after a {why}'
                                   for why, n in sorted(splits.items()))
                if run.get('flagged'):
                    note += f", {run['flagged']} flagged"
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


def part_bench_check_margins(src: Sources) -> str:
    """Per figure and CPU class: its baseline, the spread of the baseline's runs and the
    margin that spread gives (or why the figure has only its guard)."""
    from act_ros.bench.check import FIGURES, margins_of
    from act_ros.bench.margins import margin_text, num

    classes = src.json(BENCH_BASELINES)['classes']
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


def part_bench_check_runs(src: Sources) -> str:
    """``act-ros bench check`` runs side by side: each figure's measured value and verdict."""
    from act_ros.bench.margins import num

    runs = [(label, src.json(rel)) for label, rel in BENCH_CHECK_RUNS if src.exists(rel)]
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


def part_training_step(src: Sources) -> str:
    data = src.json(TRAINING_STEP)
    rows = [[r['step'], f"{r['ms_per_step']:.0f}", f"{r['samples_per_s']:.1f}",
             f"{r['speedup_vs_lerobot']:.2f}x"] for r in data['rows']]
    return table(['training step', 'ms / step', 'samples / s', 'vs LeRobot `update_policy`'],
                 rows)


# -- gym-aloha's transfer cube (docs/aloha.md) -----------------------------------------------

ALOHA_EXPERT = 'docs/results/aloha/expert_eval.json'
ALOHA_STAGES = {'0': 'never touched', '1': 'touched', '2': 'lifted, not handed over',
                '3': 'both grippers on it, still on the table'}


def part_aloha_expert(src: Sources) -> str:
    """The gym-aloha expert's success on the evaluation seeds: its joint-space replay (the
    demonstrations) and the end-effector plan it replays."""
    e = src.json(ALOHA_EXPERT)
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


ALOHA_DIR = 'docs/results/aloha'
ALOHA_MODEL = 'models/aloha_transfer_cube'
ALOHA_EVALUATION = f'{ALOHA_DIR}/evaluation.json'


def _stages_text(counts: dict[str, int]) -> str:
    """Failed episodes by the highest gym-aloha reward stage they reached."""
    return ', '.join(f'{ALOHA_STAGES[k]} {v}' for k, v in counts.items()
                     if v and k in ALOHA_STAGES) or 'none'


def _aloha_runs(src: Sources) -> list[tuple[str, dict[int, tuple[bool, float]], float]]:
    """Each way the shipped transfer-cube policy was scored: (label, {seed: (success,
    highest reward)}, seconds), the in-process chunk run first."""
    runs = []
    for label, rel in (('`act-ros evaluate`, chunk (100 actions per query)', ALOHA_EVALUATION),
                       ('over ROS 2: `sim_bridge` and `act_node` (lock-step), chunk',
                        f'{ALOHA_DIR}/ros_eval.json')):
        data = src.json(rel)
        chunk = data.get('modes', data)['chunk']
        runs.append((label, {int(e['seed']): (bool(e['success']), float(e['max_reward']))
                             for e in chunk['episodes']},
                     chunk.get('seconds', chunk.get('wall_s'))))
    overall = src.json(f'{ALOHA_DIR}/lerobot_eval.json')['eval_info']['overall']
    runs.append(("LeRobot's `lerobot-eval` (gym-aloha's gym environment, 480x640 frames "
                 "resized by the checkpoint's processor)",
                 {int(e['seed']): (bool(e['success']), float(e['max_reward']))
                  for e in overall['per_episode']}, overall['eval_s']))
    return runs


def part_aloha_policy(src: Sources) -> str:
    """The trained transfer-cube policy scored three ways on the evaluation seeds: the
    package's evaluator, over ROS 2 through act_node, and LeRobot's own lerobot-eval; with
    the per-seed agreement of the other two with the in-process run."""
    runs = _aloha_runs(src)
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


def part_aloha_curve(src: Sources) -> str:
    """Success of the transfer-cube run's checkpoints against the time its training spent:
    on the 5 trainer seeds its selection used, and on the evaluation seeds (chunk mode)."""
    metrics = src.json(f'{ALOHA_MODEL}/training_metrics.json')
    best_step = metrics['best']['closed_loop_chunk']['step']
    rows = []
    for point in metrics['history']['closed_loop']:
        step = point['step']
        rel = (ALOHA_EVALUATION if step == best_step
               else f'{ALOHA_DIR}/curve/step_{step:06d}.json')
        evaluation = (rate(src.json(rel)['modes']['chunk']['success_rate'],
                           src.json(rel)['modes']['chunk']['count'])
                      if src.exists(rel) else 'not evaluated')
        trainer = point['chunk']
        rows.append([step, f"{point['cpu_s'] / 3600:.2f}", f"{point['wall_s'] / 3600:.2f}",
                     rate(trainer['success_rate'], trainer['count']), evaluation])
    return table(['step', 'training CPU hours', 'training wall-clock hours',
                  'success, trainer seeds 1000000+', 'success, evaluation seeds 2000000+'],
                 rows)


def _seam_evaluation(src: Sources, mode: str) -> tuple[str, dict] | None:
    """The largest committed evaluation of ``mode`` in SEAMS_DIR (100 seeds, else 10)."""
    for seeds in (100, 10):
        rel = f'{SEAMS_DIR}/evaluation_{mode}_{seeds}_seeds.json'
        if src.exists(rel):
            return rel, src.json(rel)
    return None


def part_seam_modes(src: Sources) -> str:
    """Each handover mode on the same unseen seeds: align rate (with the seeds it aligns
    that chunk mode does not, and the reverse, and the exact McNemar p of that), and the
    seams of the commands it sent against the motion within chunks."""
    found = {mode: _seam_evaluation(src, mode) for mode in SEAM_MODES}
    if not found['chunk']:
        return ('No seam evaluation is committed yet: once `act-ros evaluate` has written '
                f'`{SEAMS_DIR}/evaluation_<mode>_100_seeds.json` (the command above), '
                '`act-ros report` writes the table here.\n')
    base = {e['seed']: e['success'] for e in found['chunk'][1]['modes']['chunk']['episodes']}
    rows = []
    for mode in SEAM_MODES:
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


def part_seam_bench_node(src: Sources) -> str:
    """act_node at 480x640 camera load, chunk against blend mode, side by side."""
    if not src.exists(SEAMS_BENCH_NODE):
        return ('No node benchmark of the modes is committed yet: `act-ros bench node --mode '
                f'chunk,blend --repeats 3 --json {SEAMS_BENCH_NODE}` writes it.\n')
    data = src.json(SEAMS_BENCH_NODE)
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


PARTS: dict[str, Callable[[Sources], str]] = {
    'shipped_policies': part_shipped_policies,
    'aloha_policy': part_aloha_policy,
    'aloha_curve': part_aloha_curve,
    'poses_policy': part_poses_policy,
    'demo_result': part_demo_result,
    'vision_policy': part_vision_policy,
    'vision_ship_candidates': part_vision_ship_candidates,
    'vision_training': part_vision_training,
    'comparison_20_seeds': part_comparison_20_seeds,
    'expert_runs': part_expert_runs,
    'expert_perturbations': part_expert_perturbations,
    'recipe_stages': part_recipe_stages,
    'dagger_iterations': part_dagger_iterations,
    'vision_recipe_stages': part_vision_recipe_stages,
    'vision_dagger_iterations': part_vision_dagger_iterations,
    'vision_curve': part_vision_curve,
    'vision_levers': part_vision_levers,
    'vision_pose_probe': part_vision_pose_probe,
    'vision_input_probe': part_vision_input_probe,
    'vision_pose_pretrain': part_vision_pose_pretrain,
    'vision_pose_pretrain_variants': part_vision_pose_pretrain_variants,
    'vision_pose_pretrain_continued': part_vision_pose_pretrain_continued,
    'runtime_loop': part_runtime_loop,
    'model_time': part_model_time,
    'node_realtime': part_node_realtime,
    'node_split': part_node_split,
    'precision_policy': part_precision_policy,
    'precision_policy_amx': part_precision_policy_amx,
    'node_startup': part_node_startup,
    'faults': part_faults,
    'executor': part_executor,
    'training_step': part_training_step,
    'aloha_expert': part_aloha_expert,
    'recording_runs': part_recording_runs,
    'bench_check_margins': part_bench_check_margins,
    'bench_check_runs': part_bench_check_runs,
    'seam_modes': part_seam_modes,
    'seam_bench_node': part_seam_bench_node,
}


# -- pages -----------------------------------------------------------------------------------

def markdown_tables(text: str) -> list[tuple[int, list[list[str]]]]:
    """(first line number, rows of cells, header first) of every markdown table of
    ``text`` outside code blocks."""
    lines = text.splitlines()
    tables: list[tuple[int, list[list[str]]]] = []
    in_code, current, start = False, [], 0
    for i, line in enumerate(lines + ['']):
        if line.startswith('```'):
            in_code = not in_code
        if not in_code and line.startswith('|'):
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if not current:
                start = i + 1
            if not all(set(c) <= {'-', ':'} for c in cells) or not current:
                current.append(cells)
            continue
        if len(current) > 1:
            tables.append((start, current))
        current = []
    return tables


def is_figure_table(rows: list[list[str]]) -> bool:
    """Whether a table reports measurements: its header names a measurement or a unit, or
    a cell outside a column of defaults holds a measured quantity."""
    header = rows[0]
    if any(FIGURE_HEADER.search(cell) for cell in header):
        return True
    defaults = {i for i, cell in enumerate(header) if DEFAULTS_COLUMN.match(cell)}
    return any(MEASURED_CELL.match(cell) for row in rows[1:]
               for i, cell in enumerate(row) if i not in defaults)


def figure_tables_outside_parts(text: str) -> list[str]:
    """``line N: header`` of every table of figures outside the generated parts: typed by
    hand, it goes stale unseen (generate it from a result file with a report part)."""
    outside = MARKER.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    return [f"line {start}: | {' | '.join(rows[0])} |" for start, rows in markdown_tables(outside)
            if is_figure_table(rows)]


def written_pages(root: Path) -> list[Path]:
    """The pages written by hand: every page but a result file (a benchmark's markdown
    report names the command that wrote it in its provenance)."""
    written = []
    for page in pages(root):
        try:
            provenance(root, str(page.relative_to(root)))
        except ReportError:
            written.append(page)
    return written


def pages(root: Path) -> list[Path]:
    """The pages a report may write: README.md and every markdown page under docs/."""
    return [root / 'README.md'] + sorted((root / 'docs').rglob('*.md'))


def render_part(root: Path, page: Path, name: str) -> tuple[str, list[str]]:
    if name not in PARTS:
        raise ReportError(f'{page.relative_to(root)}: unknown report part "{name}" '
                          f'(known: {", ".join(PARTS)})')
    src = Sources(root)
    body = PARTS[name](src)
    links = []
    for rel in src.read:
        entry = check_provenance(root, rel)
        link = os.path.relpath(root / rel, page.parent)
        notes = provenance_notes(entry)
        links.append(f'[`{rel}`]({link})' + (f" ({'; '.join(notes)})" if notes else ''))
    footer = (f"\n<sub>Generated by `act-ros report` from {', '.join(links)}.</sub>\n" if links
              else '\n<sub>Generated by `act-ros report`; its result file is not committed '
                   'yet.</sub>\n')
    return body + footer, src.read


def render_page(root: Path, page: Path) -> str:
    text = page.read_text()

    def replace(match: re.Match) -> str:
        name = match.group(1)
        body, _ = render_part(root, page, name)
        return f'<!-- report:{name} -->\n{body}<!-- /report:{name} -->'

    return MARKER.sub(replace, text)


def render_all(root: Path = ROOT) -> dict[Path, tuple[str, str]]:
    """Every page with a generated part: (committed text, text the report writes)."""
    out = {}
    for page in pages(root):
        text = page.read_text()
        if '<!-- report:' in text:
            out[page] = (text, render_page(root, page))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros report', description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument('--check', action='store_true', help='write nothing; exit 1 when a page '
                   'differs from what the report would write')
    p.add_argument('--root', type=Path, default=ROOT, help='repository root (default: this '
                   'checkout)')
    args = p.parse_args(argv)
    try:
        rendered = render_all(args.root)
    except ReportError as exc:
        print(f'act-ros report: {exc}', file=sys.stderr)
        return 1
    stale = [page for page, (old, new) in rendered.items() if old != new]
    loose = {page: figure_tables_outside_parts(page.read_text()) for page in written_pages(
        args.root)}
    for page, tables in loose.items():
        for table_line in tables:
            print(f'{page.relative_to(args.root)}: a table of figures outside a generated part '
                  f'({table_line}): generate it from a result file', file=sys.stderr)
    for page in stale:
        rel = page.relative_to(args.root)
        if args.check:
            print(f'stale: {rel} (run act-ros report)', file=sys.stderr)
        else:
            page.write_text(rendered[page][1])
            print(f'wrote {rel}')
    if (args.check and stale) or any(loose.values()):
        return 1
    if not stale:
        print(f'{len(rendered)} page(s) up to date')
    return 0


if __name__ == '__main__':
    sys.exit(main())
