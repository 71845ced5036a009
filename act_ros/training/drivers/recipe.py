"""``act-ros recipe NAME --run-dir DIR``: a whole training recipe as one resumable command.

A recipe (``config/recipe_<name>.yaml``) is a list of stages, each an ``act-ros`` command
(``collect``, ``pose-pretrain``, ``train``, ``dagger``, ``evaluate``, ``package-model``)
whose arguments may name the run directory (``{run}``), the results of earlier stages and
the package's shipped files (``{share}/models/...``).
Every stage runs as a child process and leaves its result on disk; a stage whose result is
already there is skipped, and an interrupted training or pose-pretraining stage continues
with ``--resume``, so the same command picks up an interrupted run where it stopped. The
recipe's expected wall clock is printed at the start (a stage's ``expected_min`` is a number
of minutes, or minutes per CPU class as measured on that class: this CPU's class is used,
the measured ones are listed when it has none), every stage's time at the end and in ``DIR/recipe.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_json_atomic
from act_ros.core.paths import config_path, load_yaml_mapping, share_dir
from act_ros.core.processes import run_stage, signals_deferred, stage_environment
from act_ros.training.pose_pretrain import RESULT_FILE as POSE_RESULT

COMMANDS = ('collect', 'pose-pretrain', 'train', 'dagger', 'evaluate', 'package-model')
#: Commands that continue an interrupted run of theirs with ``--resume``.
RESUMABLE = ('pose-pretrain', 'train')
#: ``expected_min`` key of a time that holds on any CPU (a plain number in the file).
ANY_CPU = 'any'


@dataclass(frozen=True)
class Stage:
    """One step of a recipe: ``act-ros COMMAND ARGS``, done once ``done`` exists (for a
    training stage: once its ``training_metrics.json`` says it finished; for a pose
    pretraining: once its ``pose_pretrain.json`` has reached its last step)."""

    name: str
    command: str
    args: tuple[str, ...]
    done: str
    #: Minutes per CPU class (:func:`act_ros.core.inference.precision.cpu_class`), or ``{ANY_CPU: m}``.
    expected_min: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.command not in COMMANDS:
            raise ValueError(f"stage '{self.name}': unknown command '{self.command}', expected "
                             f'one of {COMMANDS}')

    def expected_on(self, cpu: str) -> float | None:
        """Expected minutes on a CPU of class ``cpu`` (None: not measured there)."""
        times = self.expected_min
        return times.get(cpu, times.get(ANY_CPU))


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    stages: tuple[Stage, ...]
    reference: str = ''

    def expected_on(self, cpu: str) -> float | None:
        """Expected minutes of the whole recipe on a CPU of class ``cpu`` (None unless every
        stage was measured there)."""
        times = [stage.expected_on(cpu) for stage in self.stages]
        return None if any(t is None for t in times) else sum(times)

    def measured_classes(self) -> list[str]:
        """The CPU classes every stage has an expected time for."""
        classes = sorted({c for stage in self.stages for c in stage.expected_min} - {ANY_CPU})
        return [c for c in classes if self.expected_on(c) is not None]

    def expected_line(self, cpu: str) -> str:
        """``expected wall clock ...`` as printed at the start."""
        total = self.expected_on(cpu)
        where = f' ({self.reference})' if self.reference else ''
        if total is not None:
            return f'expected wall clock on this CPU ({cpu}): about {total:.0f} min{where}'
        measured = ', '.join(f'{c} about {self.expected_on(c):.0f} min'
                             for c in self.measured_classes())
        return (f'expected wall clock: not measured on a {cpu} CPU; measured: '
                f"{measured or 'nothing'}{where}")


def _expected_minutes(value: Any, where: str) -> dict[str, float]:
    """A stage's ``expected_min``: a number (any CPU) or ``{cpu_class: minutes}``."""
    if value is None:
        return {}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {ANY_CPU: float(value)}
    if isinstance(value, dict) and value and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise ValueError(f'{where}: expected_min must be minutes or {{cpu_class: minutes}}, got '
                     f'{value!r}')


def load_recipe(name: str, path: str | Path | None = None) -> Recipe:
    """``config/recipe_<name>.yaml`` (or ``path``)."""
    path = Path(path) if path else config_path(f'recipe_{name}.yaml')
    if not path.is_file():
        available = sorted(p.stem[len('recipe_'):] for p in config_path('.').glob('recipe_*.yaml'))
        raise FileNotFoundError(f"no recipe '{name}' ({path} does not exist); available: "
                                f'{available}')
    data = load_yaml_mapping(path, 'recipe').get('recipe')
    if not isinstance(data, dict) or not isinstance(data.get('stages'), list):
        raise ValueError(f'{path}: expected recipe: {{description, stages: [...]}}')
    stages = []
    for entry in data['stages']:
        unknown = set(entry) - {'name', 'command', 'args', 'done', 'expected_min'}
        if unknown:
            raise ValueError(f'{path}: stage {entry.get("name")}: unknown keys {sorted(unknown)}')
        stages.append(Stage(name=str(entry['name']), command=str(entry['command']),
                            args=tuple(str(a) for a in entry.get('args', ())),
                            done=str(entry['done']),
                            expected_min=_expected_minutes(
                                entry.get('expected_min'),
                                f"{path}: stage {entry.get('name')}")))
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f'{path}: stage names must be unique, got {names}')
    return Recipe(name=name, description=str(data.get('description', '')).strip(),
                  stages=tuple(stages), reference=str(data.get('reference', '')).strip())


def _expand(text: str, run: Path) -> str:
    """``{run}``: the run directory; ``{share}``: the package's directory of ``config/`` and
    ``models/`` (a shipped checkpoint, in every install layout)."""
    text = text.replace('{run}', str(run))
    return text.replace('{share}', str(share_dir())) if '{share}' in text else text


def _is_done(stage: Stage, run: Path) -> bool:
    """Whether ``stage``'s result is on disk. A ``training_metrics.json`` marker counts
    only once its run finished, whichever command wrote it (``dagger`` ends with a
    training too): an interrupted training writes one with status ``interrupted``. A
    pose pretraining's result file is written at every validation: it counts once its
    step is the last."""
    marker = Path(_expand(stage.done, run))
    if not marker.exists():
        return False
    if marker.name == 'training_metrics.json':
        status = json.loads(marker.read_text()).get('status')
        return status in ('completed', 'stopped_early')
    if marker.name == POSE_RESULT:
        result = json.loads(marker.read_text())
        return result.get('step', 0) >= result.get('steps', float('inf'))
    return True


def _stage_command(stage: Stage, run: Path) -> list[str]:
    args = [_expand(a, run) for a in stage.args]
    if stage.command in RESUMABLE:
        output = Path(args[args.index('--output-dir') + 1])
        if (output / 'last' / 'training_state.pt').is_file():
            args.append('--resume')  # an interrupted earlier run continues where it stopped
            if '--init-from' in args:  # the weights come from last/ now
                at = args.index('--init-from')
                del args[at:at + 2]
    return [sys.executable, '-m', 'act_ros.cli', stage.command, *args]


def _minutes(value: float | None) -> str:
    return '   ?' if value is None else f'{value:>4.0f}'


def run(recipe: Recipe, run_dir: Path, *, only: tuple[str, ...] = (),
        argv: list[str] | None = None, cpu: str = ANY_CPU) -> dict[str, Any]:
    """Run the stages not done yet; returns the timings (also in ``run_dir/recipe.json``,
    with its provenance: the command without the run directory, the commit, the machine;
    ``argv`` is the command line of ``act-ros recipe``, default the recipe's name; ``cpu``
    the CPU class whose expected stage times are printed)."""
    from act_ros.provenance import result_provenance

    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    record_path = run_dir / 'recipe.json'
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    record.update({'recipe': recipe.name, 'run_dir': str(run_dir)})
    record['provenance'] = result_provenance(
        'act-ros recipe', argv if argv is not None else [recipe.name],
        output_path=run_dir, output_option='--run-dir')
    seconds = record.setdefault('stage_seconds', {})
    for stage in recipe.stages:
        if only and stage.name not in only:
            continue
        if _is_done(stage, run_dir):
            print(f'=== {stage.name}: done ({_expand(stage.done, run_dir)}) ===', flush=True)
            continue
        cmd = _stage_command(stage, run_dir)
        print(f'\n=== {stage.name} (expected ~{_minutes(stage.expected_on(cpu)).strip()} min) '
              '===\n$ '
              + ' '.join(cmd), flush=True)
        start = time.monotonic()
        try:
            with stage_environment() as env:
                code = run_stage(cmd, env=env)
        finally:
            # An interrupted stage's time counts too: it is time the run spent (a training
            # continues from its checkpoint; a collection or an evaluation starts over).
            with signals_deferred():
                seconds[stage.name] = seconds.get(stage.name, 0.0) + time.monotonic() - start
                write_json_atomic(record_path, record)
        if code != 0:
            raise RuntimeError(f"stage '{stage.name}' failed with exit status {code}; fix the "
                               'cause and run the same command to continue')
        if not _is_done(stage, run_dir):
            raise RuntimeError(f"stage '{stage.name}' ended without its result "
                               f'({_expand(stage.done, run_dir)})')
    record['total_seconds'] = sum(seconds.values())
    write_json_atomic(record_path, record)
    return record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='act-ros recipe', description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument('name', help='recipe name: config/recipe_<name>.yaml')
    p.add_argument('--run-dir', type=Path, required=True, help='where every stage writes')
    p.add_argument('--only', default='', help='comma-separated stage names to run (default: '
                   'all that are not done)')
    p.add_argument('--list', action='store_true', help='print the stages and exit')
    p.add_argument('--file', type=Path, default=None,
                   help='a recipe file of your own instead of config/recipe_<name>.yaml')
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        recipe = load_recipe(args.name, args.file)
    except (FileNotFoundError, ValueError) as exc:
        print(f'act-ros recipe: {exc}', file=sys.stderr)
        return 2
    from act_ros.core.inference.precision import cpu_class

    cpu = cpu_class()
    print(f'recipe {recipe.name}: {recipe.description}')
    print(recipe.expected_line(cpu))
    width = max(12, *(len(stage.name) for stage in recipe.stages))
    for stage in recipe.stages:
        state = 'done' if _is_done(stage, args.run_dir.resolve()) else 'to run'
        print(f'  {stage.name:<{width}} act-ros {stage.command:<14} '
              f'~{_minutes(stage.expected_on(cpu))} min  {state}')
    if args.list:
        return 0
    only = tuple(s for s in args.only.split(',') if s)
    unknown = [s for s in only if s not in {st.name for st in recipe.stages}]
    if unknown:
        print(f'act-ros recipe: unknown stages {unknown}', file=sys.stderr)
        return 2
    from act_ros.core.processes import run_continuable

    code, record = run_continuable('act-ros recipe',
                                   lambda: run(recipe, args.run_dir, only=only,
                                               argv=argv if argv is not None
                                               else sys.argv[1:], cpu=cpu))
    if code:
        return code
    print('\n' + '\n'.join(f'{name:<{width}} {sec / 60:6.1f} min'
                           for name, sec in record['stage_seconds'].items()))
    print(f"{'total':<{width}} {record['total_seconds'] / 60:6.1f} min  "
          f"({args.run_dir}/recipe.json)")
    return 0


if __name__ == '__main__':
    sys.exit(main())
