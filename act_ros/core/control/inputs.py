"""Latest-value store of the node's input streams, with staleness and rejection tracking.

Subscription callbacks only convert a message and :meth:`InputStore.put` the result (or
:meth:`InputStore.reject` it); the control tick takes a :meth:`InputStore.snapshot`. The
store is ROS-free apart from the times it is handed (node-clock seconds), so it also works
with simulated time.

A rejected message invalidates its stream until the next good message: a sensor that
sends garbage stops the commands at once instead of leaving an older value in use, whether
the stream is required or optional (the release gate's pad and end-effector poses).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Stream names shared by the node, the evaluator and the recorder.
JOINT_STATES = 'joint_states'
# The joints' efforts from the same JointState (contract order, NaN where unknown; None
# when a message carries none): the release gate's evidence of an empty gripper. Optional.
JOINT_EFFORTS = 'joint_efforts'
EE_POSE = 'ee_pose'
PAD_POSE = 'pad_pose'
# The policy's object poses as one ready vector (the in-process evaluator, from the
# simulation): act_ros.core.object_state.ENVIRONMENT_STATE_NAMES.
ENVIRONMENT_STATE = 'environment_state'


def image_stream(camera: str) -> str:
    """Name of a camera's stream in the input store."""
    return f'image/{camera}'


def object_pose_stream(obj: str) -> str:
    """Name of an object's pose stream (position and orientation, ``(7,)``: x, y, z, then
    the quaternion w, x, y, z; robot base frame) in the input store."""
    return f'object_pose/{obj}'


def required_streams(camera_names: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """Streams every control tick needs: the joint states, each camera and ``extra`` (the
    object pose streams of a policy that takes them)."""
    return [JOINT_STATES] + [image_stream(cam) for cam in camera_names] + list(extra)


@dataclass(frozen=True)
class Sample:
    """One converted message: value, receive time and header stamp (node-clock seconds)."""

    value: Any
    received_s: float
    stamp_s: float
    seq: int


@dataclass(frozen=True)
class Snapshot:
    """The latest sample of every stream at one instant, and why the required ones are unusable."""

    samples: dict[str, Sample]
    problems: dict[str, str]  # required stream -> 'never received' / 'stale (0.31 s old)' / ...
    now_s: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def value(self, name: str) -> Any:
        sample = self.samples.get(name)
        return None if sample is None else sample.value

    def age_s(self, name: str) -> float | None:
        sample = self.samples.get(name)
        return None if sample is None else self.now_s - sample.received_s

    def describe_problems(self, sources: Mapping[str, str] | None = None) -> str:
        """``'image/top: never received; ...'``; with ``sources`` (stream -> where it comes
        from, e.g. the node's topic and QoS) each stream named with its source:
        ``'image/top on /top/image_raw (sensor_msgs/Image, best effort, depth 5): never
        received'``."""
        sources = sources or {}
        return '; '.join(f'{name} on {sources[name]}: {why}' if name in sources
                         else f'{name}: {why}' for name, why in sorted(self.problems.items()))


class InputStore:
    """Thread-safe latest-value store for named streams.

    ``required`` streams must all be present and younger than ``max_age_s`` for a
    snapshot to be usable; other streams (poses) are stored and aged but optional.
    """

    def __init__(self, required: Iterable[str], max_age_s: float) -> None:
        self.required = tuple(required)
        self.max_age_s = float(max_age_s)
        self._lock = threading.Lock()
        self._samples: dict[str, Sample] = {}
        self._invalid: dict[str, str] = {}
        self._seq = 0
        self._consumed: dict[str, int] = {}
        self.rejections = 0
        self.rejections_by_stream: dict[str, int] = {}
        self.last_rejection = ''

    def put(self, name: str, value: Any, received_s: float, stamp_s: float) -> None:
        """Store the newest good value of a stream."""
        with self._lock:
            self._seq += 1
            self._samples[name] = Sample(value, received_s, stamp_s, self._seq)
            self._invalid.pop(name, None)

    def reject(self, name: str, reason: str) -> str:
        """Record a malformed message; the stream is unusable until its next good message.

        Returns the one-line description that was recorded.
        """
        line = f'{name}: {reason}'
        with self._lock:
            self._samples.pop(name, None)
            self._invalid[name] = f'rejected ({reason})'
            self.rejections += 1
            self.rejections_by_stream[name] = self.rejections_by_stream.get(name, 0) + 1
            self.last_rejection = line
        return line

    def clear(self) -> None:
        """Forget every sample (on cleanup); counters are kept."""
        with self._lock:
            self._samples.clear()
            self._invalid.clear()
            self._consumed.clear()

    def snapshot(self, now_s: float) -> Snapshot:
        """Latest samples and the problems at ``now_s``: those of the required streams
        (missing, stale, rejected), and any other stream whose newest message was rejected
        (a pose in the wrong frame on the gate's pad or end-effector topic stops the
        commands like a malformed camera image; one never received or stale does not)."""
        with self._lock:
            samples = dict(self._samples)
            invalid = dict(self._invalid)
        problems = {name: why for name, why in invalid.items() if name not in self.required}
        for name in self.required:
            sample = samples.get(name)
            if sample is None:
                problems[name] = invalid.get(name, 'never received')
            elif now_s - sample.received_s > self.max_age_s:
                problems[name] = (f'stale ({now_s - sample.received_s:.3f} s old, '
                                  f'max {self.max_age_s:.3f} s)')
        return Snapshot(samples, problems, now_s)

    def take_synchronized(self, tolerance_s: float, *, consume: bool = True) -> bool:
        """Whether every required stream has a new sample and their stamps agree.

        Used by the observation trigger (lock-step simulation): returns ``True`` once per
        set of new messages whose header stamps lie within ``tolerance_s`` of each other,
        and marks them consumed (``consume=False``: only says whether such a set is there).
        """
        with self._lock:
            samples = [self._samples.get(name) for name in self.required]
            if any(s is None or s.seq <= self._consumed.get(n, 0)
                   for n, s in zip(self.required, samples)):
                return False
            stamps = [s.stamp_s for s in samples]
            if max(stamps) - min(stamps) > tolerance_s:
                return False
            if consume:
                for name, sample in zip(self.required, samples):
                    self._consumed[name] = sample.seq
            return True
