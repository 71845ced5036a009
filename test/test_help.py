"""``--help`` and ``-h`` on every executable and ``act-ros`` subcommand.

The commands are enumerated, never typed: setup.py's console_scripts, ``act_ros.cli.COMMANDS``
and the benchmarks of ``act-ros bench``, so one that lands later is covered too. Each one
runs as a process of its own in an empty working directory with an empty temporary
folder (``HELP_WORKERS`` at a time) and must print its usage on stdout, nothing on
stderr, exit 0 within ``HELP_TIMEOUT_S`` (a node or simulation started by mistake runs
until killed) and leave both folders empty. In process, every option whose default is a
value shows it, and the ROS executables list every declared parameter with its default.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_launch_act import console_scripts

ROOT = Path(__file__).resolve().parents[1]
HELP_TIMEOUT_S = 120.0
HELP_WORKERS = min(4, os.cpu_count() or 1)  # --help processes at once


def help_commands() -> list[tuple[str, str, list[str], str]]:
    """``(label, 'module:function', arguments, module of the command)`` of every command
    that answers ``--help``."""
    from act_ros.bench.__main__ import BENCHMARKS
    from act_ros.cli import COMMANDS

    scripts = console_scripts()
    assert 'act-ros' in scripts, scripts
    commands = [(name, target, [], target.split(':')[0])
                for name, target in sorted(scripts.items())]
    commands += [(f'act-ros {name}', scripts['act-ros'], [name], module)
                 for name, (module, _) in COMMANDS.items()]
    commands += [(f'act-ros bench {name}', scripts['act-ros'], ['bench', name],
                  BENCHMARKS.get(name, 'act_ros.bench.__main__'))
                 for name in [*BENCHMARKS, 'all', 'check']]
    return commands


COMMANDS = help_commands()


def _run(target: str, argv: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess,
                                                                 Path, Path]:
    module, function = target.split(':')
    work, tmp = tmp_path / 'work', tmp_path / 'tmp'
    work.mkdir()
    tmp.mkdir()
    env = {**os.environ, 'TMPDIR': str(tmp),
           'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    code = f'import sys; from {module} import {function}; sys.exit({function}())'
    try:
        proc = subprocess.run([sys.executable, '-c', code, *argv], cwd=work, env=env,
                              capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f'{argv}: still running after {HELP_TIMEOUT_S:.0f} s: --help '
                             f'started it (stderr: {exc.stderr!r})') from None
    return proc, work, tmp


@pytest.fixture(scope='module')
def help_runs(request, tmp_path_factory) -> dict[str, tuple]:
    """The ``--help`` run of every command selected in this module, ``HELP_WORKERS`` at a
    time before the first check (each process imports much of the package: one after
    another they take about a minute); label -> ``_run``'s result or its error."""
    wanted = sorted({item.callspec.params['label'] for item in request.session.items
                     if item.module is request.module
                     and item.originalname == 'test_help_prints_usage_and_starts_nothing'})
    commands = {c[0]: c for c in COMMANDS}

    def one(label: str) -> tuple | AssertionError:
        _, target, argv, _ = commands[label]
        try:
            return _run(target, [*argv, '--help'], tmp_path_factory.mktemp('help'))
        except AssertionError as exc:
            return exc

    with ThreadPoolExecutor(HELP_WORKERS) as pool:
        return dict(zip(wanted, pool.map(one, wanted)))


@pytest.mark.parametrize('label,target,argv,home', COMMANDS, ids=[c[0] for c in COMMANDS])
def test_help_prints_usage_and_starts_nothing(label, target, argv, home, help_runs):
    result = help_runs[label]
    if isinstance(result, AssertionError):
        raise result
    proc, work, tmp = result
    assert proc.returncode == 0, f'{label} --help: exit {proc.returncode}\n{proc.stderr[-2000:]}'
    assert proc.stdout.startswith('usage:'), f'{label} --help: {proc.stdout[:300]!r}'
    assert proc.stderr == '', f'{label} --help wrote on stderr:\n{proc.stderr[-2000:]}'
    assert list(work.iterdir()) == [], f'{label} --help left {list(work.iterdir())}'
    assert list(tmp.iterdir()) == [], f'{label} --help left {list(tmp.iterdir())} in TMPDIR'


def _in_process(target: str, argv: list[str]) -> tuple[int, str, list[argparse.ArgumentParser]]:
    """Run ``target(argv)`` here; its exit status, stdout and the argument parsers that
    parsed on the way."""
    module, function = target.split(':')
    main = getattr(importlib.import_module(module), function)
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_known_args

    def recording(self, args=None, namespace=None):
        parsers.append(self)
        return original(self, args, namespace)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, 'parse_known_args', recording)
        with contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
    return int(code or 0), out.getvalue(), parsers


@pytest.mark.parametrize('label,target,argv,home', COMMANDS, ids=[c[0] for c in COMMANDS])
def test_short_help_shows_every_default(label, target, argv, home):
    """``-h`` too; an option whose default is a value says it; a ROS executable lists every
    parameter it declares, with its default."""
    from act_ros.core.arguments import shows_default
    from act_ros.ros.node.parameters import format_parameter_value

    code, out, parsers = _in_process(target, [*argv, '-h'])
    assert code == 0 and out.startswith('usage:'), (label, code, out[:300])
    declarations = getattr(importlib.import_module(home), 'parameter_declarations', None)
    if declarations is not None:
        assert '--ros-args' in out.splitlines()[0], out[:300]
        for spec in declarations():
            line = f'  {spec.name} (default '
            shown = 'not set' if spec.default is None else format_parameter_value(spec.default)
            assert line + shown in out, f'{label}: {spec.name} = {shown} not in --help'
        return
    if not parsers:  # a dispatcher: it names its commands
        from act_ros.bench.__main__ import BENCHMARKS
        from act_ros.cli import COMMANDS as SUBCOMMANDS
        names = SUBCOMMANDS if argv == [] else BENCHMARKS if argv == ['bench'] else ['?']
        assert all(name in out for name in names), out
        return
    parser = parsers[-1]
    for action in parser._actions:
        if shows_default(action):
            text = parser._get_formatter()._format_action(action)
            assert 'default' in text.lower(), f'{label}: {action.option_strings} hides its ' \
                f'default {action.default!r}: {text.strip()!r}'


def test_ros_help_is_read_before_ros_arguments():
    from act_ros.ros.spin import asks_for_help

    assert asks_for_help(['--help']) and asks_for_help(['-h', '--ros-args', '-p', 'x:=1'])
    assert not asks_for_help(['--ros-args', '-p', 'model_path:=-h'])
    assert not asks_for_help([])


def test_defaults_are_added_to_option_help():
    from act_ros.core.arguments import HelpFormatter

    p = argparse.ArgumentParser(prog='x', formatter_class=HelpFormatter)
    p.add_argument('--episodes', type=int, default=10)
    p.add_argument('--size', default=(96, 128), help='HxW')
    p.add_argument('--output', default=None, help='file')
    p.add_argument('--seed', default=5, help='the seed (default %(default)s: first)')
    p.add_argument('--flag', action='store_true', help='on')
    text = p.format_help()
    assert 'default: 10' in text and 'HxW (default: 96x128)' in text
    assert 'file\n' in text and 'default 5: first' in text and 'on\n' in text
    assert text.count('default') == 3
