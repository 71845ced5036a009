"""One control tick of the policy, without ROS: snapshot in, safe command out.

The same step runs everywhere a policy drives an arm: ``act_node`` hands
:meth:`ControlLoop.tick` the latest inputs from its subscriptions, and the closed-loop
evaluator (:mod:`act_ros.training.rollout`) hands it the simulation's observations, so
the evaluation scores exactly what the node would send. The loop asks the policy runtime
for this tick's action, checks every newly finished chunk against the limits, runs the
action through the safety chain (finite -> joint limits -> max step relative to the
measured joints -> release gate) and returns what may be sent, counting what it changed
in :class:`ControlCounters`.

End-effector and pad positions come from :func:`ee_from_kinematics`,
:func:`position_from_stream` or :func:`fixed_position`, as configured
(``ee_source``/``pad_source`` in ``config/act.yaml``). A position stream older than the
inputs' maximum age counts as unknown, and an unknown position counts as "away from the
pad": the gate never releases on stale information.

A checkpoint that takes the object poses (``observation.environment_state``) gets them
from an :class:`EnvironmentStateSource`: the node's pose subscriptions
(:func:`environment_state_from_object_poses`) or the simulation's ready vector
(:func:`environment_state_from_stream`). Its streams are required inputs like the cameras
(stale or missing: no command); a checkpoint without the feature needs none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from act_ros.core.command_plan import limit_plan
from act_ros.core.errors import ObservationError
from act_ros.core.inputs import (ENVIRONMENT_STATE, JOINT_STATES, Snapshot, image_stream,
                                 object_pose_stream, required_streams)
from act_ros.core.object_state import OBJECTS, environment_state_from_poses
from act_ros.core.observation import Observation
from act_ros.core.release_gate import GateState, ReleaseGate
from act_ros.core.safety import SafetyLimits, check_chunk, limit_command
from act_ros.core.seams import SeamMeter

if TYPE_CHECKING:
    from act_ros.core.runtime import PolicyRuntime

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


def ee_from_kinematics(joint_names: Sequence[str], gripper_index: int, *,
                       urdf_path: str | Path | None = None,
                       ee_frame: str = 'ee_link') -> EePosition:
    """End effector by forward kinematics of the measured arm joints (the robot model)."""
    from act_ros.core.kinematics import ForwardKinematics

    arm = [name for i, name in enumerate(joint_names) if i != gripper_index]
    fk = ForwardKinematics(urdf_path=urdf_path or None, ee_frame=ee_frame, joint_names=arm)

    def from_fk(snap: Snapshot, state: np.ndarray) -> np.ndarray | None:
        return fk.ee_position(np.delete(state, gripper_index))
    return from_fk


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
    """Runtime + safety chain + release gate, driven one tick at a time.

    ``ee_position`` maps (snapshot, measured joints in contract order) to the end-effector
    position or ``None`` when unknown; ``pad_position`` maps a snapshot to the pad position
    or ``None``. Unknown positions count as "not near the pad" for the gate.
    ``cameras``: the cameras the runtime's checkpoint takes (``runtime.cameras``).
    ``environment_state``: where the object poses come from; needed (else ``ValueError``)
    when the checkpoint takes them, unused otherwise. ``seams``: measures the seams of
    the commands this loop returns (:mod:`act_ros.core.seams`; every chunk computed joins
    its reference).
    """

    def __init__(self, runtime: PolicyRuntime, *, cameras: tuple[str, ...],
                 limits: SafetyLimits, gate: ReleaseGate, gripper_index: int,
                 ee_position: EePosition, pad_position: PadPosition,
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
        self.gate = gate
        self.gripper_index = gripper_index
        self._ee_position = ee_position
        self._pad_position = pad_position
        self.counters = counters if counters is not None else ControlCounters()
        self.stale = False
        self.last_distance_m: float | None = None
        # The end-effector and pad positions the gate used on the last tick that reached
        # it (None: unknown), kept for viewers (act_node's visualization): no extra work.
        self.last_ee_position: np.ndarray | None = None
        self.last_pad_position: np.ndarray | None = None
        # The command sent on the previous tick: the gripper is rate-limited against it
        # (core.safety). None at an episode start, after a tick without a command and
        # after stale inputs: the measured position is the reference then.
        self.last_command: np.ndarray | None = None

    def reset(self) -> None:
        """New episode: empty queue/ensembler, gate back to FREE."""
        self.runtime.reset()
        self.gate.reset()
        if self.seams is not None:
            self.seams.break_stream()
        self.stale = False
        self.last_distance_m = None
        self.last_ee_position = None
        self.last_pad_position = None
        self.last_command = None

    @property
    def required_inputs(self) -> list[str]:
        """The input streams every tick needs (an :class:`~act_ros.core.inputs.InputStore`'s
        ``required``): joint states, the checkpoint's cameras and, when it takes the
        object poses, the streams of their source."""
        source = self._environment_state
        return required_streams(self.cameras, source.streams if source is not None else ())

    @property
    def gate_state(self) -> GateState:
        return self.gate.state

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
        (:func:`act_ros.core.command_plan.limit_plan`); ``None`` when the last tick sent
        nothing. Call right after :meth:`tick`."""
        if self.last_command is None:
            return None
        plan = self.runtime.plan(horizon)
        if plan is None:
            return self.last_command[None].copy()
        return limit_plan(plan, self.last_command, self.limits,
                          gripper_index=self.gripper_index,
                          hold_gripper=self.gate.state == GateState.HOLDING)

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
        state = snap.value(JOINT_STATES)
        streams = [JOINT_STATES, *(image_stream(cam) for cam in self.cameras)]
        source = self._environment_state
        if source is not None:
            missing = [name for name in source.streams if name not in snap.samples]
            if missing:  # not among the store's required streams: a wiring mistake
                c.ticks_without_command += 1
                return TickResult(None, f'object poses: {missing} never received')
            streams += source.streams
        obs_stamp = min(snap.samples[name].stamp_s for name in streams)
        environment_state = None
        if source is not None:
            try:
                environment_state = source.compute(snap)
            except ValueError as exc:  # e.g. a zero quaternion: the pose means nothing
                c.ticks_without_command += 1
                return TickResult(None, f'object poses unusable: {exc}', obs_stamp)
        obs = Observation(images={cam: snap.value(image_stream(cam)) for cam in self.cameras},
                          state=state, stamp_s=obs_stamp, environment_state=environment_state)
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

        ee = self._ee_position(snap, state)
        pad = self._pad_position(snap)
        self.last_ee_position, self.last_pad_position = ee, pad
        suppressed_before = self.gate.suppressed_releases
        lost_before = self.gate.objects_lost
        result = limit_command(action, state, self.limits, gripper_index=self.gripper_index,
                               gate=self.gate, ee_position=ee, pad_position=pad,
                               previous_command=self.last_command)
        c.suppressed_releases += self.gate.suppressed_releases - suppressed_before
        c.objects_lost += self.gate.objects_lost - lost_before
        if result.gate is not None:
            self.last_distance_m = result.gate.distance_m
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
