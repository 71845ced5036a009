"""The policy runtime shared by the ROS node, the evaluator and the benchmarks.

``PolicyRuntime(config).act(observation)`` is called once per control tick and returns
the joint-position target for that tick (or ``None`` before the first chunk exists).

Execution:

- ``sync``: the model runs inside ``act`` when needed; reproduces LeRobot's
  ``ACTPolicy.select_action`` + postprocessor exactly (chunk mode: a new chunk when the
  queue is empty; ensemble mode: a chunk every tick, blended; blend mode: a new chunk
  after :attr:`PolicyRuntime.stride` actions, crossfaded in).
- ``async``: a background worker computes chunks while the current one plays out, so
  ``act`` never waits for the model. Each chunk is aligned to the tick of the
  observation it was computed from (actions for ticks already past are dropped). Chunk
  mode requests the next chunk early enough, from the measured model latency, that it
  arrives before the queue runs dry; ensemble mode keeps the worker busy and blends every
  chunk that covers the tick, so ensembling works at any model speed.
- ``process``: ``async`` with the model in a child process
  (:mod:`act_ros.core.inference.inference_process`), so the caller's Python threads (a ROS
  executor) never compete with inference for the interpreter lock. Same results. This
  process then reads only the checkpoint's JSON (:func:`read_checkpoint_info`) and never
  imports torch, LeRobot or a backend for the runtime: the child loads the model, and
  with ``PolicyRuntime(config, wait=False)`` it does so while the caller sets itself up
  (:meth:`PolicyRuntime.wait_ready`).

``reset()`` starts a new episode: queue, ensembler and any in-flight work are dropped
(a result computed before the reset is discarded).

Modes: ``chunk`` plays ``n_action_steps`` of each chunk and switches to the next;
``ensemble`` blends every chunk covering the tick (temporal ensembling); ``blend`` plays
each chunk until the next arrives and crossfades the rest of the old plan into it over
``blend_ticks`` ticks from its arrival (:class:`~act_ros.core.inference.chunking.BlendQueue`): the
next chunk is asked for so that it lands after :attr:`PolicyRuntime.stride` actions,
``min(n_action_steps, chunk_size - blend_ticks)``, while the old chunk still has the rows
to fade from.

``current_chunk`` is the chunk being played (chunk mode) or the newest one blended
(ensemble mode), with the header stamp of the observation it came from: read without a
lock, so a low-rate viewer (``act_node``'s visualization) never waits for the tick or the
model.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from act_ros.core.contract import Contract, load_contract
from act_ros.core.inference.checkpoint_info import CheckpointInfo, read_checkpoint_info
from act_ros.core.inference.chunking import BlendQueue, ChunkQueue, TickEnsembler, TimedChunk
from act_ros.core.inference.feasibility import Latency, Verdict, verdict
from act_ros.core.inference.hub import ResolvedCheckpoint, resolve_checkpoint
from act_ros.core.inference.inference_process import ProcessSpec, RemotePredictor
from act_ros.core.inference.latency_split import ChunkTiming, SplitStats

# Torch-free: the process execution's parent never imports torch (see the docstring).
from act_ros.core.inference.options import (
    COMPILE_MODES,
    PRECISIONS,
    PredictorOptions,
    check_backend_options,
    installed_backends,
    resolve_backend,
)
from act_ros.core.inference.precision import AUTO, DEFAULT_TOLERANCE, PrecisionCheck, PrecisionPlan, settle
from act_ros.core.observation import Observation, dummy_observation, environment_state_to_array

if TYPE_CHECKING:
    import torch

    from act_ros.core.inference.checkpoint import LoadedCheckpoint
    from act_ros.core.inference.predictor import ChunkPredictor

MODES = ('chunk', 'ensemble', 'blend')
DEFAULT_BLEND_TICKS = 6  # 0.2 s at 30 Hz
LATENCY_WINDOW = 8  # chunks whose latency schedules the next request
REQUEST_MARGIN_TICKS = 2  # ticks of slack beyond the slowest recent latency
# What a live node runs; 'simulated' is for evaluations against simulated time.
LIVE_EXECUTIONS = ('async', 'process', 'sync')
EXECUTIONS = (*LIVE_EXECUTIONS, 'simulated')
# Timed model calls behind the feasibility verdict (after the warm-up): a median and a
# worst case, as few as give both (each one is a full model call at configure).
LATENCY_CALLS = 2


@dataclass
class RuntimeConfig:
    """Runtime settings; ``__post_init__`` rejects inconsistent values with a clear message."""

    # A checkpoint directory or a Hub id (act_ros.core.inference.hub), or either resolved already.
    model_path: str | Path | ResolvedCheckpoint
    device: str = 'auto'
    mode: str = 'chunk'
    execution: str = 'async'
    # Actions played from each chunk (chunk and blend modes); None: the checkpoint's own
    # n_action_steps (config.json), as LeRobot's select_action plays it.
    n_action_steps: int | None = None
    ensemble_coeff: float = 0.01
    # mode 'blend': ticks over which the rest of the old chunk is crossfaded into the new
    # one (0: switch at once, as chunk mode).
    blend_ticks: int = DEFAULT_BLEND_TICKS
    compile_model: bool = False
    compile_mode: str = 'default'
    freeze_weights: bool = True
    # fp32 | bf16 | fp16 | int8 (openvino, a model quantized by act-ros export --int8), or
    # auto (act_ros.core.inference.precision: bf16 with openvino on a CPU with native bf16, kept only
    # within precision_tolerance of fp32; fp32 elsewhere; never int8).
    precision: str = 'fp32'
    # Largest normalized action difference a reduced precision may show against fp32 on the
    # check observations: auto keeps fp32 over it, int8 (and bf16 on openvino) set by name
    # is refused (act_ros.core.inference.precision).
    precision_tolerance: float = DEFAULT_TOLERANCE
    # Without precision_check_observations.npz beside the checkpoint, leave that check
    # pending (fp32 until then) for settle_precision() on live observations (act_node, at
    # activation) instead of checking synthetic ones at start-up.
    precision_check_live: bool = False
    contract: Contract | None = None
    warmup: bool = True
    torch_threads: int | None = None  # also the thread count of a non-torch backend
    # torch | openvino | onnxruntime (CPU; act_ros.core.inference.backends), or auto: resolved at
    # construction by act_ros.core.inference.options.resolve_backend (openvino on a CPU where it is
    # installed, torch elsewhere); backend_why says how it was chosen.
    backend: str = 'torch'
    # execution 'process': a chunk not back within this time means a hung child (killed and
    # restarted, see act_ros.core.inference.inference_process).
    inference_timeout_s: float = 30.0
    # execution 'process': the child's niceness (0-19; higher yields the CPU sooner to the
    # node's own threads, which tick, receive and publish).
    inference_nice: int = 0
    # execution 'simulated' (evaluation against simulated time): the background schedule of
    # 'async', with each chunk computed at once but delivered this many ticks after its
    # request, as a model that slow would deliver it on the robot.
    simulated_latency_ticks: int = 0
    backend_why: str = field(default='', init=False)  # how backend was chosen (auto)

    def __post_init__(self) -> None:
        if not str(self.model_path):
            raise ValueError('model_path is empty: give a LeRobot pretrained_model directory '
                             'or a Hub id (org/name[@revision][/subfolder])')
        if self.mode not in MODES:
            raise ValueError(f"unknown mode '{self.mode}', expected one of {MODES}")
        if self.execution not in EXECUTIONS:
            raise ValueError(f"unknown execution '{self.execution}', expected one of {EXECUTIONS}")
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise ValueError(f'n_action_steps must be >= 1, got {self.n_action_steps}')
        if self.blend_ticks < 0:
            raise ValueError(f'blend_ticks must be >= 0, got {self.blend_ticks}')
        if not math.isfinite(self.ensemble_coeff):
            raise ValueError(f'ensemble_coeff must be finite, got {self.ensemble_coeff}')
        if self.precision not in (AUTO, *PRECISIONS):
            raise ValueError(f"unknown precision '{self.precision}', expected one of "
                             f'{(AUTO, *PRECISIONS)}')
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"unknown compile_mode '{self.compile_mode}', expected one of "
                             f'{COMPILE_MODES}')
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f'torch_threads must be >= 1, got {self.torch_threads}')
        if self.simulated_latency_ticks < 0:
            raise ValueError(f'simulated_latency_ticks must be >= 0, got '
                             f'{self.simulated_latency_ticks}')
        if not 0 <= self.inference_nice <= 19:
            raise ValueError(f'inference_nice must be in [0, 19], got {self.inference_nice}')
        if not (math.isfinite(self.inference_timeout_s) and self.inference_timeout_s > 0):
            raise ValueError(f'inference_timeout_s must be > 0, got {self.inference_timeout_s}')
        self.backend, self.backend_why = resolve_backend(
            self.backend, device=self.device, precision=self.precision,
            compile_model=self.compile_model)
        # A precision as set is checked as set (int8 is built in fp32 first, for its check).
        check_backend_options(self.backend, precision=(self.precision if self.precision != AUTO
                                                       else self.plan().build),
                              compile_model=self.compile_model, device=self.device)

    def plan(self) -> PrecisionPlan:
        """How the precision is settled (``auto``: the rule of act_ros.core.inference.precision)."""
        return PrecisionPlan.make(self.precision, self.backend, self.precision_tolerance,
                                  live=self.precision_check_live)


@dataclass
class RuntimeStats:
    """Counters for diagnostics and benchmarks."""

    ticks: int = 0
    chunks_computed: int = 0
    chunks_discarded: int = 0
    chunks_late: int = 0  # arrived after their last tick had passed: model slower than a chunk
    empty_ticks: int = 0
    last_inference_ms: float = float('nan')
    mean_inference_ms: float = float('nan')
    queue_depth: int = 0
    warmup_s: float = 0.0
    # Start-up moments (time.monotonic()), act_ros.core.startup names: the model's load
    # (in the child for execution 'process'), the first request and the first chunk.
    startup: dict[str, float] = field(default_factory=dict)
    # ONNX backends: export (and OpenVINO's compiled model) reused ('hit') or made ('miss').
    backend_cache: str = 'none'
    inference_ms_history: list[float] = field(default_factory=list, repr=False)
    latency: Latency | None = None  # measured at start-up (measure_latency)
    verdict: Verdict | None = None  # feasibility of the configured rate (feasibility)
    # Each background chunk's time by part, and the model-only time (act_ros.core.inference.latency_split).
    split: SplitStats = field(default_factory=SplitStats, repr=False)


class _DelayedWorker:
    """Stands in for :class:`_Worker` against simulated time (``execution='simulated'``):
    computes a request at once and hands the chunk out ``latency_ticks`` ticks later (with
    the model time it stands for), so the runtime's background schedule is reproduced
    exactly, whatever the speed of the machine running the evaluation."""

    def __init__(self, compute, latency_ticks: int, period_s: float) -> None:
        self._compute = compute
        self.latency_ticks = latency_ticks
        self.period_s = period_s
        self.now_tick = 0
        self._pending: list[tuple[int, int, int, np.ndarray]] = []

    def submit(self, epoch: int, tick: int, obs: Observation) -> None:
        self._pending.append((tick + self.latency_ticks, epoch, tick, self._compute(obs)))

    @property
    def idle(self) -> bool:
        return not self._pending

    def take_results(self) -> list[tuple[int, int, np.ndarray, float]]:
        ready = [p for p in self._pending if p[0] <= self.now_tick]
        self._pending = [p for p in self._pending if p[0] > self.now_tick]
        seconds = max(self.latency_ticks, 1) * self.period_s
        return [(epoch, tick, chunk, seconds) for _, epoch, tick, chunk in ready]

    def wait_idle(self, timeout: float | None = None) -> bool:
        return True

    def close(self) -> None:
        self._pending.clear()


class _Worker:
    """One background thread that computes chunks for (epoch, tick, observation) requests."""

    def __init__(self, compute) -> None:
        self._compute = compute
        self._cond = threading.Condition()
        self._request: tuple[int, int, Observation] | None = None
        self._results: list[tuple[int, int, np.ndarray, float]] = []
        self._busy = False
        self._error: BaseException | None = None
        self._stop = False
        self.first_done_at: float | None = None  # monotonic time the first chunk was computed
        self._thread = threading.Thread(target=self._run, name='act-ros-inference', daemon=True)
        self._thread.start()

    def submit(self, epoch: int, tick: int, obs: Observation) -> None:
        with self._cond:
            self._request = (epoch, tick, obs)
            self._cond.notify()

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._busy and self._request is None

    def take_results(self) -> list[tuple[int, int, np.ndarray, float]]:
        with self._cond:
            if self._error is not None:
                error, self._error = self._error, None
                raise RuntimeError(f'inference worker failed: {error}') from error
            results, self._results = self._results, []
            return results

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy or self._request is not None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._request is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                request, self._request = self._request, None
                self._busy = True
            epoch, tick, obs = request
            try:
                start = time.perf_counter()
                chunk = self._compute(obs)
                elapsed = time.perf_counter() - start
                with self._cond:
                    self._results.append((epoch, tick, chunk, elapsed))
                    if self.first_done_at is None:
                        self.first_done_at = time.monotonic()
            except BaseException as exc:  # handed to the caller on its next take_results()
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class PolicyRuntime:
    """Load a checkpoint and produce one action per control tick (see module docstring)."""

    def __init__(self, config: RuntimeConfig, *, wait: bool = True) -> None:
        """Load the checkpoint and warm the model up.

        ``wait=False`` (``execution='process'`` only; ignored otherwise): return as soon
        as the inference child is started; :meth:`wait_ready` then blocks until it has
        loaded and warmed up the model (a request before that waits too).
        """
        self.config = config
        self.contract = config.contract or load_contract()
        self.stats = RuntimeStats()
        self.checkpoint: LoadedCheckpoint | None = None
        self.predictor: ChunkPredictor | None = None
        self._remote = None
        plan = config.plan()
        # What the model runs in, settled once it is built (precision auto checks bf16).
        self.precision_check: PrecisionCheck | None = None
        options = PredictorOptions(precision=plan.build, compile_model=config.compile_model,
                                   compile_mode=config.compile_mode, freeze=config.freeze_weights,
                                   backend=config.backend, threads=config.torch_threads)
        warmup_iterations = (3 if config.compile_model else 1) if config.warmup else 0
        # The ONNX backends run on the CPU ('auto' means the CPU for them).
        requested_device = config.device if config.backend == 'torch' else 'cpu'
        # A Hub id becomes its snapshot in the huggingface_hub cache (downloaded once when the
        # Hub is reachable); from here on only the local directory is used.
        self.source: ResolvedCheckpoint = resolve_checkpoint(config.model_path)
        model_path = self.source.path
        if config.execution == 'process':
            # Files and features checked here from JSON; the child builds the model (and
            # resolves the device), so this process never imports torch for it.
            self.info: CheckpointInfo = read_checkpoint_info(self.source, self.contract)
            self._check_chunk_size()
            self.device: torch.device | str = requested_device  # the child's, once ready
            self._remote = RemotePredictor(ProcessSpec(
                model_path=str(model_path), contract=self.contract,
                device=requested_device, options=options, torch_threads=config.torch_threads,
                warmup_iterations=warmup_iterations, precision_plan=plan,
                nice=config.inference_nice),
                predict_timeout_s=config.inference_timeout_s, wait=wait)
            if wait:
                self.wait_ready()
        else:
            import torch

            from act_ros.core.device import select_device
            from act_ros.core.inference.checkpoint import import_lerobot, load_checkpoint
            from act_ros.core.inference.predictor import ChunkPredictor

            import_lerobot()
            self.stats.startup['model_imported'] = time.monotonic()
            if config.torch_threads:
                torch.set_num_threads(config.torch_threads)
            self.device = select_device(requested_device)
            self.checkpoint = load_checkpoint(self.source, contract=self.contract,
                                              device=str(self.device))
            self.stats.startup['checkpoint_loaded'] = time.monotonic()
            self.info = self.checkpoint.info()
            self._check_chunk_size()
            self.predictor = ChunkPredictor(self.checkpoint, self.contract, self.device, options)
            self.stats.startup['backend_built'] = time.monotonic()
            backend = self.predictor.backend
            self.stats.backend_cache = 'none' if backend is None else backend.cache_note
            if warmup_iterations:
                self.stats.warmup_s = self.predictor.warmup(warmup_iterations)
            self.precision_check = settle(self.predictor, plan, self.contract.lower,
                                          self.contract.upper, checkpoint_dir=model_path)
            self.stats.startup['warmed_up'] = time.monotonic()
        self.chunk_size = self.info.chunk_size
        # What is played of each chunk: the configured value, else the checkpoint's.
        self.n_action_steps = config.n_action_steps or self.info.n_action_steps
        self._lock = threading.Lock()
        self._epoch = 0
        self._tick = 0
        self._new_chunks: list[np.ndarray] = []
        # The chunk a viewer is shown (current_chunk), and the observation stamps of the
        # requests in flight ((epoch, tick) -> stamp), which their chunks carry.
        self._current: TimedChunk | None = None
        self._request_stamps: dict[tuple[int, int], float | None] = {}
        # Recent model latencies: chunk mode asks for the next chunk early enough for the
        # slowest of them (a mean would let the queue run dry whenever the CPU is busier).
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._last_request_tick: int | None = None
        # Async chunk mode may play a chunk past n_action_steps while the next one is late,
        # rather than run dry; sync mode reproduces LeRobot's queue of n_action_steps.
        self._queue = ChunkQueue(self.n_action_steps if config.execution == 'sync'
                                 else self.chunk_size)
        self._ensembler = TickEnsembler(config.ensemble_coeff, max_chunks=self.chunk_size)
        self._blend = BlendQueue(config.blend_ticks)
        # Start tick of the chunk (the newest in a blend) behind the last action, and
        # whether that action was inside a crossfade (blend mode), for seams.
        self.last_source: int | None = None
        self.last_transition = False
        self._last_tick = -1  # tick of the last act()
        self._worker = None
        self._first_request_at: float | None = None
        if config.execution == 'async':
            self._worker = _Worker(self._predict_timed)
        elif config.execution == 'process':
            self._worker = _Worker(self._predict_remote)
        elif config.execution == 'simulated':
            self._worker = _DelayedWorker(lambda obs: self.predictor.predict(obs),
                                          config.simulated_latency_ticks, self.period_s)

    def _predict_timed(self, obs: Observation) -> np.ndarray:
        """In-process background chunk, its parts recorded (act_ros.core.inference.latency_split)."""
        start = time.perf_counter()
        chunk = self.predictor.predict(obs)
        self.stats.split.add(ChunkTiming.in_process(time.perf_counter() - start,
                                                    self.predictor.last_timing))
        return chunk

    def _predict_remote(self, obs: Observation) -> np.ndarray:
        """A chunk of the inference child, its parts recorded (transfer and return too)."""
        chunk = self._remote.predict(obs)
        self.stats.split.add(self._remote.last_split)
        return chunk

    def _check_chunk_size(self) -> None:
        steps = self.config.n_action_steps
        if steps is not None and steps > self.info.chunk_size:
            raise ValueError(f'n_action_steps ({steps}) cannot exceed the '
                             f"checkpoint's chunk_size ({self.info.chunk_size})")
        if self.config.mode == 'blend' and self.config.blend_ticks >= self.info.chunk_size:
            raise ValueError(f'blend_ticks ({self.config.blend_ticks}) must be below the '
                             f"checkpoint's chunk_size ({self.info.chunk_size}): the old chunk "
                             'must keep rows to fade from')

    def wait_ready(self) -> None:
        """Block until the model is loaded and warmed up: the inference child of a
        runtime made with ``wait=False``; at once otherwise. Raises
        :class:`~act_ros.core.inference.inference_process.InferenceProcessError` with the child's
        reason when it could not start."""
        if self._remote is None:
            return
        self._remote.wait_ready()
        self.precision_check = self._remote.precision_check
        self.stats.warmup_s = self._remote.warmup_s
        self.device = self._remote.device
        self.stats.backend_cache = self._remote.backend_cache
        for name, at in self._remote.startup_events.items():
            self.stats.startup.setdefault(name, at)

    def settle_precision(self, observations: Sequence[Observation]) -> PrecisionCheck | None:
        """Run a pending precision check (:attr:`RuntimeConfig.precision_check_live`) on
        ``observations`` (live ones; none: the synthetic ones) and run what it settles;
        the settled check as it is otherwise. Raises
        :class:`~act_ros.core.errors.PrecisionRefusedError` for a precision set by name
        that drifts (the model stays fp32). Call with no chunk in flight."""
        check = self.precision_check
        if check is None or not check.pending:
            return check
        plan = replace(self.config.plan(), live=False)
        if self._remote is not None:
            self.precision_check = self._remote.settle(plan, list(observations))
        else:
            self.precision_check = settle(self.predictor, plan, self.contract.lower,
                                          self.contract.upper, observations=observations)
        return self.precision_check

    @property
    def cameras(self) -> tuple[str, ...]:
        """The contract cameras the checkpoint takes, in the model's order (any subset of the
        contract's, none for a policy on joints and object poses alone)."""
        by_feature = {cam.feature: cam.name for cam in self.contract.cameras}
        return tuple(by_feature[key] for key in self.info.image_features)

    @property
    def environment_state_dim(self) -> int:
        """Length of the environment state (object poses) every observation must carry; 0
        when the checkpoint does not take ``observation.environment_state``."""
        return self.info.env_state_dim if self.info.uses_environment_state else 0

    @property
    def lean_child(self) -> bool:
        """Whether the inference child computes from the ONNX export without torch and
        LeRobot (:mod:`act_ros.core.inference.onnx_predictor`)."""
        return self._remote is not None and self._remote.lean

    @property
    def startup_events(self) -> dict[str, float]:
        """The runtime's start-up moments (``time.monotonic()``; names of
        :data:`act_ros.core.startup.EVENTS`): model import, load, backend build, warm-up,
        latency measurement, first request and first chunk, as far as they happened."""
        events = dict(self.stats.startup)
        if self._first_request_at is not None:
            events['first_request'] = self._first_request_at
        first_done = getattr(self._worker, 'first_done_at', None)
        if first_done is not None:
            events['first_chunk'] = first_done
        return events

    # -- episode -----------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode; in-flight results from before the reset are discarded."""
        with self._lock:
            self._epoch += 1
            self._tick = 0
            self._queue.reset()
            self._ensembler.reset()
            self._blend.reset()
            self.last_source = None
            self.last_transition = False
            self._last_tick = -1
            self._new_chunks.clear()
            self._last_request_tick = None
            self.stats.queue_depth = 0
            self._current = None
            self._request_stamps.clear()

    @property
    def tick(self) -> int:
        """Index of the next control tick in the episode."""
        return self._tick

    @property
    def period_s(self) -> float:
        return 1.0 / self.contract.fps

    @property
    def current_chunk(self) -> TimedChunk | None:
        """The chunk being played (chunk mode: as the queue holds it) or the newest chunk
        in the blend (ensemble mode): ``start_tick``, ``actions`` ``(T, J)`` (postprocessed,
        contract order, before the safety limits) and ``stamp_s``, the header stamp of the
        observation it was computed from (``None`` when that had none). ``None`` before the
        first chunk of an episode. One reference, read without a lock."""
        return self._current

    def take_new_chunks(self) -> list[np.ndarray]:
        """Chunks (T, J), postprocessed, that arrived since the last call (for limit checks)."""
        with self._lock:
            chunks, self._new_chunks = self._new_chunks, []
            return chunks

    # -- control tick ------------------------------------------------------------------
    def act(self, observation: Observation) -> np.ndarray | None:
        """The action for this tick, in contract order; ``None`` until a chunk exists.

        A checkpoint that takes ``observation.environment_state`` needs the observation's
        ``environment_state`` (object poses): missing, of the wrong length or not finite is an
        :class:`~act_ros.core.errors.ObservationError` here, in every execution, before
        the tick counts (otherwise it is ignored).
        """
        if self.info.uses_environment_state:
            environment_state_to_array(observation.environment_state, self.info.env_state_dim)
        with self._lock:
            tick = self._tick
            self._tick += 1
            self.stats.ticks += 1
            if self._worker is None:
                action = self._act_sync(tick, observation)
            else:
                action = self._act_async(tick, observation)
            self.stats.queue_depth = self._store.remaining(tick + 1)
            self._last_tick = tick
            self.last_source = None if action is None else self._store.source(tick)
            self.last_transition = self.config.mode == 'blend' and self._blend.fading(tick)
            if action is None:
                self.stats.empty_ticks += 1
            return action

    def will_predict(self) -> bool:
        """Whether the next :meth:`act` may run the model on its observation's images:
        always in ensemble mode and in background executions (a request may go out at
        any tick); in synchronous chunk mode only when the queue is empty, in synchronous
        blend mode when :attr:`stride` actions of the newest chunk have played. A
        simulation can skip rendering the cameras on the other ticks (the action then comes
        from the queue, whatever the images)."""
        if self._worker is not None:
            return True
        with self._lock:
            return self._sync_due(self._tick)

    def plan(self, horizon: int) -> np.ndarray | None:
        """The actions planned for the last tick :meth:`act` answered and the ticks after
        it, at most ``horizon`` (``(T, J)``, contract order, before the safety limits): the
        rest of the chunk, of the crossfade or of the blend as the chunks stored now give
        them. ``None`` when nothing is planned. Changes nothing."""
        if horizon < 1:
            raise ValueError(f'horizon must be >= 1, got {horizon}')
        with self._lock:
            if self._last_tick < 0:
                return None
            return self._store.preview(self._last_tick, horizon)

    @property
    def stride(self) -> int:
        """Actions played from each chunk before the next one is due: ``n_action_steps``
        (chunk mode; unused in ensemble mode); in blend mode at most ``chunk_size -
        blend_ticks``, so that the old chunk still holds the rows the crossfade needs."""
        steps = self.n_action_steps
        if self.config.mode == 'blend':
            steps = min(steps, self.chunk_size - self.config.blend_ticks)
        return max(1, steps)

    @property
    def _store(self):
        return {'ensemble': self._ensembler, 'blend': self._blend}.get(self.config.mode,
                                                                      self._queue)

    def _add_chunk(self, start_tick: int, chunk: np.ndarray, seconds: float,
                   stamp_s: float | None = None) -> None:
        timed = TimedChunk(start_tick, chunk, stamp_s)
        if timed.end_tick <= self._tick - 1:
            self.stats.chunks_late += 1
        if self.config.mode == 'blend':
            self._blend.add(timed, now_tick=self._tick - 1)  # the fade starts this tick
        else:
            self._store.add(timed)
        self._current = self._store.latest
        self._new_chunks.append(chunk)
        self.stats.chunks_computed += 1
        ms = seconds * 1000.0
        self.stats.last_inference_ms = ms
        history = self.stats.inference_ms_history
        history.append(ms)
        if len(history) > 200:
            del history[:-200]
        self.stats.mean_inference_ms = float(np.mean(history))
        self._latencies.append(seconds)

    def _sync_due(self, tick: int) -> bool:
        """Whether a synchronous execution runs the model at ``tick``."""
        store = self._store
        return (self.config.mode == 'ensemble' or store.remaining(tick) == 0
                or (self.config.mode == 'blend' and tick - store.latest_start >= self.stride))

    def _act_sync(self, tick: int, obs: Observation) -> np.ndarray:
        if self._sync_due(tick):
            start = time.perf_counter()
            if self._first_request_at is None:
                self._first_request_at = time.monotonic()
            chunk = self.predictor.predict(obs)
            self._add_chunk(tick, chunk, time.perf_counter() - start, obs.stamp_s)
            self.stats.startup.setdefault('first_chunk', time.monotonic())
        return self._store.action(tick)

    def _act_async(self, tick: int, obs: Observation) -> np.ndarray | None:
        if isinstance(self._worker, _DelayedWorker):
            self._worker.now_tick = tick
        try:
            results = self._worker.take_results()
        except RuntimeError:
            # The requested chunk will never come: a later tick asks again (without this,
            # chunk mode would wait for it forever and the robot would go silent).
            self._last_request_tick = None
            raise
        for epoch, start_tick, chunk, seconds in results:
            stamp_s = self._request_stamps.pop((epoch, start_tick), None)
            if epoch != self._epoch:
                self.stats.chunks_discarded += 1
                continue
            self._add_chunk(start_tick, chunk, seconds, stamp_s)
        if results:  # a request replaced before the worker took it never comes back
            last = max((epoch, start) for epoch, start, _, _ in results)
            for stale in [key for key in self._request_stamps if key < last]:
                del self._request_stamps[stale]
        if self._worker.idle and self._should_request(tick):
            self._request_stamps[(self._epoch, tick)] = obs.stamp_s
            self._worker.submit(self._epoch, tick, obs)
            self._last_request_tick = tick
            if self._first_request_at is None:
                self._first_request_at = time.monotonic()
        return self._store.action(tick)

    def _should_request(self, tick: int) -> bool:
        if self.config.mode == 'ensemble':
            return True  # keep the model busy: every chunk joins the blend
        if self._last_request_tick is None:
            return True
        store = self._store
        if store.latest_start is None or store.latest_start < self._last_request_tick:
            return False  # the requested chunk is still on its way
        # Ask so that the next chunk lands when `stride` actions of the current one have
        # played (or before the queue runs dry, in blend mode before the rows the fade
        # needs run out, whichever comes first).
        slowest = max(self._latencies, default=0.0)
        latency_ticks = math.ceil(slowest / self.period_s) + REQUEST_MARGIN_TICKS
        remaining = store.remaining(tick)
        if self.config.mode == 'blend':
            remaining -= self.config.blend_ticks
        played = tick - store.latest_start
        return remaining <= latency_ticks or played + latency_ticks >= self.stride

    def measure_latency(self, calls: int = LATENCY_CALLS) -> Latency:
        """Time ``calls`` chunk computations on this machine (after the warm-up), as the
        runtime will run them (in the child process for ``execution='process'``). The
        model's part of each call is the model-only time per chunk beside the split of
        the chunks that follow (``stats.split``; no extra model call)."""
        if calls < 1:
            raise ValueError(f'measure_latency needs at least 1 call, got {calls}')
        obs = self._dummy_observation()
        seconds, model_s = [], []
        for _ in range(calls):
            start = time.perf_counter()
            if self._remote is not None:
                self._remote.predict(obs)
                model_s.append(self._remote.last_split.model_s)
            else:
                self.predictor.predict(obs)
                model_s.append(self.predictor.last_timing.get('model_s', float('nan')))
            seconds.append(time.perf_counter() - start)
        self.stats.latency = Latency.from_samples(seconds)
        self.stats.split.set_model_only(model_s)
        self.stats.startup.setdefault('latency_measured', time.monotonic())
        return self.stats.latency

    def _dummy_observation(self) -> Observation:
        """The warm-up's observation for this checkpoint's inputs."""
        cameras = [(name, key, self.info.image_shapes[key])
                   for name, key in zip(self.cameras, self.info.image_features)]
        return dummy_observation(cameras, self.contract.lower, self.contract.upper,
                                 self.environment_state_dim)

    def measure_model_only(self, calls: int = LATENCY_CALLS) -> list[float]:
        """Time ``calls`` calls of the model alone (same predictor: backend, precision and
        threads; in the child for ``execution='process'``) on one observation preprocessed
        once, and keep them as the model-only time per chunk (``stats.split``; replaces
        the model parts :meth:`measure_latency` kept)."""
        if calls < 1:
            raise ValueError(f'measure_model_only needs at least 1 call, got {calls}')
        obs = self._dummy_observation()
        source = self._remote if self._remote is not None else self.predictor
        seconds = source.model_times(obs, calls)
        self.stats.split.set_model_only(seconds)
        return seconds

    @property
    def precision(self) -> str:
        """The precision the model runs in (settled at start-up; precision auto: fp32 or
        the bf16 that passed its check)."""
        if self.precision_check is not None:
            return self.precision_check.precision
        return self.config.plan().build

    def feasibility(self, rate_hz: float, latency: Latency | None = None) -> Verdict:
        """Can this configuration hold ``rate_hz``? (:mod:`act_ros.core.inference.feasibility`)"""
        latency = latency or self.stats.latency or self.measure_latency()
        others = [b for b in installed_backends() if b != self.config.backend]
        result = verdict(mode=self.config.mode, execution=self.config.execution,
                         precision=f'{self.config.backend} {self.precision}',
                         rate_hz=rate_hz, chunk_size=self.chunk_size,
                         n_action_steps=self.stride, latency=latency,
                         margin_ticks=REQUEST_MARGIN_TICKS,
                         image_size=next(iter(self.info.image_shapes.values()), None),
                         backends=others)
        self.stats.verdict = result
        return result

    @property
    def inference_restarts(self) -> int:
        """How often the inference child was started again after it died or hung."""
        return self._remote.restarts if self._remote is not None else 0

    # -- lifetime ------------------------------------------------------------------------
    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the background worker has nothing in flight (tests, shutdown)."""
        return True if self._worker is None else self._worker.wait_idle(timeout)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self._remote is not None:
            self._remote.close()
            self._remote = None

    def __enter__(self) -> PolicyRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
