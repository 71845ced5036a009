"""Every command shown in the README and docs/ parses with the tool's own argument parser.

The ```bash blocks of README.md, docs/**/*.md and research/*.md are read; each `act-ros ...`,
`python -m act_ros...` (and `python -m research...`, the probes run from a checkout),
`accelerate launch/torchrun ... -m act_ros...`, `ros2 run act_ros ...` and `make ...`
command is given to the parser it would meet, and nothing is run: the
parser's `parse_args` is intercepted right after it succeeds. A command that lacks a
required option, names an unknown one, or gives a value the parser refuses fails here.
`ros2 launch act_ros FILE name:=value` must name a launch file of the package and
arguments that file declares (read with `ast`, launch is not needed).

The pip/virtualenv setup has no `ros2`: every other `ros2 <verb>` a page shows, in a shell
block or inline, has its stand-in on the same page (`ROS2_STAND_INS`; `ros2 launch` and
`ros2 run`, and what their lines substitute, need a ROS install, as the README says).
Beyond parsing, the commands that can run here do: the package paths the pages build with
`$(act-ros share-dir)` or `$(ros2 pkg prefix act_ros)` exist, and the recorder started as
shown answers every `act-ros call` shown.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r'^\s*```(\S*)\s*$')
SHELL_LANGS = {'bash', 'sh', 'shell'}
# Executables of the package (setup.py console_scripts) that take argparse options.
ROS2_RUN_MODULES = {'train': 'act_ros.training.train'}
ROS_ARGS_EXECUTABLES = {'act_node', 'sim_bridge', 'record_node'}


def pages() -> list[Path]:
    return [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md')) + \
        sorted((ROOT / 'research').glob('*.md'))


def page_parts(text: str) -> list[tuple[str, str]]:
    """The page in order as ``(kind, text)``: ``('shell', body)`` for each shell code block
    (continuation lines joined), ``('line', line)`` for each line outside code blocks."""
    parts, block, lang = [], None, None
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence:
            if block is None:
                block, lang = [], fence.group(1)
            else:
                if lang in SHELL_LANGS:
                    parts.append(('shell', '\n'.join(block).replace('\\\n', ' ')))
                block = None
            continue
        if block is not None:
            block.append(line)
        else:
            parts.append(('line', line))
    return parts


def shell_commands(text: str) -> list[str]:
    """The commands of the text's shell code blocks: continuation lines joined, comments
    dropped, `&&` / `;` / `|` chains split."""
    return [command for kind, body in page_parts(text) if kind == 'shell'
            for command in _split(body)]


def _split(body: str) -> list[str]:
    out = []
    for line in body.splitlines():
        # A command substitution stands for one value here.
        tokens = shlex.split(re.sub(r'\$\([^)]*\)', 'SUBSTITUTED', line), comments=True)
        current: list[str] = []
        for token in tokens + ['&&']:
            if token in ('&&', ';', '|', '||'):
                if current:
                    out.append(shlex.join(current))
                current = []
            else:
                current.append(token)
    return out


def _strip_env(tokens: list[str]) -> list[str]:
    while tokens and re.match(r'^[A-Za-z_][A-Za-z0-9_]*=', tokens[0]):
        tokens = tokens[1:]
    return tokens


class _Parsed(Exception):
    pass


def parse_with(module: str, argv: list[str]) -> None:
    """Run ``module.main(argv)`` until its argument parser has parsed ``argv``, then stop.
    A parser error (SystemExit 2) is re-raised as an assertion with argparse's message."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed(self.prog)

    main = importlib.import_module(module).main
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, 'parse_args', parse_then_stop)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                main(argv)
        except _Parsed:
            return
        except SystemExit as exc:
            raise AssertionError(f'{module} {shlex.join(argv)}: exit {exc.code}: '
                                 f'{err.getvalue().strip()}') from None
    raise AssertionError(f'{module} {shlex.join(argv)}: returned without parsing its arguments '
                         f'(stderr: {err.getvalue().strip()[-300:]})')


def check_act_ros(argv: list[str]) -> None:
    from act_ros import cli
    assert argv, 'act-ros without a command'
    name, rest = argv[0], argv[1:]
    assert name in cli.COMMANDS, f'act-ros has no command {name!r}'
    if name == 'record':
        check_ros_args(rest)
        return
    if name == 'bench':
        from act_ros.bench.__main__ import BENCHMARKS, ON_DEMAND
        modules = {**BENCHMARKS, **ON_DEMAND}
        assert rest and (rest[0] in modules or rest[0] in ('all', 'check')), rest
        if rest[0] in modules:
            parse_with(modules[rest[0]], rest[1:])
        else:
            parse_with('act_ros.bench.__main__', rest)
        return
    parse_with(cli.COMMANDS[name][0], rest)


def check_ros_args(argv: list[str]) -> None:
    assert argv[:1] == ['--ros-args'], f'a ROS node takes --ros-args, got {argv}'
    for flag, value in zip(argv[1::2], argv[2::2], strict=False):
        if flag == '-p':
            assert re.match(r'^[A-Za-z_][\w.]*:=.+', value), f'-p {value}: not name:=value'


def check_python_module(module: str, argv: list[str]) -> None:
    assert module.startswith(('act_ros', 'research')), module
    assert importlib.util.find_spec(module) is not None, f'no module {module}'
    if module == 'act_ros.cli':
        check_act_ros(argv)
    elif module == 'act_ros.bench':
        parse_with('act_ros.bench.__main__', argv)
    else:
        parse_with(module, argv)


def declared_launch_arguments(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, 'id', getattr(node.func, 'attr',
                                                                            None)) \
                == 'DeclareLaunchArgument' and node.args \
                and isinstance(node.args[0], ast.Constant):
            names.add(node.args[0].value)
    return names


def check_ros2(argv: list[str]) -> None:
    verb = argv[0] if argv else ''
    if verb == 'launch' and argv[1:2] == ['act_ros']:
        launch_file = ROOT / 'launch' / argv[2]
        assert launch_file.is_file(), f'no launch file launch/{argv[2]}'
        declared = declared_launch_arguments(launch_file)
        for arg in argv[3:]:
            name = arg.split(':=', 1)[0]
            assert ':=' in arg and name in declared, \
                f'{argv[2]}: {arg!r} is not one of its arguments {sorted(declared)}'
    elif verb == 'run' and argv[1:2] == ['act_ros']:
        exe, rest = argv[2], argv[3:]
        if exe in ROS2_RUN_MODULES:
            parse_with(ROS2_RUN_MODULES[exe], rest)
        else:
            assert exe in ROS_ARGS_EXECUTABLES, f'act_ros has no executable {exe}'
            if rest:
                check_ros_args(rest)


def makefile_targets() -> set[str]:
    text = (ROOT / 'Makefile').read_text()
    return set(re.findall(r'^([A-Za-z][\w-]*):', text, re.M))


def check_make(argv: list[str]) -> None:
    makefile = (ROOT / 'Makefile').read_text()
    readers = makefile + (ROOT / 'act_ros' / 'demo.py').read_text() + \
        (ROOT / 'tools' / 'find-python').read_text()
    targets = [a for a in argv if '=' not in a]
    for target in targets:
        assert target in makefile_targets(), f'make: no target {target!r}'
    for assignment in (a for a in argv if '=' in a):
        name, value = assignment.split('=', 1)
        assert re.search(rf'\b{name}\b', readers), f'make: nothing reads {name}'
        if name == 'DEMO_ARGS':
            parse_with('act_ros.demo', shlex.split(value))


def check_command(command: str) -> str | None:
    """Checks one command; returns what it was checked as, or None when it is no command
    of this package."""
    tokens = _strip_env(shlex.split(command))
    if not tokens:
        return None
    head = tokens[0]
    if head == 'act-ros':
        check_act_ros(tokens[1:])
        return 'act-ros'
    if head in ('python', 'python3') and tokens[1:2] == ['-m'] and \
            tokens[2].startswith(('act_ros', 'research')):
        check_python_module(tokens[2], tokens[3:])
        return 'python -m'
    if head in ('accelerate', 'torchrun') and '-m' in tokens:
        index = tokens.index('-m')
        assert tokens[index + 1].startswith('act_ros'), tokens
        check_python_module(tokens[index + 1], tokens[index + 2:])
        return head
    if head == 'ros2':
        check_ros2(tokens[1:])
        return 'ros2'
    if head == 'make':
        check_make(tokens[1:])
        return 'make'
    return None


def _all_commands():
    for page in pages():
        for command in shell_commands(page.read_text()):
            yield str(page.relative_to(ROOT)), command


COMMANDS = list(_all_commands())


@pytest.mark.parametrize('page,command', COMMANDS,
                         ids=[f'{p}:{c[:60]}' for p, c in COMMANDS])
def test_shown_command_parses(page, command):
    check_command(command)


def test_the_readme_shows_the_two_commands():
    kinds = {check_command(c) for p, c in COMMANDS if p == 'README.md'}
    assert 'make' in kinds
    readme = [c for p, c in COMMANDS if p == 'README.md']
    assert 'make demo' in readme and 'make test' in readme


@pytest.mark.parametrize('command,problem', [
    ('act-ros evaluate --episodes 20 --seed 100000', '--checkpoint'),
    ('act-ros ros-eval --episodes 20 --seed 100000', '--checkpoint'),
    ('act-ros train --steps 10 --dataset-root data/x', '--output-dir'),
    ('act-ros train ... --resume', '--output-dir'),
    ('act-ros evaluate --checkpoint m --mode sideways', 'sideways'),
    ('act-ros no-such-command', 'no command'),
    ('make demo DEMO_ARGS="--no-such-option"', 'no-such-option'),
    ('make no-such-target', 'no target'),
    ('ros2 launch act_ros act.launch.py model:=x', "'model:=x'"),
    ('accelerate launch --num_processes 2 -m act_ros.training.train --preset sim', '--output-dir'),
    ('python -m research.pose_probe sideways --checkpoint m', 'sideways'),
])
def test_incomplete_commands_fail(command, problem):
    """The checks catch what they are for: a missing required option, an unknown command,
    option or value, a launch argument the file does not declare."""
    with pytest.raises(AssertionError, match=re.escape(problem)):
        check_command(command)


def test_blocks_are_read_whole():
    text = ('x\n```bash\nact-ros train --preset sim \\\n    --output-dir o  # c\n'
            'make demo && make test\n```\n```\nnot shell\n```\n')
    assert shell_commands(text) == ['act-ros train --preset sim --output-dir o', 'make demo',
                                    'make test']


# ros2 (verb, sub-verb) -> what stands for it without a ROS install (on the same page).
ROS2_STAND_INS = {
    ('service', 'call'): 'act-ros call',
    ('topic', 'list'): 'act-ros topics',
    ('topic', 'hz'): 'act-ros hz',
    ('pkg', 'prefix'): 'act-ros share-dir',
    ('param', 'describe'): 'act_node --help',
}
ROS_INSTALL_ONLY = ('launch', 'run')
INLINE_CODE = re.compile(r'`([^`\n]+)`')
ROS2_VERB = re.compile(r'\bros2 (\w+)(?: (\w+))?')


def code_texts(text: str) -> list[str]:
    """The code of a page as written (substitutions kept): each command line of its shell
    blocks (continuations joined) and each inline code span outside blocks."""
    texts = []
    for kind, body in page_parts(text):
        texts += body.splitlines() if kind == 'shell' else INLINE_CODE.findall(body)
    return texts


def ros2_commands(texts: list[str]) -> list[tuple[str, str]]:
    """The ``ros2 (verb, sub-verb)`` pairs in ``texts`` outside ``ros2 launch``/``run``."""
    found = []
    for code in texts:
        if re.match(rf'^\s*ros2 ({"|".join(ROS_INSTALL_ONLY)})\b', code):
            continue  # a ROS install's command, its substitutions too
        found += [(verb, sub) for verb, sub in ROS2_VERB.findall(code)
                  if verb not in ROS_INSTALL_ONLY]
    return found


def test_every_ros2_command_shown_has_its_stand_in_on_the_page():
    missing = []
    for page in pages():
        texts = code_texts(page.read_text())
        for verb, sub in ros2_commands(texts):
            stand_in = ROS2_STAND_INS.get((verb, sub))
            if stand_in is None:
                missing.append(f'{page.name}: ros2 {verb} {sub}: no stand-in known (add one '
                               'to ROS2_STAND_INS and show it on the page)')
            elif not any(stand_in in code for code in texts):
                missing.append(f'{page.name}: ros2 {verb} {sub} without `{stand_in}` beside it')
    assert not missing, '\n'.join(missing)


def test_a_ros2_command_without_its_stand_in_is_caught():
    text = ('Check with `ros2 topic hz /x`.\n```bash\nros2 launch act_ros act.launch.py '
            'model_path:=$(ros2 pkg prefix act_ros)/m\nros2 service call /a/b x/srv/Y\n'
            'act-ros call /a/b\n```\n')
    texts = code_texts(text)
    assert ros2_commands(texts) == [('topic', 'hz'), ('service', 'call')]
    assert any('act-ros call' in t for t in texts)
    assert not any('act-ros hz' in t for t in texts)


SHARE_PATH = re.compile(r'\$\((?:act-ros share-dir|ros2 pkg prefix act_ros)\)'
                        r'(?:/share/act_ros)?(?:/([\w./-]+))?')


def test_package_paths_shown_exist():
    """``act-ros share-dir`` runs and every path a page builds on it, or on ``ros2 pkg
    prefix act_ros``, is a file of the package there."""
    proc = subprocess.run([sys.executable, '-m', 'act_ros.cli', 'share-dir'],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    share = Path(proc.stdout.strip())
    shown = {(page.name, m) for page in pages() for m in SHARE_PATH.findall(page.read_text())
             if m}
    assert any(m.startswith('config/fastdds') for _, m in shown), shown
    absent = sorted(f'{page}: {m}' for page, m in shown if not (share / m).exists())
    assert not absent, f'not in {share}: {absent}'


def test_the_recorder_started_as_shown_answers_each_call_shown(tmp_path, ros_domain_id):
    """The pip setup's recording session on each page: ``act-ros record`` as shown (its
    output folder moved to a temporary one), then every ``act-ros call`` shown, as shown."""
    import os

    sessions = {}
    for page, command in COMMANDS:
        tokens = shlex.split(command)
        if tokens[:2] in (['act-ros', 'record'], ['act-ros', 'call']):
            sessions.setdefault(page, []).append(tokens)
    sessions = {page: c for page, c in sessions.items() if c[0][1] == 'record'
                and any(t[1] == 'call' for t in c)}
    assert 'docs/deployment.md' in sessions, 'deployment.md shows no recording session'
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
    for page, commands in sessions.items():
        record = [re.sub(r'^output:=.*', f'output:={tmp_path / "demos"}', t)
                  for t in commands[0]]
        log = tmp_path / 'record.log'
        with log.open('w') as out:
            recorder = subprocess.Popen([sys.executable, '-m', 'act_ros.cli', *record[1:]],
                                        stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 180
            while 'recording to' not in log.read_text() and recorder.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            assert 'recording to' in log.read_text(), log.read_text()[-3000:]
            for call in (t for t in commands if t[1] == 'call'):
                proc = subprocess.run([sys.executable, '-m', 'act_ros.cli', *call[1:]],
                                      capture_output=True, text=True, timeout=120, env=env,
                                      check=False)
                # Answered (success or not: no camera streams here), not missing.
                assert proc.returncode in (0, 1) and proc.stdout.startswith('success: '), \
                    f'{page}: {shlex.join(call)}: exit {proc.returncode}: {proc.stderr[-1000:]}'
        finally:
            recorder.terminate()
            recorder.wait(timeout=60)
