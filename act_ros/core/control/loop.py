"""One control tick of the policy, without ROS: snapshot in, safe command out.

The same step runs everywhere a policy drives an arm: ``act_node`` hands
:meth:`ControlLoop.tick` the latest inputs from its subscriptions, and the closed-loop
evaluator (:mod:`act_ros.training.evaluation.rollout`) hands it the simulation's observations, so
the evaluation scores exactly what the node would send. The loop asks the policy runtime
for this tick's action, checks every newly finished chunk against the limits, runs the
action through the safety chain (finite -> joint limits -> max step relative to the
measured joints -> a release gate per gripper) and returns what may be sent, counting what
it changed in :class:`ControlCounters`. Both build it with :func:`build_control_loop`, from
a :class:`~act_ros.core.inference.runtime.RuntimeConfig` and :class:`SafetySettings`.

End-effector (one per gated gripper) and pad positions come from
:func:`ee_from_kinematics`, :func:`position_from_stream` or :func:`fixed_position`, as
configured (``ee_source``/``pad_source`` in ``config/act.yaml``; :func:`release_gates`).
A position stream older than the inputs' maximum age counts as unknown, and an unknown
position counts as "away from the pad": the gate never releases on stale information.

A checkpoint that takes the object poses (``observation.environment_state``) gets them
from an :class:`EnvironmentStateSource`: the node's pose subscriptions
(:func:`environment_state_from_object_poses`) or the simulation's ready vector
(:func:`environment_state_from_stream`). Its streams are required inputs like the cameras
(stale or missing: no command); a checkpoint without the feature needs none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from act_ros.core.control.command_plan import limit_plan
from act_ros.core.control.inputs import (
    EE_POSE,
    ENVIRONMENT_STATE,
    JOINT_EFFORTS,
    JOINT_STATES,
    PAD_POSE,
    Snapshot,
    image_stream,
    object_pose_stream,
    required_streams,
)
from act_ros.core.control.release_gate import GateState, GripperGate, ReleaseGateConfig, gripper_gates
from act_ros.core.control.safety import SafetyLimits, check_chunk, limit_command
from act_ros.core.control.seams import SeamMeter, arm_seam_meter
from act_ros.core.control.speed_limits import STEP_PARAM, VELOCITY_PARAM, resolve_speed_limits
from act_ros.core.errors import ObservationError
from act_ros.core.object_state import OBJECTS, environment_state_from_poses
from act_ros.core.observation import Observation
from act_ros.core.paths import config_path

if TYPE_CHECKING:
    from act_ros.core.contract import Contract
    from act_ros.core.control.kinematics import ForwardKinematics
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

logger = logging.getLogger(__name__)

WAITING_FOR_CHUNK = 'waiting for the first chunk'
#: Start of the reason of a tick with nothing to play after chunks came late: each arrived
#: after its last action was due (the model is slower than a chunk lasts).
CHUNKS_LATE = 'nothing to play: chunks come after their last action was due'


@dataclass
class ControlCounters:
    """What the control step (and the node's input callbacks) counted since configure."""

    commands_published: int = 0
    ticks_without_command: int = 0
    stale_ticks: int = 0
    commands_rejected: int = 0
    joint_limit_clamps: int = 0
    step_limit_clamps: int = 0
    chunks_checked: int = 0
    chunk_limit_violations: int = 0
    chunks_with_violations: int = 0
    nonfinite_chunk_steps: int = 0
    suppressed_releases: int = 0
    objects_lost: int = 0  # HOLDING -> FREE: the closed gripper measured empty
    runtime_resets: int = 0
    spurious_triggers: int = 0  # node, observation trigger: a tick with no new input set
    inference_failures: int = 0
    inference_failing: bool = False  # the last request failed; cleared by the next action
    last_inference_error: str = ''
    last_safety_reason: str = ''
    last_stale_reason: str = ''

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


EePosition = Callable[[Snapshot, np.ndarray], 'np.ndarray | None']
PadPosition = Callable[[Snapshot], 'np.ndarray | None']


def ee_from_kinematics(fk: ForwardKinematics, grippers: Sequence[int]) -> EePosition:
    """End effector by forward kinematics (``fk``, of the arm joints:
    :func:`act_ros.core.control.kinematics.gripper_kinematics`) of the measured joints without the
    grippers (at ``grippers`` in contract order)."""
    drop = list(grippers)

    def from_fk(snap: Snapshot, state: np.ndarray) -> np.ndarray | None:
        return fk.ee_position(np.delete(state, drop))
    return from_fk


def release_gates(contract: Contract, config: ReleaseGateConfig, *, ee_source: str = 'fk',
                  urdf_path: str | Path | None = None, ee_frame: str = '',
                  max_age_s: float = 0.2, off: Callable[[str], None] = lambda _why: None
                  ) -> tuple[tuple[GripperGate, ...], list[EePosition]]:
    """One release gate per gripper of ``contract`` with the source of its end effector
    (:class:`ControlLoop`'s ``gates`` and ``ee_positions``): forward kinematics
    (``ee_source`` ``'fk'``: :func:`act_ros.core.control.kinematics.gripper_kinematics` of
    ``urdf_path`` or the contract's URDF) or the :data:`EE_POSE` stream (``'topic'``, one
    gripper). None with the gate disabled (only the gates read an end effector), for an
    arm without gripper, or when no robot model serves this arm: then the gates are off
    and ``off`` is told why (never an error)."""
    from act_ros.core.control.kinematics import gripper_kinematics

    gates = gripper_gates(contract, config)
    if not gates:
        return (), []
    if ee_source == 'topic':
        if len(gates) > 1:
            raise ValueError(f'ee_source topic: ee_pose_topic is one end effector and the '
                             f'contract has {len(gates)} grippers {list(contract.gripper_joints)}'
                             ' (ee_source fk with an ee_frame per gripper in the contract, or '
                             'release_gate.enabled false)')
        return gates, [position_from_stream(EE_POSE, max_age_s)]
    fks, why = gripper_kinematics(contract, urdf_path=urdf_path or None, ee_frame=ee_frame)
    if why:
        off(why)
        return (), []
    return gates, [ee_from_kinematics(fk, contract.gripper_indices) for fk in fks]


def position_from_stream(stream: str, max_age_s: float) -> Callable[..., np.ndarray | None]:
    """The newest position on ``stream``; ``None`` when never received or older than
    ``max_age_s``. Usable as an end-effector or a pad source."""
    def from_stream(snap: Snapshot, *_state: Any) -> np.ndarray | None:
        age = snap.age_s(stream)
        return snap.value(stream) if age is not None and age <= max_age_s else None
    return from_stream


def fixed_position(position: Sequence[float]) -> PadPosition:
    """A position that never changes (the pad as a parameter)."""
    value = np.asarray(position, dtype=np.float64)
    if value.shape != (3,) or not np.all(np.isfinite(value)):
        raise ValueError(f'a fixed position needs 3 finite values (x, y, z in metres), got '
                         f'{list(position)}')
    return lambda snap: value


@dataclass(frozen=True)
class EnvironmentStateSource:
    """Where a tick's object poses come from: the input streams they need (required with
    the cameras, so they are age-checked like every input) and how the snapshot's samples
    become the ``(10,)`` vector (``ValueError`` when they cannot)."""

    streams: tuple[str, ...]
    compute: Callable[[Snapshot], np.ndarray]


def environment_state_from_object_poses(box_stream: str = object_pose_stream('box'),
                                        pad_stream: str = object_pose_stream('pad')
                                        ) -> EnvironmentStateSource:
    """From one pose stream per object (``(7,)``: position, then quaternion w, x, y, z,
    robot base frame), as ``act_node``'s pose subscriptions store them."""
    if OBJECTS != ('box', 'pad'):  # the order of the feature (act_ros.core.object_state)
        raise ValueError(f'object_state.OBJECTS is {OBJECTS}, this source reads box and pad')

    def compute(snap: Snapshot) -> np.ndarray:
        box, pad = snap.value(box_stream), snap.value(pad_stream)
        return environment_state_from_poses(box[:3], box[3:], pad[:3], pad[3:])
    return EnvironmentStateSource((box_stream, pad_stream), compute)


def environment_state_from_stream(stream: str = ENVIRONMENT_STATE) -> EnvironmentStateSource:
    """From a stream that holds the ready vector (the simulation's
    ``SimObservation.environment_state`` in the in-process evaluator)."""
    return EnvironmentStateSource((stream,), lambda snap: np.asarray(snap.value(stream)))


@dataclass(frozen=True)
class TickResult:
    """What one tick produced: a command to publish, or why there is none."""

    command: np.ndarray | None
    reason: str = ''
    obs_stamp_s: float | None = None


class ControlLoop:
    """Runtime + safety chain + release gates, driven one tick at a time.

    ``grippers``: the indices of the gripper joints (each rate-limited against its previous
    command); ``gates``: one release gate per gated gripper (none: no gate), with
    ``ee_positions`` beside them, each mapping (snapshot, measured joints in contract
    order) to that gripper's end-effector position or ``None`` when unknown;
    ``pad_position`` maps a snapshot to the pad position or ``None``. Unknown positions
    count as "not near the pad" for the gates.
    ``cameras``: the cameras the runtime's checkpoint takes (``runtime.cameras``).
    ``environment_state``: where the object poses come from; needed (else ``ValueError``)
    when the checkpoint takes them, unused otherwise. ``seams``: measures the seams of
    the commands this loop returns (:mod:`act_ros.core.control.seams`; every chunk computed joins
    its reference).
    """

    def __init__(self, runtime: PolicyRuntime, *, cameras: tuple[str, ...],
                 limits: SafetyLimits, grippers: Sequence[int] = (),
                 gates: Sequence[GripperGate] = (), ee_positions: Sequence[EePosition] = (),
                 pad_position: PadPosition = lambda _snap: None,
                 counters: ControlCounters | None = None,
                 environment_state: EnvironmentStateSource | None = None,
                 seams: SeamMeter | None = None) -> None:
        self.runtime = runtime
        self.seams = seams
        self.cameras = cameras
        self.takes_environment_state = bool(getattr(runtime, 'environment_state_dim', 0))
        if self.takes_environment_state and environment_state is None:
            raise ValueError('the checkpoint takes observation.environment_state (object poses) '
                             'but the control loop was given no source of them')
        self._environment_state = environment_state if self.takes_environment_state else None
        self.limits = limits
        if len(ee_positions) != len(gates):
            raise ValueError(f'{len(gates)} release gates need as many end-effector sources, '
                             f'got {len(ee_positions)}')
        self.grippers = tuple(grippers)
        self.gates = tuple(gates)
        self._ee_positions = tuple(ee_positions)
        self._pad_position = pad_position
        self.counters = counters if counters is not None else ControlCounters()
        self.stale = False
        # Per gate, the end effector to pad distance and the end-effector position it used
        # on the last tick that reached it, and the pad position (None: unknown), kept for
        # viewers (act_node's diagnostics and visualization): no extra work.
        self.last_distances_m: list[float | None] = [None] * len(self.gates)
        self.last_ee_positions: list[np.ndarray | None] = [None] * len(self.gates)
        self.last_pad_position: np.ndarray | None = None
        # The command sent on the previous tick: the gripper is rate-limited against it
        # (core.control.safety). None at an episode start, after a tick without a command and
        # after stale inputs: the measured position is the reference then.
        self.last_command: np.ndarray | None = None

    def reset(self) -> None:
        """New episode: empty queue/ensembler, gate back to FREE."""
        self.runtime.reset()
        for gated in self.gates:
            gated.gate.reset()
        if self.seams is not None:
            self.seams.break_stream()
        self.stale = False
        self.last_distances_m = [None] * len(self.gates)
        self.last_ee_positions = [None] * len(self.gates)
        self.last_pad_position = None
        self.last_command = None

    @property
    def required_inputs(self) -> list[str]:
        """The input streams every tick needs (an :class:`~act_ros.core.control.inputs.InputStore`'s
        ``required``): joint states, the checkpoint's cameras and, when it takes the
        object poses, the streams of their source."""
        source = self._environment_state
        return required_streams(self.cameras, source.streams if source is not None else ())

    @property
    def gate_state(self) -> str:
        """The gates' states in a word: a single gate's (FREE, HOLDING, RELEASED),
        ``'<gripper> <STATE>, ...'`` for several, ``'off'`` without a gate."""
        if len(self.gates) == 1:
            return self.gates[0].gate.state.value
        return ', '.join(f'{g.name} {g.gate.state.value}' for g in self.gates) or 'off'

    @property
    def last_distance_m(self) -> float | None:
        """The nearest end effector to pad distance on the last gated tick (``None``:
        unknown, or no gate)."""
        known = [d for d in self.last_distances_m if d is not None]
        return min(known) if known else None

    def tick(self, snap: Snapshot) -> TickResult:
        """Return this tick's command (or why there is none) for the inputs in ``snap``."""
        result = self._tick(snap)
        self.last_command = result.command
        if self.seams is not None:
            sent = result.command is not None
            self.seams.add_command(result.command, self.runtime.last_source if sent else None,
                                   transition=sent and self.runtime.last_transition)
        return result

    def safe_plan(self, horizon: int) -> np.ndarray | None:
        """This tick's command and the planned ones after it (at most ``horizon`` points,
        ``(K, J)``), every one through the safety chain
        (:func:`act_ros.core.control.command_plan.limit_plan`); ``None`` when the last tick sent
        nothing. Call right after :meth:`tick`."""
        if self.last_command is None:
            return None
        plan = self.runtime.plan(horizon)
        if plan is None:
            return self.last_command[None].copy()
        return limit_plan(plan, self.last_command, self.limits,
                          hold=[g.index for g in self.gates if g.gate.state == GateState.HOLDING])

    def observation(self, snap: Snapshot) -> tuple[Observation | None, str, float | None]:
        """The policy's observation of a usable ``snap`` (cameras, joints, object features)
        with its stamp (the oldest input's), or ``None`` and why not."""
        state = snap.value(JOINT_STATES)
        streams = [JOINT_STATES, *(image_stream(cam) for cam in self.cameras)]
        source = self._environment_state
        if source is not None:
            missing = [name for name in source.streams if name not in snap.samples]
            if missing:  # not among the store's required streams: a wiring mistake
                return None, f'object poses: {missing} never received', None
            streams += source.streams
        obs_stamp = min(snap.samples[name].stamp_s for name in streams)
        environment_state = None
        if source is not None:
            try:
                environment_state = source.compute(snap)
            except ValueError as exc:  # e.g. a zero quaternion: the pose means nothing
                return None, f'object poses unusable: {exc}', obs_stamp
        return (Observation(images={cam: snap.value(image_stream(cam)) for cam in self.cameras},
                            state=state, stamp_s=obs_stamp, environment_state=environment_state),
                '', obs_stamp)

    def _tick(self, snap: Snapshot) -> TickResult:
        c = self.counters
        if not snap.ok:
            # Stale or invalid inputs: send nothing; the runtime restarts when data returns,
            # so no action computed before the gap is played after it. The gate keeps its
            # state: a held object stays held through a sensor dropout.
            c.stale_ticks += 1
            c.last_stale_reason = snap.describe_problems()
            self.stale = True
            return TickResult(None, c.last_stale_reason)
        if self.stale:
            self.runtime.reset()
            c.runtime_resets += 1
            self.stale = False
        obs, why, obs_stamp = self.observation(snap)
        if obs is None:
            c.ticks_without_command += 1
            return TickResult(None, why, obs_stamp)
        try:
            action = self.runtime.act(obs)
        except ObservationError as exc:
            c.ticks_without_command += 1
            return TickResult(None, f'observation refused by the runtime: {exc}', obs_stamp)
        except RuntimeError as exc:  # the background inference failed; a later tick retries
            c.ticks_without_command += 1
            c.inference_failures += 1
            c.inference_failing = True
            c.last_inference_error = str(exc)
            return TickResult(None, f'inference failed: {exc}', obs_stamp)
        self._check_new_chunks()
        if action is not None:
            c.inference_failing = False
        if action is None:
            c.ticks_without_command += 1
            stats = self.runtime.stats
            if stats.chunks_late:
                return TickResult(None, f'{CHUNKS_LATE} ({stats.chunks_late} of '
                                  f'{stats.chunks_computed} chunks so far; the model takes '
                                  f'{stats.mean_inference_ms:.0f} ms)', obs_stamp)
            return TickResult(None, WAITING_FOR_CHUNK, obs_stamp)

        ees = [ee_position(snap, obs.state) for ee_position in self._ee_positions]
        pad = self._pad_position(snap)
        self.last_ee_positions, self.last_pad_position = ees, pad
        gates = [g.gate for g in self.gates]
        suppressed_before = sum(g.suppressed_releases for g in gates)
        lost_before = sum(g.objects_lost for g in gates)
        result = limit_command(action, obs.state, self.limits, grippers=self.grippers,
                               gates=self.gates, ee_positions=ees, pad_position=pad,
                               previous_command=self.last_command,
                               measured_effort=snap.value(JOINT_EFFORTS))
        c.suppressed_releases += sum(g.suppressed_releases for g in gates) - suppressed_before
        c.objects_lost += sum(g.objects_lost for g in gates) - lost_before
        if result.gates:
            self.last_distances_m = [decision.distance_m for decision in result.gates]
        if result.reason:
            c.last_safety_reason = result.reason
        if result.rejected:
            c.commands_rejected += 1
            return TickResult(None, result.reason, obs_stamp)
        c.joint_limit_clamps += int(result.limited.any())
        c.step_limit_clamps += int(result.step_limited.any())
        if not np.all(np.isfinite(result.command)):  # defence in depth: never send NaN
            c.commands_rejected += 1
            return TickResult(None, 'non-finite command after the safety chain', obs_stamp)
        return TickResult(result.command, result.reason, obs_stamp)

    def _check_new_chunks(self) -> None:
        c = self.counters
        for chunk in self.runtime.take_new_chunks():
            if self.seams is not None:
                self.seams.add_chunk(chunk)
            report = check_chunk(chunk, self.limits)
            c.chunks_checked += 1
            c.chunk_limit_violations += report.limit_violations
            c.nonfinite_chunk_steps += report.nonfinite_steps
            c.chunks_with_violations += int(not report.ok)


@dataclass(frozen=True)
class SafetySettings:
    """What the control step applies around the policy: joint limits and the largest step
    per tick, the release gate with its end-effector model (``urdf_path``, ``ee_frame``)
    and source (``ee_source`` fk or topic: the :data:`EE_POSE` stream), the pad position
    (``pad_position_m``; ``None``: the :data:`PAD_POSE` stream) and the inputs' maximum age.
    ``act_node`` makes it from its parameters, the in-process evaluator from the node's
    parameter file (:meth:`from_node_config`)."""

    limits: SafetyLimits
    gate: ReleaseGateConfig
    urdf_path: str = ''
    ee_frame: str = ''
    max_obs_age_s: float = 0.2
    ee_source: str = 'fk'
    pad_position_m: tuple[float, ...] | None = None

    @classmethod
    def from_node_config(cls, contract: Contract, path: str | Path | None = None, *,
                         gate_defaults: dict[str, Any] | None = None) -> SafetySettings:
        """Read limits, ``release_gate``, the kinematics and ``max_obs_age_s`` of act_node's
        parameter file (``config/act.yaml`` by default); ``gate_defaults``: release gate
        settings the caller's arm implies where the file sets none (a simulation's effort
        evidence)."""
        path = Path(path) if path else config_path('act.yaml')
        data = yaml.safe_load(Path(path).read_text()) or {}
        params: dict[str, Any] = {}
        for value in data.values():
            if isinstance(value, dict) and 'ros__parameters' in value:
                params = value['ros__parameters']
        # The node's speed limits at its control rate (the file's, else the contract's fps,
        # as act_node takes it: the simulation's rate), the URDF's where the file sets none.
        period_s = 1.0 / float(params.get('control_rate_hz') or contract.fps)
        urdf_path = str(params.get('urdf_path', '') or '')
        try:
            speeds = resolve_speed_limits(
                contract.joint_names, contract.lower, contract.upper,
                grippers=contract.gripper_indices, velocity=params.get(VELOCITY_PARAM),
                step_per_tick=params.get(STEP_PARAM), period_s=period_s,
                urdf_path=urdf_path or contract.urdf_path)
        except ValueError as exc:
            raise ValueError(f'{path}: {exc}') from None
        if speeds.deprecation:
            logger.warning('%s: %s', path, speeds.deprecation)
        limits = SafetyLimits(lower=np.asarray(params.get('joint_lower', contract.lower)),
                              upper=np.asarray(params.get('joint_upper', contract.upper)),
                              max_step=speeds.per_tick(period_s))
        gate = {**(gate_defaults or {}), **params.get('release_gate', {})}
        return cls(limits=limits, gate=ReleaseGateConfig(**gate),
                   urdf_path=urdf_path, ee_frame=str(params.get('ee_frame', '') or ''),
                   max_obs_age_s=float(params.get('max_obs_age_s', 0.2)))


def build_control_loop(runtime: RuntimeConfig, contract: Contract, safety: SafetySettings, *,
                       environment_state: EnvironmentStateSource, period_s: float,
                       joint_names: Sequence[str] | None = None,
                       seam_window_ticks: int | None = None,
                       counters: ControlCounters | None = None,
                       gate_off: Callable[[str], None] = lambda _why: None,
                       wait: bool = True) -> ControlLoop:
    """The control loop of every caller (``act_node``, the in-process evaluator and DAgger):
    a release gate per gripper with its end-effector source and the pad's position from
    ``safety`` (checked first, so a bad setting fails before the model loads), then the
    policy runtime of ``runtime``: loaded and warmed up, except with ``execution:
    process`` and ``wait=False``, where the inference child is started and the caller waits
    for it with ``loop.runtime.wait_ready()``. The loop takes the cameras the checkpoint
    takes and, when it takes ``observation.environment_state``, the object poses from
    ``environment_state`` (``loop.required_inputs``). Gates that need forward kinematics
    without a robot model of this arm are left off, and ``gate_off`` is told why.
    ``period_s``, ``joint_names`` (default: the contract's) and ``seam_window_ticks``
    (``None``: since the start): the seam meter's (:mod:`act_ros.core.control.seams`)."""
    from act_ros.core.inference.runtime import PolicyRuntime

    gates, ee_positions = release_gates(
        contract, safety.gate, ee_source=safety.ee_source, urdf_path=safety.urdf_path,
        ee_frame=safety.ee_frame, max_age_s=safety.max_obs_age_s, off=gate_off)
    pad_position = (position_from_stream(PAD_POSE, safety.max_obs_age_s)
                    if safety.pad_position_m is None else fixed_position(safety.pad_position_m))
    policy = PolicyRuntime(runtime, wait=wait)
    try:
        return ControlLoop(policy, cameras=policy.cameras, limits=safety.limits,
                           grippers=contract.gripper_indices, gates=gates,
                           ee_positions=ee_positions, pad_position=pad_position,
                           counters=counters, environment_state=environment_state,
                           seams=arm_seam_meter(joint_names or contract.joint_names,
                                                contract.gripper_indices, period_s,
                                                seam_window_ticks))
    except BaseException:
        policy.close()  # its inference child must not outlive a failed build
        raise
