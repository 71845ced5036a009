"""The model in a process of its own, for ``execution='process'``.

In a ROS node the executor's Python threads (message deserialization, conversion,
timers) and an inference thread share one interpreter lock: every one of the thousands
of small PyTorch operator calls in an ACT forward pass waits for the lock while a
callback holds it. On a small CPU that made inference about 3x slower inside the node
than alone. :class:`RemotePredictor` moves the :class:`~act_ros.core.inference.ChunkPredictor`
into a child process (``spawn``: no forked threads or middleware state) and talks to it
over a pipe: the observation (uint8 images + joint state) goes in, the postprocessed
``(T, J)`` chunk comes back. The parent keeps scheduling, queueing and ensembling, so
the results are identical to in-process execution.

Faults are contained: a chunk that does not come back within ``predict_timeout_s`` means
a hung child, which is killed; a child that died (killed, crashed) is started again on a
later request, after a back-off that doubles from ``RESTART_BACKOFF_S`` up to
``MAX_RESTART_BACKOFF_S`` while restarts keep failing and resets after a good chunk. In
between every request fails fast with :class:`InferenceProcessError`, so the node sends
nothing and reports the error, then recovers by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
import multiprocessing as mp
from multiprocessing.connection import Connection
import os
from pathlib import Path
import time
import traceback
from typing import Any

import numpy as np

from act_ros.core.contract import Contract
from act_ros.core.observation import Observation

START_TIMEOUT_S = 900.0  # loading + warm-up, compile included
PREDICT_TIMEOUT_S = 30.0  # one chunk; far above any model the node can run in real time
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0


@dataclass(frozen=True)
class ProcessSpec:
    """Everything the child needs to build the same predictor as the parent would."""

    model_path: str
    contract: Contract
    device: str
    options: Any  # PredictorOptions (picklable dataclass)
    torch_threads: int | None
    warmup_iterations: int  # 0 = no warm-up


class InferenceProcessError(RuntimeError):
    """The inference process failed to start, died, or raised while computing a chunk."""


class RemotePredictor:
    """``predict(observation) -> (T, J) chunk`` computed in a child process.

    ``predict`` blocks the calling thread on the pipe (without holding the interpreter
    lock) and is meant to be called from the runtime's worker thread; it is not safe to
    call from several threads at once. See the module docstring for hangs and restarts.
    """

    def __init__(self, spec: ProcessSpec, timeout_s: float = START_TIMEOUT_S, *,
                 predict_timeout_s: float = PREDICT_TIMEOUT_S,
                 restart_backoff_s: float = RESTART_BACKOFF_S) -> None:
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
        self._start()
        _, self.warmup_s, self.compile_seconds, self.backend_name = self._ready

    def _start(self) -> None:
        ctx = mp.get_context('spawn')
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self._process = ctx.Process(target=_child_main, args=(child_conn, self.spec),
                                    name='act-ros-inference', daemon=True)
        self._process.start()
        child_conn.close()
        self.pid = self._process.pid
        reply = self._receive(self.start_timeout_s, 'start-up (checkpoint loading and warm-up)')
        if reply[0] == 'error':
            self._stop_process()
            raise InferenceProcessError(f'inference process failed to start: {reply[1]}')
        self._ready = reply

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def predict(self, obs: Observation) -> np.ndarray:
        if self._closed:
            raise InferenceProcessError('inference process is closed')
        if self._process is None:
            self._restart_if_due()
        try:
            self._conn.send(('predict', obs.images, obs.state))
        except (BrokenPipeError, OSError) as exc:
            raise self._failed(self._death_message()) from exc
        reply = self._receive(self.predict_timeout_s, 'a chunk')
        if reply[0] == 'error':
            raise InferenceProcessError(reply[1])
        self._backoff_s = self.restart_backoff_s  # a good chunk: the next failure starts anew
        return reply[1]

    def _restart_if_due(self) -> None:
        now = time.monotonic()
        if self._retry_at is not None and now < self._retry_at:
            raise InferenceProcessError(f'{self.last_failure}; restarting the inference process '
                                        f'in {self._retry_at - now:.1f} s')
        try:
            self._start()
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


def _child_main(conn: Connection, spec: ProcessSpec) -> None:
    """Child: build the predictor, report ready, then answer requests until 'stop'."""
    try:
        predictor = _build_predictor(spec)
        warmup_s = predictor.warmup(spec.warmup_iterations) if spec.warmup_iterations else 0.0
        backend = predictor.backend.name if predictor.backend is not None else 'torch'
        conn.send(('ready', warmup_s, predictor.compile_seconds, backend))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(('error', _describe(exc)))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # parent gone
        if message[0] == 'stop':
            return
        _, images, state = message
        try:
            chunk = predictor.predict(Observation(images=images, state=state))
            conn.send(('chunk', chunk))
        except Exception as exc:  # noqa: BLE001 - reported per request, the process lives on
            conn.send(('error', _describe(exc)))


def _build_predictor(spec: ProcessSpec):
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import torch

    from act_ros.core.checkpoint import load_checkpoint
    from act_ros.core.device import select_device
    from act_ros.core.inference import ChunkPredictor

    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    device = select_device(spec.device)
    checkpoint = load_checkpoint(Path(spec.model_path), contract=spec.contract, device=str(device))
    return ChunkPredictor(checkpoint, spec.contract, device, spec.options)


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f' (at {Path(last[0].filename).name}:{last[0].lineno})' if last else ''
    return f'{type(exc).__name__}: {exc}{where}'
