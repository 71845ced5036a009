"""The model in a process of its own, for ``execution='process'``.

In a ROS node the executor's Python threads (message deserialization, conversion,
timers) and an inference thread share one interpreter lock: every one of the thousands
of small PyTorch operator calls in an ACT forward pass waits for the lock while a
callback holds it. On a small CPU that made inference about 3x slower inside the node
than alone. :class:`RemotePredictor` moves the :class:`~act_ros.core.inference.predictor.ChunkPredictor`
into a child process and talks to it over a socket pair: the observation (uint8 images,
joint state and, for a checkpoint that takes them, the object poses) goes in, the
postprocessed ``(T, J)`` chunk comes back. The parent keeps scheduling, queueing and
ensembling, so the results are identical to in-process execution.

The child is a fresh interpreter (no forked threads or middleware state) that runs
:func:`child_main` and imports only what the model needs: unlike multiprocessing's
``spawn``, it does not import the parent's ``__main__`` module again (for ``act_node``
that was rclpy and every message package, seconds of start-up for nothing). It ends when
told to, when its socket closes, and when its parent process is gone. With an ONNX
backend and a valid export it computes from the export without importing torch or
LeRobot (:mod:`act_ros.core.inference.onnx_predictor`); otherwise it loads the checkpoint fully.
``RemotePredictor(spec, wait=False)`` returns while the child loads; its 'ready' reply
carries the moments of the child's start-up (:mod:`act_ros.core.startup`).

Faults are contained: a chunk that does not come back within ``predict_timeout_s`` means
a hung child, which is killed; a child that died (killed, crashed) is started again on a
later request, after a back-off that doubles from ``RESTART_BACKOFF_S`` up to
``MAX_RESTART_BACKOFF_S`` while restarts keep failing and resets after a good chunk. In
between every request fails fast with :class:`InferenceProcessError`, so the node sends
nothing and reports the error, then recovers by itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.contract import Contract
from act_ros.core.inference.latency_split import ChunkTiming
from act_ros.core.inference.shared_frames import SharedFrames, is_reference
from act_ros.core.observation import Observation

START_TIMEOUT_S = 900.0  # loading + warm-up, compile included
PREDICT_TIMEOUT_S = 30.0  # one chunk; far above any model the node can run in real time
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0
# On the child's command line: how tools (the fault benchmark, tests) recognise it.
CHILD_MARKER = '--act-ros-inference-child'
PARENT_POLL_S = 1.0  # how often the child checks that its parent still exists


@dataclass(frozen=True)
class ProcessSpec:
    """Everything the child needs to build the same predictor as the parent would."""

    model_path: str
    contract: Contract
    device: str
    options: Any  # PredictorOptions (picklable dataclass)
    torch_threads: int | None
    warmup_iterations: int  # 0 = no warm-up
    # act_ros.core.inference.precision.PrecisionPlan: how the precision is settled after the warm-up
    # (precision auto's check of bf16 against fp32); None: options.precision as it is.
    precision_plan: Any = None
    nice: int = 0  # added to the child's niceness at start (os.nice)


class InferenceProcessError(RuntimeError):
    """The inference process failed to start, died, or raised while computing a chunk."""


class RemotePredictor:
    """``predict(observation) -> (T, J) chunk`` computed in a child process.

    ``predict`` blocks the calling thread on the socket (without holding the interpreter
    lock) and is meant to be called from the runtime's worker thread; requests from
    several threads (a model-only timing beside it) take turns. See the module docstring
    for hangs and restarts.
    """

    def __init__(self, spec: ProcessSpec, timeout_s: float = START_TIMEOUT_S, *,
                 predict_timeout_s: float = PREDICT_TIMEOUT_S,
                 restart_backoff_s: float = RESTART_BACKOFF_S, wait: bool = True) -> None:
        """Start the child; with ``wait`` (default) block until its model is ready, else
        return at once and let :meth:`wait_ready` (or the first request) wait for it, so
        the caller sets itself up while the child imports, loads and warms up."""
        self.spec = spec
        self.start_timeout_s = timeout_s
        self.predict_timeout_s = predict_timeout_s
        self.restart_backoff_s = restart_backoff_s
        self.restarts = 0
        self.last_failure = ''
        self._backoff_s = restart_backoff_s
        self._retry_at: float | None = None  # monotonic time of the next restart, once dead
        self._closed = False
        self._process = None
        self._ready: dict[str, Any] | None = None
        # What the first start reported (the child's start-up moments and figures).
        self.warmup_s = 0.0
        self.compile_seconds = 0.0
        self.backend_name = ''
        self.device = spec.device
        self.backend_cache = 'none'
        self.lean = False  # the child computes from the ONNX export without torch
        self.child_imported: list[str] = []  # of torch, lerobot, torchvision: those loaded
        self.startup_events: dict[str, float] = {}
        self.precision_check = None  # act_ros.core.inference.precision.PrecisionCheck, once ready
        # act_ros.core.inference.latency_split.ChunkTiming of the last chunk (parent's and child's
        # moments on the shared monotonic clock).
        self.last_split = None
        self._request_lock = threading.Lock()
        # The camera frames of each request, through shared memory (None: the socket).
        self._frames = SharedFrames.create()
        self._launch()
        if wait:
            self.wait_ready()

    def _launch(self) -> None:
        """Start the child process; it reports 'ready' (or 'error') when it has loaded."""
        self._ready = None
        self.launched_at = time.monotonic()
        self._process, self._conn = _ChildProcess.start(
            self.spec, self._frames.fd if self._frames is not None else None)
        self.pid = self._process.pid

    def wait_ready(self) -> None:
        """Block until the child has loaded and warmed up the model (no-op once it has).

        Raises :class:`InferenceProcessError` with the child's reason when it failed to
        start, gave no answer within the start timeout, or died meanwhile.
        """
        if self._ready is not None:
            return
        if self._closed or self._process is None:
            raise InferenceProcessError('inference process is not running'
                                        + (f': {self.last_failure}' if self.last_failure else ''))
        reply = self._receive(self.start_timeout_s, 'start-up (checkpoint loading and warm-up)')
        if reply[0] == 'error':
            self._stop_process()
            raise InferenceProcessError(f'inference process failed to start: {reply[1]}')
        info = reply[1]
        self._ready = info
        if not self.startup_events:  # the first start: what the start-up report shows
            self.warmup_s, self.compile_seconds = info['warmup_s'], info['compile_seconds']
            self.backend_name, self.device = info['backend'], info['device']
            self.backend_cache = info['backend_cache']
            self.lean, self.child_imported = info['lean'], info['imported']
            self.startup_events = {**info['events'], 'ready': time.monotonic()}
            self.precision_check = info['precision']
            if self.precision_check is not None and self.spec.precision_plan is not None \
                    and not self.precision_check.pending:
                # A restarted child builds what this one settled on, without a new check.
                self.spec = replace(self.spec, precision_plan=None, options=replace(
                    self.spec.options, precision=self.precision_check.precision))

    @property
    def ready(self) -> bool:
        """Whether the child reported its model ready (and was not restarted since)."""
        return self._ready is not None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def predict(self, obs: Observation) -> np.ndarray:
        if self._closed:
            raise InferenceProcessError('inference process is closed')
        if self._process is None:
            self._restart_if_due()
        self.wait_ready()  # a child started without waiting: its first request waits here
        reply, sent, back = self._request(('predict', obs.images, obs.state,
                                           obs.environment_state), 'a chunk')
        self._backoff_s = self.restart_backoff_s  # a good chunk: the next failure starts anew
        _, chunk, timing = reply
        self.last_split = ChunkTiming.from_child(sent, back, timing)
        return chunk

    def model_times(self, obs: Observation, iterations: int) -> list[float]:
        """Seconds of ``iterations`` calls of the child's model alone (its backend,
        precision and threads) on ``obs``, preprocessed once there."""
        if self._closed:
            raise InferenceProcessError('inference process is closed')
        if self._process is None:
            self._restart_if_due()
        self.wait_ready()
        reply, _, _ = self._request(('model_times', obs.images, obs.state,
                                     obs.environment_state, int(iterations)), 'model-only timing')
        return list(reply[1])

    def settle(self, plan: Any, observations: list[Observation]) -> Any:
        """Run a pending precision check in the child on ``observations`` with ``plan``
        (:func:`act_ros.core.inference.precision.settle`); returns the settled check, and a
        restarted child builds that precision. Raises
        :class:`~act_ros.core.errors.PrecisionRefusedError` when a precision set by name
        drifts (the child keeps fp32)."""
        from act_ros.core.errors import PrecisionRefusedError

        self.wait_ready()
        with self._request_lock:
            try:
                self._conn.send(('settle', plan, observations))
            except (BrokenPipeError, OSError) as exc:
                raise self._failed(self._death_message()) from exc
            # Building the candidate is a start-up step: it gets the start-up's time.
            reply = self._receive(self.start_timeout_s, 'the precision check')
        if reply[0] == 'refused':
            refused = PrecisionRefusedError(reply[1])
            refused.values = reply[2]
            raise refused
        if reply[0] == 'error':
            raise InferenceProcessError(reply[1])
        self.precision_check = reply[1]
        self.spec = replace(self.spec, precision_plan=None, options=replace(
            self.spec.options, precision=self.precision_check.precision))
        return self.precision_check

    def _request(self, message: tuple, what: str) -> tuple[tuple, float, float]:
        """Send ``message`` and take its reply, one request at a time (the runtime's worker
        and a model-only timing may ask from two threads); also the monotonic moments
        of the send and of the reply's arrival. Its images (``message[1]``) go through
        the shared frame region where there is one: the copy counts as transfer."""
        with self._request_lock:
            sent = time.monotonic()
            images = message[1]
            if self._frames is not None and SharedFrames.packable(images):
                message = (message[0], self._frames.pack(images), *message[2:])
            try:
                self._conn.send(message)
            except (BrokenPipeError, OSError) as exc:
                raise self._failed(self._death_message()) from exc
            reply = self._receive(self.predict_timeout_s, what)
            back = time.monotonic()
        if reply[0] == 'error':
            raise InferenceProcessError(reply[1])
        return reply, sent, back

    def _restart_if_due(self) -> None:
        now = time.monotonic()
        if self._retry_at is not None and now < self._retry_at:
            raise InferenceProcessError(f'{self.last_failure}; restarting the inference process '
                                        f'in {self._retry_at - now:.1f} s')
        try:
            self._launch()
            self.wait_ready()
        except InferenceProcessError as exc:
            raise self._failed(str(exc)) from None
        self.restarts += 1
        self._retry_at = None

    def _failed(self, why: str) -> InferenceProcessError:
        """The child is gone or useless: stop it and schedule a restart after the back-off."""
        self._stop_process(timeout_s=1.0)
        self.last_failure = why
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, MAX_RESTART_BACKOFF_S)
        return InferenceProcessError(why)

    def close(self, timeout_s: float = 10.0) -> None:
        self._closed = True
        self._stop_process(timeout_s)
        with self._request_lock:  # no request is writing frames now
            if self._frames is not None:
                self._frames.close()
                self._frames = None

    def _stop_process(self, timeout_s: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            self._conn.send(('stop',))
        except (BrokenPipeError, OSError):
            pass
        process.join(timeout_s)
        if process.is_alive():
            process.kill()  # a hung child may not react to anything milder
            process.join(5.0)
        self._conn.close()

    def _receive(self, timeout_s: float | None, what: str) -> tuple:
        if timeout_s is not None and not self._conn.poll(timeout_s):
            raise self._failed(f'inference process gave no answer for {what} within '
                               f'{timeout_s:.0f} s (hung: killed)')
        try:
            return self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._failed(self._death_message()) from exc

    def _death_message(self) -> str:
        process = self._process
        code = None if process is None else process.exitcode
        if process is not None and code is None:
            process.join(0.5)
            code = process.exitcode
        return f'inference process ended unexpectedly (exit code {code})'


class _ChildProcess:
    """The inference child: a ``python -c`` interpreter running :func:`child_main`,
    connected by a socket pair (a :class:`~multiprocessing.connection.Connection` on
    both ends). ``is_alive``/``exitcode``/``join``/``kill`` as on a multiprocessing
    process (a negative exit code is the signal that ended it)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid

    @classmethod
    def start(cls, spec: ProcessSpec, frames_fd: int | None = None
              ) -> tuple[_ChildProcess, Connection]:
        """Start a child on ``spec``; ``frames_fd``: the shared frame region it maps."""
        ours, theirs = socket.socketpair()
        try:
            fd = theirs.fileno()
            code = (f'from act_ros.core.inference.inference_process import child_main; '
                    f'child_main({fd}, {os.getpid()}, {frames_fd})')
            env = dict(os.environ)
            # The child imports this very act_ros, wherever it was imported from.
            package_root = str(Path(__file__).resolve().parents[2])
            env['PYTHONPATH'] = os.pathsep.join(
                [package_root, *filter(None, [env.get('PYTHONPATH')])])
            popen = subprocess.Popen([sys.executable, '-c', code, CHILD_MARKER],
                                     stdin=subprocess.DEVNULL, env=env,
                                     pass_fds=(fd,) if frames_fd is None else (fd, frames_fd),
                                     close_fds=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send(('spec', spec))
        except (BrokenPipeError, OSError):
            pass  # the child died at once: the start-up reply reports it
        except BaseException:  # e.g. a spec that cannot be pickled: no child left waiting
            popen.kill()
            popen.wait()
            conn.close()
            raise
        return cls(popen), conn

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        try:
            self._popen.kill()
        except ProcessLookupError:
            pass


def child_main(fd: int, parent_pid: int, frames_fd: int | None = None) -> None:
    """Entry point of the inference child (see :class:`_ChildProcess`): take the spec
    from the parent, then serve it until told to stop or the parent is gone;
    ``frames_fd``: the parent's shared frame region (:mod:`act_ros.core.inference.shared_frames`)."""
    running_at = time.monotonic()
    # Ctrl-C reaches the whole process group: the parent handles it and stops this child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    _exit_with_parent(parent_pid)
    try:
        message = conn.recv()
    except (EOFError, OSError):
        return  # parent gone before it sent anything
    if not (isinstance(message, tuple) and len(message) == 2 and message[0] == 'spec'):
        conn.send(('error', f"expected ('spec', ProcessSpec) first, got {message!r:.200}"))
        return
    frames = SharedFrames.attach(frames_fd) if frames_fd is not None else None
    _child_main(conn, message[1], running_at, frames)


def _exit_with_parent(parent_pid: int) -> None:
    """End this process soon after ``parent_pid`` is gone (a killed node must not leave
    its model running, even in the middle of loading it)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(PARENT_POLL_S)

    threading.Thread(target=watch, name='act-ros-parent-watch', daemon=True).start()


def _child_main(conn: Connection, spec: ProcessSpec, running_at: float | None = None,
                frames: SharedFrames | None = None) -> None:
    """Child: build the predictor, report ready, then answer requests until 'stop'."""
    if spec.nice:
        os.nice(spec.nice)  # before any thread pool starts: every thread inherits it
    events = {'child_running': time.monotonic() if running_at is None else running_at}
    try:
        predictor = _build_predictor(spec, events)
        warmup_s = predictor.warmup(spec.warmup_iterations) if spec.warmup_iterations else 0.0
        check = None
        if spec.precision_plan is not None:
            from act_ros.core.inference.precision import settle
            check = settle(predictor, spec.precision_plan, spec.contract.lower,
                           spec.contract.upper, checkpoint_dir=spec.model_path)
        events['warmed_up'] = time.monotonic()
        backend = predictor.backend
        conn.send(('ready', {
            'warmup_s': warmup_s, 'compile_seconds': predictor.compile_seconds,
            'backend': backend.name if backend is not None else 'torch',
            'device': str(predictor.device), 'events': events,
            # ONNX backends: export (and compiled model) reused ('hit') or made ('miss').
            'backend_cache': 'none' if backend is None else backend.cache_note,
            'lean': getattr(predictor, 'lean', False),  # onnx_predictor: no torch model
            'precision': check,
            'imported': sorted(name for name in ('torch', 'lerobot', 'torchvision')
                               if name in sys.modules)}))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(('error', _describe(exc)))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # parent gone
        received = time.monotonic()
        if message[0] == 'stop':
            return
        if message[0] == 'settle':
            conn.send(_settle(predictor, spec, *message[1:]))
            continue
        kind, images, state, environment_state, *rest = message
        try:
            if is_reference(images):
                if frames is None:
                    raise ValueError('a shared-frame request, but no shared frame region')
                images = frames.unpack(images)
            obs = Observation(images=images, state=state, environment_state=environment_state)
            if kind == 'model_times':
                conn.send(('model_times', predictor.model_times(obs, rest[0])))
                continue
            chunk = predictor.predict(obs)
            timing = {**predictor.last_timing, 'received': received}
            timing['replied'] = time.monotonic()
            conn.send(('chunk', chunk, timing))
        except Exception as exc:  # noqa: BLE001 - reported per request, the process lives on
            conn.send(('error', _describe(exc)))


def _settle(predictor: Any, spec: ProcessSpec, plan: Any,
            observations: list[Observation]) -> tuple:
    """The child's answer to a pending precision check: ('settled', check), or
    ('refused', line, values) for a precision set by name that drifts."""
    from act_ros.core.errors import PrecisionRefusedError
    from act_ros.core.inference.precision import settle

    try:
        return ('settled', settle(predictor, plan, spec.contract.lower, spec.contract.upper,
                                  observations=observations))
    except PrecisionRefusedError as exc:
        return ('refused', str(exc), getattr(exc, 'values', {}))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, the child lives on
        return ('error', _describe(exc))


def _build_predictor(spec: ProcessSpec, events: dict[str, float] | None = None):
    """The child's :class:`~act_ros.core.inference.predictor.ChunkPredictor`; ``events`` receives
    the moments its imports, the checkpoint load and the backend build finished."""
    events = {} if events is None else events
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    if spec.options.backend != 'torch':
        # The export alone computes chunks: no torch or LeRobot, when it is valid.
        from act_ros.core.inference.onnx_predictor import lean_onnx_predictor

        lean, why = lean_onnx_predictor(spec.model_path, spec.contract, spec.options, events)
        if lean is not None:
            return lean
        print(f'[act_ros inference] loading the model with torch and LeRobot: {why}',
              file=sys.stderr, flush=True)
    import torch

    from act_ros.core.device import select_device
    from act_ros.core.inference.checkpoint import import_lerobot, load_checkpoint
    from act_ros.core.inference.predictor import ChunkPredictor

    import_lerobot()  # here, not inside the load: the import is a phase of its own
    if spec.options.backend != 'torch':
        from act_ros.core.inference.backends import import_backend
        import_backend(spec.options.backend)
    events['model_imported'] = time.monotonic()
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    device = select_device(spec.device)
    checkpoint = load_checkpoint(Path(spec.model_path), contract=spec.contract, device=str(device))
    events['checkpoint_loaded'] = time.monotonic()
    predictor = ChunkPredictor(checkpoint, spec.contract, device, spec.options)
    events['backend_built'] = time.monotonic()
    return predictor


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f' (at {Path(last[0].filename).name}:{last[0].lineno})' if last else ''
    return f'{type(exc).__name__}: {exc}{where}'
