"""A deliberately slowed build, to check that the benchmarks catch one (``make bench-check``).

Nothing in the runtime or the trainer knows of it: the slowdown is put on from outside.
``act-ros bench check --inject-slowdown F`` starts its benchmark processes with
:func:`slowed_environment`, which puts a directory holding a ``sitecustomize`` module first
on ``PYTHONPATH``. Every Python process of the benchmark (the benchmark itself, the
``act_node`` it starts, the node's inference child, a training run) runs it at start-up:
it calls :func:`install`, which wraps the functions of :data:`TARGETS` when their module
is imported (torch is not imported for it), so that each call takes ``F`` times as long:
after the call it sleeps ``F - 1`` times what the call took. The same results, computed
``F`` times slower where the benchmarks measure, on any machine; each slowed process says
so on stderr. Tests use :func:`install` (or :func:`slowed`) directly.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: (module, class, method) whose calls a slowed build stretches: every model call of the
#: runtime (in the node's inference child too) and every training step.
TARGETS: tuple[tuple[str, str, str], ...] = (
    ('act_ros.core.inference.predictor', 'ChunkPredictor', 'normalized_chunk'),
    ('act_ros.training.loop', 'Trainer', 'train_step'),
)
SITECUSTOMIZE = 'sitecustomize.py'
_MARK = '__act_ros_slowdown__'  # the factor a wrapper applies, on the wrapper


def check_factor(factor: float) -> float:
    """``factor`` as a float; a factor below 1 (or not finite) is refused with one line."""
    value = float(factor)
    if not (value >= 1.0 and value != float('inf')):
        raise ValueError(f'a slowdown factor must be a finite number >= 1, got {factor!r}')
    return value


def slowed(function: Callable[..., Any], factor: float) -> Callable[..., Any]:
    """``function`` taking ``factor`` times as long: after each call, sleep ``factor - 1``
    times what the call took."""
    factor = check_factor(factor)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            time.sleep((factor - 1.0) * (time.perf_counter() - start))

    setattr(wrapper, _MARK, factor)
    return wrapper


def slowdown_of(function: Any) -> float | None:
    """The factor :func:`slowed` put on ``function``; ``None`` for an unslowed one."""
    return getattr(function, _MARK, None)


def _patch(module: Any, targets: Iterable[tuple[str, str, str]], factor: float) -> None:
    for module_name, class_name, method in targets:
        if module_name != module.__name__:
            continue
        cls = getattr(module, class_name)
        original = cls.__dict__[method]
        if slowdown_of(original) is None:
            setattr(cls, method, slowed(original, factor))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of a target module so that the target is
    patched as soon as the module has run."""

    def __init__(self, targets: Sequence[tuple[str, str, str]], factor: float) -> None:
        self.targets = tuple(targets)
        self.factor = factor
        self.pending = {module for module, _, _ in self.targets}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module, self.targets, self.factor)

        spec.loader.exec_module = exec_module  # this module's own loader instance
        return spec


def install(factor: float, targets: Sequence[tuple[str, str, str]] = TARGETS, *,
            announce: bool = True) -> None:
    """Slow every call of ``targets`` down by ``factor`` in this process: those whose module
    is imported already at once, the others when their module is imported."""
    factor = check_factor(factor)
    later = []
    for target in targets:
        module = sys.modules.get(target[0])
        if module is not None:
            _patch(module, [target], factor)
        else:
            later.append(target)
    if later:
        sys.meta_path.insert(0, _PatchOnImport(later, factor))
    if announce:
        names = ', '.join(f'{cls}.{method}' for _, cls, method in targets)
        print(f'act_ros.bench.slowdown: a deliberately slowed build: {names} take {factor:g} '
              f'times as long in this process (pid {os.getpid()})', file=sys.stderr, flush=True)


def slowed_environment(env: Mapping[str, str], factor: float, directory: Path) -> dict[str, str]:
    """``env`` for processes whose Python interpreters (and their children's) run slowed by
    ``factor``: writes ``sitecustomize.py`` into ``directory`` (which must outlive them) and
    puts ``directory`` first on ``PYTHONPATH``."""
    factor = check_factor(factor)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SITECUSTOMIZE).write_text(
        '# A slowed benchmark run (act_ros.bench.slowdown); deleted when the run ends.\n'
        'from act_ros.bench.slowdown import chain_sitecustomize, install\n\n'
        f'install({factor!r})\n'
        'chain_sitecustomize(__file__)\n')
    out = dict(env)
    out['PYTHONPATH'] = os.pathsep.join([str(directory), *filter(None, [env.get('PYTHONPATH')])])
    return out


def chain_sitecustomize(this_file: str) -> None:
    """Run the ``sitecustomize`` this one hides (a distribution's own), if there is one."""
    here = os.path.dirname(os.path.abspath(this_file))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec('sitecustomize', path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
