"""Child processes that are never left behind: one helper for every tool that starts them.

The over-ROS evaluation, the demo's stages and the benchmarks start their children with
:class:`ProcessSet`. Every child runs in a process group of its own (so a terminal's
Ctrl-C reaches only the parent, which then stops the children in order) and, on Linux,
is told by the kernel to terminate if the parent dies without cleaning up
(``PR_SET_PDEATHSIG``). Stopping a child sends SIGINT to its group (rclpy and the
trainer shut down cleanly), then SIGTERM, then SIGKILL; descendants that left the group
(found with ``psutil`` before the first signal) are killed at the end as well.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil


class ChildExitedError(RuntimeError):
    """A child process exited when it should be running."""


def _load_libc():  # noqa: ANN202 - a ctypes library or None
    if not sys.platform.startswith('linux'):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()
_PR_SET_PDEATHSIG = 1
if _LIBC is not None:
    _LIBC.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    _LIBC.signal.restype = ctypes.c_void_p


def child_setup() -> None:  # runs in the child between fork and exec: syscalls only
    """The child gets SIGTERM when this process dies, and SIGINT back at its default.

    A shell without job control starts background commands (``make test &``, ``nohup``)
    with SIGINT ignored, and an ignored disposition survives ``exec``: Python then
    installs no KeyboardInterrupt handler, and the child would sit through the SIGINT
    that :meth:`ProcessSet.stop_all` sends first (seen: an evaluation driver that kept
    running episodes after Ctrl-C). Every child here is stopped with SIGINT, so each one
    starts with SIGINT at its default, as a foreground job does.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        _LIBC.signal(int(signal.SIGINT), 0)  # SIG_DFL


def die_with_parent() -> None:
    """In a worker of a ``multiprocessing`` pool (its ``initializer``): the kernel sends it
    SIGTERM when the process that started it dies, so a pool's workers never outlive a
    killed parent (a worker busy in a long task would otherwise run it to the end before
    it noticed). Linux only; a no-op elsewhere."""
    import multiprocessing

    if _LIBC is None:
        return
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the prctl
        os._exit(1)


@dataclass
class Child:
    """One started process: its name, command, log file and ``Popen``."""

    name: str
    command: list[str]
    log_path: Path
    popen: subprocess.Popen
    log_file: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the child's output."""
        self.log_file.flush()
        try:
            text = self.log_path.read_text(errors='replace')
        except OSError as exc:
            return f'(log {self.log_path} unreadable: {exc})'
        return '\n'.join(text.splitlines()[-lines:])


class ProcessSet:
    """Starts children in their own process groups and stops every one of them."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = Path(log_dir)
        self.env = dict(env)
        self.children: list[Child] = []

    def start(self, name: str, command: Sequence[str], *, log: bool = True) -> Child:
        """Start ``command`` with output to ``<log_dir>/<name>.log`` (``log=False``: to
        this process's own output, for a stage the user watches)."""
        log_path = self.log_dir / f'{name}.log'
        if log:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = log_path.open('wb')
            out: dict = dict(stdout=log_file, stderr=subprocess.STDOUT)
        else:
            log_file = open(os.devnull, 'wb')  # noqa: SIM115 - closed with the child
            out = {}
        popen = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, env=self.env,
                                 process_group=0, preexec_fn=child_setup, **out)
        child = Child(name, list(command), log_path, popen, log_file)
        self.children.append(child)
        return child

    def wait(self, child: Child, timeout_s: float | None = None) -> int:
        """The child's exit code; :class:`ChildExitedError`-free, ``TimeoutError`` past
        ``timeout_s`` (the child is then stopped)."""
        try:
            return child.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(child)
            raise TimeoutError(f'{child.name} did not finish within {timeout_s:.0f} s; '
                               'stopped') from None

    def check(self) -> None:
        """Raise :class:`ChildExitedError` if a child has exited (with its log tail)."""
        for child in self.children:
            code = child.popen.poll()
            if code is not None:
                raise ChildExitedError(
                    f'{child.name} (pid {child.pid}) exited with code {code}; last lines of '
                    f'{child.log_path}:\n{child.log_tail()}')

    def stop(self, child: Child, grace_s: float = 5.0) -> int | None:
        """Stop one child and everything in its process group; return its exit code."""
        self._stop([child], grace_s)
        return child.popen.returncode

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop every child at once: SIGINT, then SIGTERM, then SIGKILL to each group."""
        self._stop(list(self.children), grace_s)

    def _stop(self, children: list[Child], grace_s: float) -> None:
        descendants = []
        for child in children:
            try:
                descendants += psutil.Process(child.pid).children(recursive=True)
            except psutil.Error:
                pass
        for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 3.0),
                            (signal.SIGKILL, 3.0)):
            running = [c for c in children if c.running()]
            for child in running:
                _signal_group(child.pid, sig)
            deadline = time.monotonic() + wait_s
            for child in running:
                try:
                    child.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    pass
        for child in children:
            _signal_group(child.pid, signal.SIGKILL)  # anything the child left in its group
            child.log_file.close()
            if child in self.children:
                self.children.remove(child)
        for process in descendants:  # and what left the group (setsid, own groups)
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(descendants, timeout=3.0)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while cleanup runs (main thread only); re-raised after.

    A second Ctrl-C during cleanup must not leave the children it was stopping behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if received:
            signal.raise_signal(received[0])


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:  # the group id was reused by someone else's process
        pass


def wait_gone(pids: Sequence[int], timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` exists; return those still there after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _exists(pid)]
        if alive:
            time.sleep(0.05)
    return alive


def _exists(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


_OWN_DATASETS_CACHE = 'ACT_ROS_STAGE_DATASETS_CACHE'  # the cache stage_environment made


@contextlib.contextmanager
def stage_environment() -> Iterator[dict[str, str]]:
    """This process's environment for a stage's child, with a datasets cache of its own.

    LeRobot reads a dataset's parquet files with ``datasets.Dataset.from_parquet``, which
    writes an Arrow copy of them into ``HF_DATASETS_CACHE`` (``~/.cache/huggingface/datasets``
    by default) and never removes it: every dataset a DAgger iteration writes leaves gigabytes
    there, enough to fill a disk within one recipe. Unless the user chose a cache
    (``HF_DATASETS_CACHE`` set), the child gets a temporary one, removed when it has exited.
    """
    import shutil
    import tempfile

    env = os.environ.copy()
    if 'HF_DATASETS_CACHE' in env and env.get(_OWN_DATASETS_CACHE) != env['HF_DATASETS_CACHE']:
        yield env  # the user's
        return
    # A stage's own children (DAgger's collections and trainings) get one each in turn.
    cache = tempfile.mkdtemp(prefix='act_ros_datasets_cache_')
    env['HF_DATASETS_CACHE'] = env[_OWN_DATASETS_CACHE] = cache
    try:
        yield env
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run_stage(command: Sequence[str], **popen_kwargs: object) -> int:
    """Run one stage of a longer command (a recipe's stage, a DAgger iteration's training)
    to its end and return its exit status; a stop request reaches the stage.

    The stage runs in a process group of its own (:func:`child_setup`: it also gets SIGTERM
    if this process dies). A SIGINT or SIGTERM sent to this process, or a terminal's Ctrl-C,
    is passed on to the stage's group as SIGINT, a second one as SIGTERM, a third as
    SIGKILL: every stage stops cleanly on SIGINT (the trainers save a checkpoint, a
    collection writes no half dataset) and the trainers stop at once at a second signal.
    When the stage has exited after such a signal, ``KeyboardInterrupt`` is raised, so the
    caller records what it has and says how to continue. Off the main thread no handler can
    be installed and signals are not passed on.
    """
    popen_kwargs.setdefault('stdin', subprocess.DEVNULL)
    escalation = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
    received: list[int] = []
    procs: list[subprocess.Popen] = []
    # The stage's descendants that left its group (found at the first signal) get SIGKILL
    # with it at the third: a training inside a DAgger stage has a group of its own.
    strays: list[psutil.Process] = []

    def send(sig: signal.Signals) -> None:
        proc = procs[0]
        if proc.poll() is not None:
            return
        if not strays:
            with contextlib.suppress(psutil.Error):
                strays.extend(psutil.Process(proc.pid).children(recursive=True))
        _signal_group(proc.pid, sig)
        if sig == signal.SIGKILL:
            for child in strays:
                with contextlib.suppress(psutil.Error):
                    child.kill()

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if procs:  # a signal before the stage started is passed on once it has
            send(escalation[min(len(received), 3) - 1])

    # The handlers go in before the stage starts, so that no signal falls between the two.
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        procs.append(subprocess.Popen(list(command), process_group=0, preexec_fn=child_setup,
                                      **popen_kwargs))  # type: ignore[call-overload]
        if received:
            send(signal.SIGINT)
        code = procs[0].wait()
    finally:
        for sig, handler in previous.items():
            # None: a handler set outside Python; it cannot be put back, the default can.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if procs and procs[0].poll() is None:  # an error in this process: the stage goes
            _signal_group(procs[0].pid, signal.SIGTERM)
            try:
                procs[0].wait(timeout=30.0)
            except subprocess.TimeoutExpired:
                _signal_group(procs[0].pid, signal.SIGKILL)
                procs[0].wait()
    if received:
        raise KeyboardInterrupt(f'stopped by signal {received[0]}; the stage exited with {code}')
    return code


class StopRequests:
    """Stop signals to a run that saves before it stops: the first asks for a stop after
    the current step, a second one for a stop at once (``KeyboardInterrupt``).

    Signals that come within ``together_s`` of the first are one request: when a whole
    process tree is stopped at once (a service manager, a cluster's job cancel, ``kill`` of
    a group), a stage gets the signal directly and again as passed on by its parent
    (:func:`run_stage`), and must still save.
    """

    def __init__(self, together_s: float = 2.0) -> None:
        self.together_s = together_s
        self.first: str | None = None
        self._at = 0.0

    def __call__(self, signum: int) -> bool:
        """Whether this signal is the first request (the caller then asks the run to stop);
        False for one that came with it; ``KeyboardInterrupt`` for a later one."""
        now = time.monotonic()
        if self.first is None:
            self.first, self._at = signal.Signals(signum).name, now
            return True
        if now - self._at < self.together_s:
            return False
        raise KeyboardInterrupt


def run_continuable[T](prog: str, call: Callable[[], T]) -> tuple[int, T | None]:
    """Run a command whose results stay on disk (a recipe, DAgger iterations), mapping its
    end to an exit status: ``(0, result)``; a failed stage (``RuntimeError``): 1; Ctrl-C: 130,
    with the hint that the same command continues. Errors are printed as ``prog: message``."""
    try:
        return 0, call()
    except RuntimeError as exc:
        print(f'{prog}: {exc}', file=sys.stderr)
        return 1, None
    except KeyboardInterrupt:
        print(f'{prog}: interrupted; run the same command to continue', file=sys.stderr)
        return 130, None
