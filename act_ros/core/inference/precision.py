"""Which precision the model runs in: ``precision: auto`` and its check against fp32.

Torch-free, so that the node's process (``execution: process`` never imports torch there)
decides as the inference child, the evaluator and training do, from one detection:

- :func:`cpu_has_native_bf16`: the CPU computes bfloat16 natively (x86 flags
  ``avx512_bf16`` or ``amx_bf16``: AVX512-BF16 or AMX), read from the kernel's CPU flags
  (``/proc/cpuinfo``, what ``lscpu`` shows) on Linux and from
  ``torch.cpu.get_capabilities()`` elsewhere. Training's ``--precision auto``
  (:func:`act_ros.training.loop.resolve_precision`), the torch backend's refusal of
  emulated bf16 and the rule below all use it.
- :func:`auto_precision`: the inference rule of ``precision: auto`` (``act_node``'s
  default, ``act-ros evaluate --precision auto``): bf16 with the OpenVINO backend on a
  CPU with native bf16, fp32 everywhere else (the torch backend on a CPU gains little
  from autocast, and ONNX Runtime runs fp32 only).
- When auto picks bf16 it is only a candidate: the model is built in fp32 first, then
  in bf16, and both run on the check observations (:func:`check_observations`: the
  warm-up's observation and seeded random ones). bf16 is kept only when the largest
  difference of any normalized action (units of the action's standard deviation in the
  training data) stays within ``tolerance`` (:data:`DEFAULT_TOLERANCE`); otherwise, or
  when the bf16 model cannot be built, the model stays fp32 and the result says why
  (:class:`PrecisionCheck`, logged as a warning by the node and shown on
  ``/diagnostics`` as ``precision.*``).
- ``precision: int8`` (OpenVINO with a quantized model, :mod:`act_ros.core.inference.quantized`),
  never picked by auto, ``bf16`` set by name with the OpenVINO backend, and ``bf16`` or
  ``fp16`` set by name with torch (autocast on a GPU, or a CPU with bf16) go through the
  same check: fp32 is built first, the candidate is compared with it on the same
  observations, and one whose actions differ beyond the tolerance is refused
  (:class:`~act_ros.core.errors.PrecisionRefusedError`, with the figure): a precision
  asked for by name is never silently replaced, and never kept when it drifts. A
  quantized model that cannot be loaded is an error too (:attr:`PrecisionPlan.keep`).
- The check observations are real ones where the checkpoint has them:
  :data:`CHECK_OBSERVATIONS_FILE` beside it (frames, joint states, object poses of its
  training data or its task's simulation, written by ``act-ros package-model`` and
  ``act-ros train``, :func:`save_check_observations`); without it, synthetic ones
  (:func:`check_observations`: a black frame and uniform noise), and the result says so.
  A node (:attr:`PrecisionPlan.live`) does better without the file: its model runs fp32
  from configure, the check waits (``source`` 'pending') and runs on the first live
  observations before activation (:func:`settle` with ``observations``: source 'live').
"""

from __future__ import annotations

import functools
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.errors import PrecisionRefusedError
from act_ros.core.observation import Observation, dummy_observation

AUTO = 'auto'
# Instruction-set flags (Linux /proc/cpuinfo and torch.cpu.get_capabilities() spell them
# alike) with which an x86 CPU computes bfloat16 natively.
NATIVE_BF16_FLAGS = ('avx512_bf16', 'amx_bf16')
# Largest normalized action difference between bf16 and fp32 accepted by precision auto.
# bf16 keeps 8 bits of mantissa (about 0.4 % relative); an ACT forward pass at 480x640
# measured 0.01 on a CPU with AVX512-BF16 (issue 23). 0.05 standard deviations of an arm
# joint is a few hundredths of a radian: well under a tick's step (0.1 rad at 3 rad/s, 30 Hz).
DEFAULT_TOLERANCE = 0.05
CHECK_OBSERVATIONS = 3  # the warm-up's observation and two seeded random ones
# Flags with which an x86 CPU multiplies 8-bit integers into 32-bit sums (AVX-512 VNNI,
# AVX-VNNI, AMX). Without them OpenVINO's int8 kernels (AVX2, or AVX-512 without VNNI)
# multiply unsigned by signed bytes into pairs summed in 16 bits, which saturate when both
# use all 8 bits: NNCF's overflow fix keeps the weights to 7 bits for them.
INT8_DOT_FLAGS = ('avx512_vnni', 'avx_vnni', 'amx_int8')
# Precisions that, when set by name, are checked against fp32 at start-up and refused
# over the tolerance: int8, bf16 with the OpenVINO backend (whose fp32 model the check
# builds), bf16 and fp16 with torch (autocast switched on the same model).
CHECKED_PRECISIONS = ('int8',)
CHECKED_BY_BACKEND = {'openvino': ('int8', 'bf16'), 'torch': ('bf16', 'fp16')}
# Real observations saved beside a checkpoint for this check (save_check_observations).
CHECK_OBSERVATIONS_FILE = 'precision_check_observations.npz'
SAVED_CHECK_OBSERVATIONS = 8
CPUINFO = Path('/proc/cpuinfo')


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags, lower case (see the module docstring)."""
    if sys.platform.startswith('linux') and CPUINFO.is_file():
        return parse_cpuinfo_flags(CPUINFO.read_text(errors='replace'))
    try:
        import torch
    except ImportError:
        return frozenset()
    capabilities = getattr(torch.cpu, 'get_capabilities', None)
    if capabilities is None:
        return frozenset()
    return frozenset(str(k).lower() for k, v in capabilities().items() if v is True)


def cpu_class(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The CPU class whose baseline applies: what the kernels PyTorch, OpenVINO and ONNX
    Runtime pick depend on (x86: AMX, AVX-512 with bf16, AVX-512, AVX2). Benchmarks compare
    against the baseline of their class; recipes state their minutes per class."""
    if flags is None:
        flags = set(cpu_flags())
    machine = (machine or platform.machine()).lower()
    if machine in ('aarch64', 'arm64'):
        return 'arm64'
    if machine not in ('x86_64', 'amd64'):
        return machine
    for name, needs in (('x86-amx', ('amx_bf16',)), ('x86-avx512-bf16', ('avx512_bf16',)),
                        ('x86-avx512', ('avx512f',)), ('x86-avx2', ('avx2',))):
        if all(flag in flags for flag in needs):
            return name
    return 'x86'


def parse_cpuinfo_flags(text: str) -> frozenset[str]:
    """The ``flags`` of the first processor in a ``/proc/cpuinfo`` text (x86 layout)."""
    for line in text.splitlines():
        key, sep, value = line.partition(':')
        if sep and key.strip() == 'flags':
            return frozenset(value.lower().split())
    return frozenset()


def cpu_has_native_bf16(flags: Iterable[str] | None = None) -> bool:
    """True when the CPU computes bfloat16 natively (AVX512-BF16 or AMX on x86).

    ``flags``: the CPU flags to judge (default: this machine's, :func:`cpu_flags`).
    """
    present = cpu_flags() if flags is None else {str(f).lower() for f in flags}
    return any(flag in present for flag in NATIVE_BF16_FLAGS)


def cpu_saturates_int8(flags: Iterable[str] | None = None) -> bool:
    """True for an x86 CPU without 8-bit integer dot products (:data:`INT8_DOT_FLAGS`),
    whose int8 kernels sum pairs of byte products in 16 bits (module docstring of
    :mod:`act_ros.core.inference.quantized`). Other architectures: False.

    ``flags``: the CPU flags to judge (default: this machine's, :func:`cpu_flags`); x86 is
    told by its ``sse2`` flag, which every x86-64 CPU lists.
    """
    present = cpu_flags() if flags is None else {str(f).lower() for f in flags}
    return 'sse2' in present and not any(flag in present for flag in INT8_DOT_FLAGS)


def auto_precision(backend: str, *, flags: Iterable[str] | None = None) -> tuple[str, str]:
    """``(precision, why)`` that ``precision: auto`` tries for ``backend`` on this CPU (or
    one with ``flags``): 'bf16' for openvino on a CPU with native bf16 (still subject to
    the check against fp32), else 'fp32'."""
    present = cpu_flags() if flags is None else frozenset(str(f).lower() for f in flags)
    if backend != 'openvino':
        return 'fp32', f'backend {backend}: auto runs fp32 (bf16 only with openvino)'
    if not cpu_has_native_bf16(present):
        return 'fp32', ('this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 among '
                        'its flags): bf16 would be emulated')
    found = [flag for flag in NATIVE_BF16_FLAGS if flag in present]
    return 'bf16', f"this CPU computes bfloat16 natively ({', '.join(found)})"


@dataclass(frozen=True)
class PrecisionPlan:
    """How a predictor's precision is settled at start-up (picklable: the inference child
    gets it): build the model in ``build``; when ``candidate`` is set, check it against
    that and keep it within ``tolerance``, or whatever the check finds with ``keep``
    (:func:`settle`)."""

    requested: str
    build: str
    why: str
    candidate: str | None = None
    tolerance: float = DEFAULT_TOLERANCE
    # The candidate was set by name (int8, bf16): refused over the tolerance, and one
    # that cannot be built or run is an error (never a silent fp32).
    keep: bool = False
    # Without saved observations, leave the check pending (the model runs ``build``) until
    # live observations come (the node's, before activation), instead of synthetic ones.
    live: bool = False

    @classmethod
    def make(cls, requested: str, backend: str, tolerance: float = DEFAULT_TOLERANCE, *,
             flags: Iterable[str] | None = None, live: bool = False) -> PrecisionPlan:
        """A concrete ``requested`` precision is built as asked, unchecked, except int8,
        bf16 on openvino and bf16/fp16 on torch (:data:`CHECKED_BY_BACKEND`: built after
        fp32 and checked against it, refused over the tolerance);
        ``auto`` follows :func:`auto_precision` (a bf16 candidate is built after fp32,
        checked). Whether ``backend`` runs the precision is the caller's check
        (:func:`act_ros.core.inference.options.check_backend_options`)."""
        if not (isinstance(tolerance, (int, float)) and np.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f'precision_tolerance must be a finite number >= 0, got {tolerance}')
        if requested in CHECKED_PRECISIONS or requested in CHECKED_BY_BACKEND.get(backend, ()):
            return cls(requested=requested, build='fp32', why='as set', candidate=requested,
                       tolerance=float(tolerance), keep=True, live=live)
        if requested != AUTO:
            return cls(requested=requested, build=requested, why='as set',
                       tolerance=float(tolerance))
        chosen, why = auto_precision(backend, flags=flags)
        return cls(requested=AUTO, build='fp32', why=why,
                   candidate=chosen if chosen != 'fp32' else None, tolerance=float(tolerance),
                   live=live)


@dataclass(frozen=True)
class PrecisionCheck:
    """The precision a model runs in, as requested and as settled at start-up."""

    requested: str  # auto | fp32 | bf16 | fp16 | int8
    precision: str  # what the model runs in
    why: str  # the rule's reason (auto), or 'as set'
    candidate: str | None = None  # the reduced precision checked against fp32, if any
    max_diff: float | None = None  # largest normalized action difference, candidate vs fp32
    tolerance: float | None = None
    observations: int = 0
    failure: str = ''  # the candidate could not be built or run (then precision is fp32)
    # What the check ran on: 'saved' (real observations beside the checkpoint), 'live'
    # (the node's first inputs, none saved), 'synthetic' (a black frame and noise, a
    # warning), or 'pending' (none saved: the node checks its live inputs at activation).
    source: str = 'synthetic'

    @property
    def pending(self) -> bool:
        """The candidate waits for live observations; the model runs fp32 until then."""
        return self.source == 'pending'

    @property
    def fell_back(self) -> bool:
        """Auto tried a reduced precision and kept fp32 (a warning)."""
        return (self.candidate is not None and self.precision != self.candidate
                and not self.pending)

    @property
    def within(self) -> bool:
        """The checked candidate's difference from fp32 is within the tolerance."""
        return (self.max_diff is not None and self.tolerance is not None
                and self.max_diff <= self.tolerance)

    @property
    def warning(self) -> bool:
        """Worth a warning: auto fell back to fp32, or the check ran on synthetic
        observations only."""
        return self.fell_back or (self.candidate is not None
                                  and self.source not in ('saved', 'live', 'pending'))

    def line(self) -> str:
        """One log line: what runs, and the check behind it."""
        head = f'precision {self.precision} (requested {self.requested}: {self.why})'
        if self.candidate is None:
            return head
        if self.failure:
            return f'{head}; {self.candidate} could not run here, kept fp32: {self.failure}'
        if self.pending:
            return (f'{head}; {self.candidate} is checked against fp32 on the first live '
                    f'observations at activation (no {CHECK_OBSERVATIONS_FILE} beside the '
                    'checkpoint); fp32 until then')
        verdict = 'within' if self.within else 'over'
        text = (f'{head}; {self.candidate} vs fp32 on {self.described_observations()}: '
                f'max normalized action difference {self.max_diff:.4f}, {verdict} the '
                f'tolerance {self.tolerance:g}')
        if self.within:
            return text
        return text + (', kept fp32' if self.fell_back else f', {self.precision} refused')

    def described_observations(self) -> str:
        if self.source == 'saved':
            return (f'{self.observations} real observations saved with the checkpoint '
                    f'({CHECK_OBSERVATIONS_FILE})')
        if self.source == 'live':
            return (f'{self.observations} live observations before activation (no '
                    f'{CHECK_OBSERVATIONS_FILE} beside the checkpoint)')
        return (f'{self.observations} synthetic observations (a black frame and noise: no '
                f'{CHECK_OBSERVATIONS_FILE} beside the checkpoint, so real inputs were not '
                'checked)')

    def as_values(self) -> dict[str, Any]:
        """Key/value pairs for /diagnostics (``precision.*``)."""
        values: dict[str, Any] = {'precision': self.precision,
                                  'precision.requested': self.requested,
                                  'precision.why': self.why}
        if self.candidate is not None:
            values.update({'precision.candidate': self.candidate,
                           'precision.check_tolerance': self.tolerance,
                           'precision.check_max_diff': (self.max_diff if self.max_diff
                                                        is not None else 'n/a'),
                           'precision.check_observations': self.observations,
                           'precision.check_source': self.source,
                           'precision.fell_back': self.fell_back})
            if self.failure:
                values['precision.check_failure'] = self.failure
        return values


def check_observations(cameras: Sequence[tuple[str, str, tuple[int, int]]], lower: np.ndarray,
                       upper: np.ndarray, environment_state_dim: int = 0,
                       count: int = CHECK_OBSERVATIONS, seed: int = 0) -> list[Observation]:
    """The warm-up's observation (:func:`dummy_observation`) and ``count - 1`` seeded
    random ones: uniform pixels, joints uniform within their limits, object features in
    [-1, 1]."""
    if count < 1:
        raise ValueError(f'the precision check needs at least 1 observation, got {count}')
    out = [dummy_observation(cameras, lower, upper, environment_state_dim)]
    rng = np.random.default_rng(seed)
    lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
    for _ in range(count - 1):
        out.append(Observation(
            images={name: rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                    for name, _, (h, w) in cameras},
            state=rng.uniform(lower, upper),
            environment_state=(rng.uniform(-1.0, 1.0, environment_state_dim).astype(np.float32)
                               if environment_state_dim else None)))
    return out


def save_check_observations(directory: Path, observations: Sequence[Observation]) -> Path:
    """Write ``observations`` (their images, states and object poses) beside a checkpoint
    as :data:`CHECK_OBSERVATIONS_FILE`, for the start-up precision check; returns its path."""
    if not observations:
        raise ValueError('no observations to save for the precision check')
    arrays: dict[str, np.ndarray] = {
        'state': np.stack([np.asarray(o.state, np.float64) for o in observations])}
    for name in observations[0].images:
        arrays[f'image.{name}'] = np.stack([np.asarray(o.images[name], np.uint8)
                                            for o in observations])
    if all(o.environment_state is not None for o in observations):
        arrays['environment_state'] = np.stack([np.asarray(o.environment_state, np.float32)
                                                for o in observations])
    path = Path(directory) / CHECK_OBSERVATIONS_FILE
    tmp = path.with_name(f'.{path.name}.tmp')
    with open(tmp, 'wb') as f:
        np.savez_compressed(f, **arrays)
    tmp.replace(path)
    return path


def load_check_observations(directory: Path | str | None, cameras: Sequence[str] = (),
                            environment_state_dim: int = 0) -> list[Observation] | None:
    """The observations :func:`save_check_observations` left beside a checkpoint, or
    ``None`` when there are none or they lack an input the checkpoint takes (a camera in
    ``cameras``, the object poses)."""
    if directory is None:
        return None
    path = Path(directory) / CHECK_OBSERVATIONS_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    if 'state' not in arrays or any(f'image.{cam}' not in arrays for cam in cameras):
        return None
    env = arrays.get('environment_state')
    if environment_state_dim and (env is None or env.shape[-1] != environment_state_dim):
        return None
    return [Observation(images={cam: arrays[f'image.{cam}'][i] for cam in cameras},
                        state=arrays['state'][i],
                        environment_state=env[i] if environment_state_dim else None)
            for i in range(len(arrays['state']))]


def compare_backends(predictor: Any, candidate: Callable[[], Any], observations: Sequence[Observation],
                     tolerance: float, *, requested: str, why: str, name: str,
                     keep: bool = False, source: str = 'synthetic') -> PrecisionCheck:
    """Run ``predictor`` (its backend built in fp32) and the backend ``candidate()`` builds
    on ``observations``; keep the candidate in ``predictor`` when every normalized action
    is within ``tolerance`` of fp32, else keep fp32.

    ``predictor``: a :class:`~act_ros.core.inference.predictor.ChunkPredictor` with an ONNX backend or
    a :class:`~act_ros.core.inference.onnx_predictor.LeanOnnxPredictor` (``normalized(obs)``,
    ``backend``, ``use_backend(backend)``). A candidate that cannot be built or run
    (``candidate()`` raises) leaves fp32 in place, with the reason.

    ``keep`` (a precision set by name, int8 or bf16): the candidate stays when within the
    tolerance; over it, or when it cannot be built or run, or computes non-finite actions,
    it raises (:class:`~act_ros.core.errors.PrecisionRefusedError` with the figure over the
    tolerance) instead of falling back. ``source``: what ``observations`` are ('saved' or
    'synthetic', :attr:`PrecisionCheck.source`).
    """
    if not (tolerance >= 0 and np.isfinite(tolerance)):
        raise ValueError(f'precision tolerance must be a finite number >= 0, got {tolerance}')
    common = dict(requested=requested, why=why, candidate=name, tolerance=float(tolerance),
                  observations=len(observations), source=source)
    reference = [predictor.normalized(obs) for obs in observations]
    fp32 = predictor.backend
    try:
        backend = candidate()
        predictor.use_backend(backend)
        reduced = [predictor.normalized(obs) for obs in observations]
    except Exception as exc:  # noqa: BLE001 - any failure of the candidate means fp32
        predictor.use_backend(fp32)
        if keep:
            raise
        return PrecisionCheck(precision='fp32', failure=f'{type(exc).__name__}: {exc}', **common)
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(reference, reduced))
    if keep:
        if not all(np.isfinite(actions).all() for actions in reduced):
            predictor.use_backend(fp32)
            raise ValueError(f'precision {name} computes non-finite actions on the check '
                             'observations: its model is broken, make it again')
        check = PrecisionCheck(precision=name, max_diff=diff, **common)
        if not check.within:
            predictor.use_backend(fp32)
            refused = PrecisionRefusedError(
                f'{check.line()} (set precision fp32, or auto; or raise precision_tolerance '
                'if this difference is acceptable)')
            refused.values = {**check.as_values(), 'precision.refused': True}
            raise refused
        return check
    if not np.isfinite(diff) or diff > tolerance:
        predictor.use_backend(fp32)
        return PrecisionCheck(precision='fp32', max_diff=diff, **common)
    return PrecisionCheck(precision=name, max_diff=diff, **common)


def settle(predictor: Any, plan: PrecisionPlan, lower: np.ndarray, upper: np.ndarray,
           checkpoint_dir: Path | str | None = None,
           observations: Sequence[Observation] | None = None) -> PrecisionCheck:
    """The start-up's last step for a predictor built in ``plan.build``: check
    ``plan.candidate`` against it (:func:`compare_backends`) when there is one, on
    ``observations`` when given (live ones: source 'live'), else on the real observations
    saved in ``checkpoint_dir`` (:func:`load_check_observations`), else, with
    ``plan.live``, not yet (source 'pending': call again with live observations), else on
    :func:`check_observations`; otherwise report the precision as built."""
    if plan.candidate is None:
        return PrecisionCheck(requested=plan.requested, precision=plan.build, why=plan.why)
    info = getattr(predictor, 'info', None)  # the lean ONNX predictor's checkpoint info
    if info is not None:
        env_dim = info.env_state_dim if info.env_state_key is not None else 0
    else:
        env_dim = predictor.env_state_dim if predictor.env_state_key is not None else 0
    source = 'live'
    if not observations:
        observations = load_check_observations(
            checkpoint_dir, [name for name, _, _ in predictor.cameras], env_dim)
        source = 'saved'
    if observations is None and plan.live:
        return PrecisionCheck(requested=plan.requested, precision=plan.build, why=plan.why,
                              candidate=plan.candidate, tolerance=plan.tolerance,
                              source='pending')
    if observations is None:
        observations = check_observations(predictor.cameras, lower, upper, env_dim)
        source = 'synthetic'
    fp32 = predictor.backend

    def build():  # torch (no ONNX backend): the candidate is an autocast precision
        return plan.candidate if fp32 is None else fp32.with_precision(plan.candidate)

    return compare_backends(predictor, build, observations, plan.tolerance,
                            requested=plan.requested, why=plan.why, name=plan.candidate,
                            keep=plan.keep, source=source)


__all__ = ['AUTO', 'CHECKED_BY_BACKEND', 'CHECKED_PRECISIONS', 'CHECK_OBSERVATIONS_FILE',
           'DEFAULT_TOLERANCE', 'INT8_DOT_FLAGS', 'load_check_observations',
           'save_check_observations',
           'NATIVE_BF16_FLAGS', 'PrecisionCheck', 'PrecisionPlan', 'auto_precision',
           'check_observations', 'compare_backends', 'cpu_flags', 'cpu_has_native_bf16',
           'cpu_saturates_int8', 'parse_cpuinfo_flags', 'settle']
