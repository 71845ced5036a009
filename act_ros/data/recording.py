"""Demonstrations from ROS 2 topics to dataset frames: the rules the recorder and the bag
importer share (no ROS needed).

A recording samples the inputs at the contract's fps. At each tick it takes the newest
message of every input (the two cameras, the joint states and the action source) and
keeps the frame only if every one of them is younger than ``tolerance_s``; otherwise the
tick is dropped and counted by reason, never filled with stale data. Joints are matched
by name; images are converted to RGB and resized to the dataset's size.

The action recorded at a tick is the newest command sent to the arm (the positions of a
``JointTrajectory``'s first point, or a ``Float64MultiArray`` in contract order), or the
joint positions of a leader arm (``sensor_msgs/JointState``), as configured.

``act_ros.ros.recording.record_node`` feeds the :class:`~act_ros.core.control.inputs.InputStore` from
subscriptions on the node clock; ``act_ros.data.bag_import`` from the messages of a
rosbag2 file on its log time. Both then call :meth:`EpisodeBuffer.sample`.

Frame times. LeRobot (0.6) stores frame ``i`` of an episode at ``timestamp = i / fps``:
its ``add_frame`` computes the timestamp itself (a caller may not give one), the videos
are encoded at a constant frame rate, and the loader fetches each frame's image at its
timestamp within ``tolerance_s`` (1e-4 s by default). An episode therefore cannot hold a
gap: a frame written after a tick that was dropped is read as if it had been sampled one
period after the frame before it (the episode plays faster than it happened). Given the
time each frame was sampled (``at``), :meth:`EpisodeBuffer.gap_before` says how many
ticks are missing before it; the recorder ends the episode there and continues in a new
one (marked as its continuation), so that ``i / fps`` is the time of frame ``i`` from its
episode's start. Splitting, not repeating frames, because LeRobot's own recorder
(``lerobot-record``'s record loop) repeats none: a loop that runs late only logs "Record
loop is running slower" and its frames are squeezed; what it does repeat is a camera's last
image (``read_latest``, up to 500 ms old), which ``tolerance_s`` does here within a tick.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from act_ros.core.contract import Contract
from act_ros.core.control.decode import (
    compressed_to_rgb,
    image_to_rgb,
    joint_positions,
    multiarray_positions,
    trajectory_positions,
)
from act_ros.core.control.inputs import JOINT_STATES, InputStore, Snapshot, image_stream, required_streams
from act_ros.data.episode import Episode

ACTION = 'action'
ACTION_SOURCES = ('command', 'leader')
COMMAND_TYPES = ('JointTrajectory', 'Float64MultiArray')
IMAGE_TRANSPORTS = ('raw', 'compressed')

#: ROS message type of each stream, by setting (rosbag2 stores these names).
IMAGE_TYPES = {'raw': 'sensor_msgs/msg/Image', 'compressed': 'sensor_msgs/msg/CompressedImage'}
COMMAND_MSG_TYPES = {'JointTrajectory': 'trajectory_msgs/msg/JointTrajectory',
                     'Float64MultiArray': 'std_msgs/msg/Float64MultiArray'}
JOINT_STATE_TYPE = 'sensor_msgs/msg/JointState'


@dataclass(frozen=True)
class RecordingSpec:
    """Which topics hold what, and how frames are sampled (recorder and importer alike).

    ``camera_topics`` maps contract camera names to topics (``<topic>/compressed`` is read
    for compressed transport, as image_transport publishes it). ``image_transport`` is the
    transport of every camera not named in ``camera_transports`` (camera -> ``raw`` or
    ``compressed``: real setups mix them). ``action_topic`` is the
    controller's command topic (``action_source: command``) or the leader arm's joint
    states (``leader``). ``leader_joint_names``: the leader's joint names in contract
    order, when they differ from the follower's ``joint_names``.
    """

    joint_names: tuple[str, ...]
    camera_topics: dict[str, str]
    joint_states_topic: str = 'joint_states'
    action_source: str = 'command'
    action_topic: str = 'joint_trajectory_controller/joint_trajectory'
    command_type: str = 'JointTrajectory'
    leader_joint_names: tuple[str, ...] = ()
    image_transport: str = 'raw'
    camera_transports: dict[str, str] = field(default_factory=dict)
    image_height: int = 480
    image_width: int = 640
    fps: int = 30
    tolerance_s: float = 0.1
    task: str = ''
    max_episode_s: float = 0.0  # 0: episodes end only when saved

    def __post_init__(self) -> None:
        if self.action_source not in ACTION_SOURCES:
            raise ValueError(f"action_source must be one of {ACTION_SOURCES}, got "
                             f"'{self.action_source}'")
        if self.command_type not in COMMAND_TYPES:
            raise ValueError(f"command_type must be one of {COMMAND_TYPES}, got "
                             f"'{self.command_type}'")
        if self.image_transport not in IMAGE_TRANSPORTS:
            raise ValueError(f"image_transport must be one of {IMAGE_TRANSPORTS}, got "
                             f"'{self.image_transport}'")
        for cam, transport in self.camera_transports.items():
            if cam not in self.camera_topics:
                raise ValueError(f"camera_transports names camera '{cam}', expected one of "
                                 f'{sorted(self.camera_topics)}')
            if transport not in IMAGE_TRANSPORTS:
                raise ValueError(f"camera '{cam}': transport must be one of {IMAGE_TRANSPORTS}, "
                                 f"got '{transport}'")
        if self.fps < 1:
            raise ValueError(f'fps must be >= 1, got {self.fps}')
        if not (math.isfinite(self.tolerance_s) and self.tolerance_s > 0):
            raise ValueError(f'tolerance_s must be > 0, got {self.tolerance_s}')
        if self.image_height < 2 or self.image_width < 2:
            raise ValueError(f'image size must be at least 2x2, got '
                             f'{self.image_height}x{self.image_width}')
        if not self.max_episode_s >= 0:
            raise ValueError(f'max_episode_s must be >= 0 (0 = no limit), got '
                             f'{self.max_episode_s}')
        if self.leader_joint_names and len(self.leader_joint_names) != len(self.joint_names):
            raise ValueError(f'leader_joint_names has {len(self.leader_joint_names)} names, '
                             f'the contract has {len(self.joint_names)} joints')
        topics = [self.joint_states_topic, self.action_topic, *self.camera_topics.values()]
        if len(set(topics)) != len(topics):
            raise ValueError(f'every input needs its own topic, got {topics}')

    @classmethod
    def for_contract(cls, contract: Contract, **values: Any) -> RecordingSpec:
        """A spec with the contract's joints, camera topics, fps, image size and task as
        defaults (``values`` override them)."""
        defaults: dict[str, Any] = dict(
            joint_names=tuple(contract.joint_names),
            camera_topics={cam.name: f'camera/{cam.name}/image_raw' for cam in contract.cameras},
            fps=contract.fps, task=contract.task,
            image_height=contract.cameras[0].height, image_width=contract.cameras[0].width)
        defaults.update(values)
        return cls(**defaults)

    @property
    def period_s(self) -> float:
        return 1.0 / self.fps

    @property
    def max_frames(self) -> int:
        return int(round(self.max_episode_s * self.fps)) if self.max_episode_s else 0

    def transport(self, camera: str) -> str:
        """``raw`` or ``compressed``: how ``camera`` is read."""
        return self.camera_transports.get(camera, self.image_transport)

    def image_topic(self, camera: str) -> str:
        topic = self.camera_topics[camera]
        return f'{topic}/compressed' if self.transport(camera) == 'compressed' else topic

    def topic_streams(self) -> dict[str, tuple[str, str]]:
        """Topic -> (stream name, ROS message type) of every input."""
        out = {self.joint_states_topic: (JOINT_STATES, JOINT_STATE_TYPE)}
        out[self.action_topic] = (ACTION, JOINT_STATE_TYPE if self.action_source == 'leader'
                                  else COMMAND_MSG_TYPES[self.command_type])
        for cam in self.camera_topics:
            out[self.image_topic(cam)] = (image_stream(cam), IMAGE_TYPES[self.transport(cam)])
        return out

    def streams(self) -> list[str]:
        return required_streams(tuple(self.camera_topics)) + [ACTION]

    def converter(self, stream: str):
        """The function turning a message of ``stream`` into the value a frame stores."""
        size = (self.image_height, self.image_width)
        if stream == JOINT_STATES:
            names = self.joint_names
            return lambda msg: joint_positions(msg, names)
        if stream == ACTION:
            if self.action_source == 'leader':
                names = self.leader_joint_names or self.joint_names
                return lambda msg: joint_positions(msg, names)
            if self.command_type == 'JointTrajectory':
                names = self.joint_names
                return lambda msg: trajectory_positions(msg, names)
            count = len(self.joint_names)
            return lambda msg: multiarray_positions(msg, count)
        camera = next((c for c in self.camera_topics if image_stream(c) == stream), None)
        if camera is None:
            raise ValueError(f"unknown stream '{stream}', expected one of {self.streams()}")
        decode = compressed_to_rgb if self.transport(camera) == 'compressed' else image_to_rgb
        return lambda msg: resize_rgb(decode(msg), size)

    def with_values(self, **values: Any) -> RecordingSpec:
        return replace(self, **values)


def resize_rgb(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(H, W, 3) uint8 -> ``size`` with the interpolation the runtime and trainer use."""
    import cv2

    h, w = size
    if image.shape[:2] == (h, w):
        return image
    shrinking = image.shape[0] > h or image.shape[1] > w
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking
                      else cv2.INTER_LINEAR)


def load_spec(path: str | Path, contract: Contract, **overrides: Any) -> RecordingSpec:
    """A :class:`RecordingSpec` from a YAML file (keys are its fields, under ``recording:``
    or at top level); ``overrides`` (e.g. from the command line) win."""
    from dataclasses import fields

    from act_ros.core.paths import load_yaml_mapping

    data = load_yaml_mapping(path, 'recording spec')
    body = data.get('recording', data)
    known = {f.name for f in fields(RecordingSpec)}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f'{path}: unknown settings {unknown} (expected some of {sorted(known)})')
    values = dict(body)
    for key in ('joint_names', 'leader_joint_names'):
        if key in values:
            values[key] = tuple(values[key])
    for key in ('camera_topics', 'camera_transports'):
        if key in values and not isinstance(values[key], dict):
            raise ValueError(f'{path}: {key} must be a mapping camera -> value, got '
                             f'{values[key]!r}')
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RecordingSpec.for_contract(contract, **values)


@dataclass
class DropCounts:
    """Ticks that did not become frames, by reason (``'image/top: stale (0.31 s old...)'``
    is counted as ``'image/top stale'``)."""

    by_reason: Counter = field(default_factory=Counter)

    def add(self, problems: dict[str, str]) -> None:
        for stream, why in problems.items():
            self.by_reason[f'{stream} {why.split(" ")[0]}'] += 1

    @property
    def total(self) -> int:
        return int(sum(self.by_reason.values()))

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.by_reason.items()))


class FrameSink(Protocol):
    """Where an :class:`EpisodeBuffer` streams its frames instead of keeping them
    (:class:`act_ros.data.writer.AtomicDatasetWriter`, the recorder's episode writer)."""

    def add_frame(self, images: dict[str, np.ndarray], state: np.ndarray,
                  action: np.ndarray) -> bool:
        """Take one frame; False when it could not be taken (the writer is behind)."""
        ...


#: Drop reason of a tick whose frame the writer could not take (its queue was full).
WRITER_BEHIND = 'writer behind'
#: Drop reason of a tick that was never sampled (the timer ran late and skipped it, or an
#: instant whose messages never all arrived in lock-step recording).
TICK_MISSED = 'tick missed'


class EpisodeBuffer:
    """The frames of the episode being recorded, one :meth:`sample` per tick.

    A tick whose inputs are incomplete or older than the tolerance is dropped: counted in
    :attr:`drops` (per reason; a tick can have several) and :attr:`dropped_ticks`.

    Frames given their sample time (``at``, seconds) keep it: the first one sets
    :attr:`start_s`, each later one must fall on the next tick (``start_s + i / fps``
    within half a period); :meth:`gap_before` says how many ticks a frame would skip, and
    one that skips any is refused (the caller starts a new episode: see the module
    docstring). ``chain_frames`` counts the frames of the episodes this one continues
    (``max_episode_s`` is the length of the whole chain).

    With a ``sink`` every frame goes to it as it comes (to disk: memory does not grow with
    the episode) and only the counts are kept here; a frame the sink refuses is a dropped
    tick (``writer behind``). Without one the frames are kept in memory for
    :meth:`episode` (short episodes, tests).
    """

    def __init__(self, spec: RecordingSpec, contract: Contract,
                 sink: FrameSink | None = None, chain_frames: int = 0) -> None:
        self.spec = spec
        self.contract = contract
        self.cameras = tuple(spec.camera_topics)
        if set(self.cameras) != set(contract.camera_names):
            raise ValueError(f'camera_topics names {sorted(self.cameras)}, the contract has '
                             f'{sorted(contract.camera_names)}')
        self.sink = sink
        self.chain_frames = int(chain_frames)
        self.clear()

    def clear(self) -> None:
        """Forget the frames and counts (the sink keeps what it was given)."""
        self._images: dict[str, list[np.ndarray]] = {cam: [] for cam in self.cameras}
        self._state: list[np.ndarray] = []
        self._action: list[np.ndarray] = []
        self._frames = 0
        self.drops = DropCounts()
        self.dropped_ticks = 0
        self.start_s: float | None = None  # sample time of the first frame
        self._last_tick = -1  # tick of the last frame, counted from start_s
        self._trailing_drops = 0  # ticks dropped since the last frame
        self._accounted_s: float | None = None  # before the first frame: the last tick counted

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def full(self) -> bool:
        """Whether the automatic episode length (``max_episode_s``) is reached (by this
        episode and those it continues)."""
        return (bool(self.spec.max_frames)
                and self.chain_frames + self.frames >= self.spec.max_frames)

    @property
    def drop_fraction(self) -> float:
        """Dropped ticks over all ticks of this episode (frames and drops)."""
        ticks = self.frames + self.dropped_ticks
        return self.dropped_ticks / ticks if ticks else 0.0

    def _tick_of(self, at: float) -> int:
        return int(round((at - self.start_s) * self.spec.fps))

    def gap_before(self, at: float | None) -> int:
        """Ticks missing between the last frame and a frame sampled at ``at`` (0: it is
        the next tick, the first frame, or untimed)."""
        if at is None or self.start_s is None:
            return 0
        return max(0, self._tick_of(at) - self._last_tick - 1)

    def close_gap(self, at: float) -> int:
        """End this episode before a frame at ``at`` that :meth:`gap_before` refuses: the
        missing ticks not counted yet (never sampled: :data:`TICK_MISSED`) are counted
        here. Returns the missing ticks."""
        missing = self.gap_before(at)
        uncounted = missing - self._trailing_drops
        if uncounted > 0:
            self.drops.by_reason[TICK_MISSED] += uncounted
            self.dropped_ticks += uncounted
            self._trailing_drops += uncounted
        return missing

    def _count_missed_before(self, at: float | None) -> None:
        """Before the first frame: count the ticks between the last one counted and ``at``
        that were never sampled."""
        if at is None or self.start_s is not None:
            return
        if self._accounted_s is not None:
            missed = int(round((at - self._accounted_s) * self.spec.fps)) - 1
            if missed > 0:
                self.drops.by_reason[TICK_MISSED] += missed
                self.dropped_ticks += missed
        self._accounted_s = at

    def take_leading_drops(self, other: EpisodeBuffer) -> None:
        """Count as this episode's the ticks ``other`` dropped without a frame (an episode
        that waited for its writer)."""
        self.drops.by_reason.update(other.drops.by_reason)
        self.dropped_ticks += other.dropped_ticks
        self._accounted_s = other._accounted_s

    def drop(self, reason: str | None = None, problems: dict[str, str] | None = None,
             at: float | None = None) -> None:
        """Count a dropped tick (``reason``, or the streams' ``problems``) sampled at
        ``at``."""
        self._count_missed_before(at)
        if problems:
            self.drops.add(problems)
        if reason:
            self.drops.by_reason[reason] += 1
        self.dropped_ticks += 1
        self._trailing_drops += 1

    def _append(self, images: dict[str, np.ndarray], state: Any, action: Any,
                at: float | None = None) -> bool:
        if at is not None and self.start_s is not None:
            tick = self._tick_of(at)
            if tick > self._last_tick + 1:
                raise ValueError(f'a frame {tick - self._last_tick - 1} tick(s) after the last '
                                 'one: LeRobot would place it one period after it (end the '
                                 'episode and continue in a new one)')
            if tick <= self._last_tick:  # sampled within the tick of the last frame
                self.drop('too early')
                return False
        if at is not None and self.start_s is None:
            self._count_missed_before(at)
        state = np.asarray(state, dtype=np.float32)
        action = np.asarray(action, dtype=np.float32)
        if self.sink is not None:
            if not self.sink.add_frame(images, state, action):
                self.drop(WRITER_BEHIND, at=at)
                return False
        else:
            for cam in self.cameras:
                self._images[cam].append(images[cam])
            self._state.append(state)
            self._action.append(action)
        if at is not None:
            if self.start_s is None:
                self.start_s, self._last_tick = float(at), 0
            else:
                self._last_tick += 1
        self._trailing_drops = 0
        self._frames += 1
        return True

    def add_frame(self, values: dict[str, Any], at: float | None = None) -> bool:
        """Add a frame of matched values (``{stream: value}``, lock-step recording),
        sampled at ``at`` (its stamp)."""
        return self._append({cam: values[image_stream(cam)] for cam in self.cameras},
                            values[JOINT_STATES], values[ACTION], at)

    def sample(self, snap: Snapshot, at: float | None = None) -> bool:
        """Add the frame of this tick (True; ``at``: the tick's time) or count why it was
        dropped (False)."""
        if not snap.ok:
            self.drop(problems=snap.problems, at=at)
            return False
        return self._append({cam: snap.value(image_stream(cam)) for cam in self.cameras},
                            snap.value(JOINT_STATES), snap.value(ACTION), at)

    def summary(self) -> dict[str, Any]:
        """Frames, ticks and drops of this episode, and its first frame's sample time
        (the recorder's per-episode metadata)."""
        return {'frames': self.frames, 'ticks': self.frames + self.dropped_ticks,
                'dropped_ticks': self.dropped_ticks, 'drops': self.drops.as_dict(),
                'drop_fraction': round(self.drop_fraction, 6), 'start_time_s': self.start_s,
                'fps': self.spec.fps}

    def no_frames_error(self) -> ValueError:
        return ValueError('the episode has no frames (every tick was dropped: '
                          f'{self.drops.as_dict() or "no input was received"})')

    def episode(self) -> Episode:
        """The recorded frames as an :class:`Episode` (ValueError when there are none;
        RuntimeError with a sink: the frames are on disk)."""
        if self.sink is not None:
            raise RuntimeError('EpisodeBuffer.episode(): the frames went to the sink')
        if not self._state:
            raise self.no_frames_error()
        return Episode(images={cam: np.stack(frames) for cam, frames in self._images.items()},
                       state=np.stack(self._state), action=np.stack(self._action))


class StampMatcher:
    """Pairs messages by header stamp (lock-step recording): a frame is complete when every
    stream has a message stamped within ``tolerance_s`` of the same instant.

    Messages of one instant may arrive in any order, interleaved with the next instant's
    (different topics are delivered independently); each stream keeps its last
    ``depth`` stamps. Instants older than a completed one that never completed are
    dropped and counted, whichever streams they lack.
    """

    def __init__(self, streams: list[str], tolerance_s: float, depth: int = 8) -> None:
        self.streams = list(streams)
        self.tolerance_s = float(tolerance_s)
        self.depth = depth
        self._pending: dict[str, list[tuple[float, Any]]] = {s: [] for s in self.streams}
        self._done_until = -math.inf  # instants up to here are complete or counted
        self.dropped = 0

    def clear(self) -> None:
        for queue in self._pending.values():
            queue.clear()
        self._done_until = -math.inf

    def put(self, stream: str, stamp_s: float, value: Any) -> dict[str, Any] | None:
        """Add a message; returns ``{stream: value}`` (and ``'stamp_s'``) when an instant
        became complete, else ``None``. A message for an instant already completed or
        counted as dropped is ignored."""
        if stamp_s <= self._done_until:
            return None
        queue = self._pending[stream]
        queue.append((stamp_s, value))
        del queue[:-self.depth]
        anchor = stamp_s
        picked = {}
        for name, items in self._pending.items():
            match = next((v for t, v in items if abs(t - anchor) <= self.tolerance_s), None)
            if match is None:
                return None
            picked[name] = match
        older: list[float] = []
        for items in self._pending.values():  # consume this instant and older ones
            older += [t for t, _ in items if t < anchor - self.tolerance_s]
            items[:] = [(t, v) for t, v in items if t > anchor + self.tolerance_s]
        self.dropped += _instants(older, self.tolerance_s)
        self._done_until = anchor + self.tolerance_s
        picked['stamp_s'] = anchor
        return picked


def _instants(stamps: list[float], tolerance_s: float) -> int:
    """How many instants ``stamps`` hold (stamps within ``tolerance_s`` are one)."""
    count, last = 0, None
    for t in sorted(stamps):
        if last is None or t - last > tolerance_s:
            count += 1
            last = t
    return count


def make_store(spec: RecordingSpec) -> InputStore:
    """The input store a recording samples from (every stream required, aged by the
    tolerance)."""
    return InputStore(spec.streams(), spec.tolerance_s)
