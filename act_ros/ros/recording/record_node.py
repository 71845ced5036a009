"""``record_node``: demonstrations on ROS 2 topics to a LeRobot v3 dataset.

Subscribes to the contract's cameras (raw or compressed, every encoding ``act_node``
accepts), the joint states and an action source (the commands sent to the arm's
controller, or a leader arm's joint states), samples them at the contract's fps and
records episodes with the rules of :mod:`act_ros.data.recording`: each tick pairs the
newest message of every input within ``tolerance_s``; a tick without a fresh set is
dropped and counted, never filled with stale data.

Services (``std_srvs/Trigger``): ``~/start_episode``, ``~/save_episode`` (the dataset at
``output`` then holds it), ``~/discard_episode``. With ``max_episode_s`` > 0 an episode
is saved automatically when it reaches that length. Status (recording or not, frames,
dropped ticks and why, per-input rates, episodes saved, last error) goes to
``/diagnostics``. An episode never exceeds ``max_episode_frames`` and never holds a gap: at
the cap, and before a frame that follows dropped ticks (LeRobot places frame ``i`` at
``i / fps``: see :mod:`act_ros.data.recording`), the episode is saved and recording
continues in a new one, whose metadata (``meta/recording/episode_N.json``:
:func:`act_ros.data.episode_store.recording_metadata`) names the episode it continues;
each episode's metadata also counts its dropped ticks by reason and flags it when they
exceed ``max_drop_fraction`` of its ticks. Frames go to disk as they are sampled (a
background writer thread per episode feeds the video encoder), so memory does not grow
with the episode; a save runs in a saver thread, off the sampling timer, which keeps
sampling the next episode. Saved
episodes persist one by one (:mod:`act_ros.data.episode_store`): a crash, SIGKILL or
SIGINT loses only the episode being recorded, and a restarted recorder continues the same
dataset.

    record_node --ros-args -p output:=data/my_demos -p action_source:=leader \\
        -p action_topic:=/leader/joint_states
"""

from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.task import Future
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from act_ros.core.contract import load_contract
from act_ros.core.control.decode import MalformedMessageError
from act_ros.data.episode_store import EpisodeStore, EpisodeWriter
from act_ros.data.recording import (
    ACTION,
    ACTION_SOURCES,
    COMMAND_TYPES,
    IMAGE_TRANSPORTS,
    EpisodeBuffer,
    RecordingSpec,
    StampMatcher,
    make_store,
)
from act_ros.data.writer import MAX_EPISODE_FRAMES, VIDEO_CODECS
from act_ros.ros.diagnostics import RateMeter, diagnostic_array
from act_ros.ros.node.interfaces import DIAGNOSTICS_QOS, DIAGNOSTICS_TOPIC
from act_ros.ros.node.parameters import CONTRACT_PATH, ParameterFile, ParamSpec, declare_parameters

#: Drop reason of a tick after a split whose continuation's writer was not made yet.
NO_WRITER = 'no writer yet'
MESSAGE_TYPES = {'sensor_msgs/msg/Image': Image,
                 'sensor_msgs/msg/CompressedImage': CompressedImage,
                 'sensor_msgs/msg/JointState': JointState,
                 'trajectory_msgs/msg/JointTrajectory': JointTrajectory,
                 'std_msgs/msg/Float64MultiArray': Float64MultiArray}


def record_parameters(contract) -> list[ParamSpec]:
    """Every parameter of the recorder, with its description and constraints."""
    P = ParamSpec
    cam = contract.cameras[0]
    specs = [
        CONTRACT_PATH,
        P('output', '', 'Dataset directory to write (created; a later session on the same '
          'directory adds episodes). Required.', read_only=True),
        P('task', contract.task, 'Task string stored with every frame.', read_only=True),
        P('joint_states_topic', 'joint_states', 'sensor_msgs/JointState of the follower arm.',
          read_only=True),
        P('image_transport', 'raw', 'raw (sensor_msgs/Image) or compressed '
          '(sensor_msgs/CompressedImage on <topic>/compressed), for every camera whose '
          'cameras.<name>.transport is empty.', choices=IMAGE_TRANSPORTS, read_only=True),
        P('action_source', 'command', 'command: the positions sent to the controller '
          '(action_topic, command_type); leader: a leader arm\'s sensor_msgs/JointState.',
          choices=ACTION_SOURCES, read_only=True),
        P('action_topic', 'joint_trajectory_controller/joint_trajectory', 'Controller command '
          'topic, or the leader arm\'s joint states.', read_only=True),
        P('command_type', 'JointTrajectory', 'Command message type (action_source command).',
          choices=COMMAND_TYPES, read_only=True),
        P('joint_names', list(contract.joint_names), 'Follower joint names in contract order.',
          read_only=True),
        P('leader_joint_names', [''], 'Leader joint names in contract order; empty: the same '
          'as joint_names.', read_only=True),
        P('tolerance_s', 0.1, 'Largest age of an input at a tick (receive time); older: the '
          'tick is dropped.', low=0.001, high=10.0, read_only=True),
        P('image_height', int(cam.height), 'Stored image height (images are resized).',
          low=2, high=8192, read_only=True),
        P('image_width', int(cam.width), 'Stored image width.', low=2, high=8192,
          read_only=True),
        P('use_video', True, 'Store cameras as MP4 (true) or PNG images.', read_only=True),
        P('video_codec', 'h264', 'h264 (ultrafast: about 0.12 core per 480x640 camera at 30 '
          'fps on a 2-core CPU) or libsvtav1 (LeRobot\'s default: smaller files, about 1.8 '
          'cores per camera there, too slow to encode live on a CPU).',
          choices=VIDEO_CODECS, read_only=True),
        P('writer_nice', 0, 'How much lower the priority of the writer and encoder threads is '
          'than the sampling (0: the same; the saver thread runs 5 below the writers). On a '
          'machine shared with other work a niced writer loses to it: keep 0 there.',
          low=0, high=19, read_only=True),
        P('trigger', 'timer', 'timer: a frame every 1/fps of the node clock, pairing the newest '
          'message of each input; observation: a frame per set of messages with equal header '
          'stamps (lock-step simulation; needs stamped commands).',
          choices=('timer', 'observation'), read_only=True),
        P('sync_tolerance_s', 0.001, 'observation trigger: header stamps within this many '
          'seconds form one frame.', low=0.0, high=1.0, read_only=True),
        P('max_episode_s', 0.0, 'Save an episode automatically at this length; 0 = only on '
          '~/save_episode.', low=0.0, high=3600.0),
        P('max_episode_frames', MAX_EPISODE_FRAMES, 'Frames an episode holds at most (the '
          'dataset writer takes no more): at this many the episode is saved and recording '
          'continues in a new one, marked in its metadata as the continuation.',
          low=2, high=MAX_EPISODE_FRAMES, read_only=True),
        P('max_drop_fraction', 0.05, 'An episode whose dropped ticks exceed this fraction of '
          'its ticks is flagged (its metadata, a warning, episodes_flagged on /diagnostics).',
          low=0.0, high=1.0, read_only=True),
        P('start_recording', False, 'Start the first episode at start-up.', read_only=True),
        P('restart_after_save', False, 'Start the next episode as soon as one is saved '
          '(back-to-back episodes of max_episode_s).'),
        P('diagnostics_period_s', 1.0, 'Period of the status on /diagnostics.',
          low=0.05, high=60.0),
        P('writer_queue_s', 2.0, 'Seconds of frames that may wait for the disk writer and '
          'the video encoder (bounds memory); a tick finding the queue full is dropped '
          '(dropped.writer behind).', low=0.1, high=60.0, read_only=True),
    ]
    for camera in contract.cameras:
        specs.append(P(f'cameras.{camera.name}.topic', f'camera/{camera.name}/image_raw',
                       f"Image topic of the '{camera.name}' camera.", read_only=True))
        specs.append(P(f'cameras.{camera.name}.transport', '',
                       f"raw or compressed for the '{camera.name}' camera; empty: "
                       'image_transport.', choices=('',) + IMAGE_TRANSPORTS, read_only=True))
    return specs


@dataclass(eq=False)
class _SaveJob:
    """An episode handed to the saver thread. ``future`` is completed with ``(ok, message)``
    once it is saved or failed: the save service awaits it without holding the executor's
    thread."""

    writer: EpisodeWriter | None
    buffer: EpisodeBuffer | None
    continues: _SaveJob | None = None  # the episode this one continues
    ended_by: str = 'saved'  # why the episode ended (its metadata)
    index: int | None = None  # its index in the dataset, once saved
    future: Future = field(default_factory=Future)




class RecordNode(Node):
    """See the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__('record_node', **kwargs)
        errors = declare_parameters(self, [CONTRACT_PATH])
        self.contract = load_contract(self.get_parameter('contract_path').value or None)
        specs = record_parameters(self.contract)
        errors += declare_parameters(self, specs)
        if errors:
            raise ValueError('; '.join(errors))
        p = {spec.name: self.get_parameter(spec.name).value for spec in specs}
        if not p['output']:
            raise ValueError("parameter 'output' is required (the dataset directory to write)")
        leader = tuple(n for n in p['leader_joint_names'] if n)
        self.spec = RecordingSpec(
            joint_names=tuple(p['joint_names']),
            camera_topics={c.name: p[f'cameras.{c.name}.topic'] for c in self.contract.cameras},
            joint_states_topic=p['joint_states_topic'], action_source=p['action_source'],
            action_topic=p['action_topic'], command_type=p['command_type'],
            leader_joint_names=leader, image_transport=p['image_transport'],
            camera_transports={c.name: p[f'cameras.{c.name}.transport']
                               for c in self.contract.cameras
                               if p[f'cameras.{c.name}.transport']},
            image_height=p['image_height'], image_width=p['image_width'],
            fps=self.contract.fps, tolerance_s=p['tolerance_s'], task=p['task'],
            max_episode_s=p['max_episode_s'])
        from act_ros.data.episode import DatasetLayout

        layout = DatasetLayout(contract=self.contract, image_height=self.spec.image_height,
                               image_width=self.spec.image_width, use_video=p['use_video'],
                               robot_type='ros2', task_text=self.spec.task)
        self.trigger = p['trigger']
        self.sync_tolerance_s = p['sync_tolerance_s']
        if self.trigger == 'observation' and (self.spec.action_source == 'command'
                                              and self.spec.command_type == 'Float64MultiArray'):
            raise ValueError('trigger observation pairs messages by header stamp; '
                             'Float64MultiArray commands have none (use JointTrajectory, a '
                             'leader JointState, or trigger timer)')
        self.episodes = EpisodeStore(p['output'], layout)
        for path in self.episodes.remove_partial():
            self.get_logger().warning(f'removed {path.name}: an episode an earlier session was '
                                      'recording when it stopped (never saved)')
        if self.episodes.needs_rebuild():
            self.get_logger().warning(f'{self.episodes.output} misses episodes saved by an '
                                      'interrupted session: appending them')
            self.episodes.sync()
        self.queue_frames = max(2, int(round(p['writer_queue_s'] * self.contract.fps)))
        self.writer_options = {'queue_frames': self.queue_frames,
                               'video_codec': p['video_codec'], 'nice': p['writer_nice']}
        self.store = make_store(self.spec)
        self.matcher = StampMatcher(self.spec.streams(), self.sync_tolerance_s)
        self.writer: EpisodeWriter | None = None
        self.buffer = EpisodeBuffer(self.spec, self.contract)
        self.recording = False
        self.saved = self.episodes.episodes_in_output()
        self.last_error = ''
        self.restart_after_save = p['restart_after_save']
        self.max_episode_frames = p['max_episode_frames']
        self.max_drop_fraction = p['max_drop_fraction']
        self._continues: _SaveJob | None = None  # the episode the open one continues
        # An episode ended at a gap or the cap whose continuation waits for its writer (none
        # was made ahead): the ticks meanwhile are dropped, counted for the continuation.
        self._awaiting: _SaveJob | None = None
        self.continuations = 0
        self.flagged = 0
        self.discarded_frames = 0
        self.last_discard = ''  # what was last discarded, and why (/diagnostics)
        self._stopped = False
        self._lock = threading.Lock()
        self._match_lock = threading.Lock()
        self._spare: EpisodeWriter | None = None  # the next episode's writer, made ahead
        self._saves: queue.Queue = queue.Queue()
        self.pending_saves = 0
        self.last_save_s = 0.0
        self._saver = threading.Thread(target=self._save_loop, name='record_node-saver',
                                       daemon=True)
        self._saver.start()
        self._prepares: queue.Queue = queue.Queue()
        self._preparer = threading.Thread(target=self._prepare_loop,
                                          name='record_node-preparer', daemon=True)
        self._preparer.start()
        self.rates = {stream: RateMeter() for stream in self.spec.streams()}
        self.rejections: dict[str, int] = {}
        # One group per input stream: under a multi-threaded executor (a test's) a stream's
        # messages are taken in order, the streams in parallel. ``main`` spins a
        # single-threaded executor: no callback blocks (the save service is a coroutine).
        # On a 2-core CPU with two 480x640 cameras at 30 Hz, rclpy's multi-threaded
        # executor kept a core busy with its own loop and the encoders fell behind; with
        # one thread none did over 10 minutes (docs/recording.md).
        sampling = MutuallyExclusiveCallbackGroup()  # the timer alone: a service never delays it
        control = MutuallyExclusiveCallbackGroup()
        self._subs = []
        for topic, (stream, msgtype) in self.spec.topic_streams().items():
            convert = self.spec.converter(stream)
            self._subs.append(self.create_subscription(
                MESSAGE_TYPES[msgtype], topic,
                lambda msg, s=stream, c=convert: self._store(s, msg, c),
                qos_profile_sensor_data, callback_group=MutuallyExclusiveCallbackGroup()))
        if self.trigger == 'timer':
            self._timer = self.create_timer(self.spec.period_s, self._tick,
                                            callback_group=sampling)
        for name, handler in (('start_episode', self._start), ('save_episode', self._save),
                              ('discard_episode', self._discard)):
            self.create_service(Trigger, f'~/{name}', handler, callback_group=control)
        self._diag = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, DIAGNOSTICS_QOS)
        self.create_timer(p['diagnostics_period_s'], self._publish_status,
                          callback_group=MutuallyExclusiveCallbackGroup())
        self.get_logger().info(
            f'recording to {self.episodes.output} ({self.saved} episode(s) there already): '
            f'{self.spec.fps} Hz, tolerance {self.spec.tolerance_s:.3f} s, action from '
            f'{self.spec.action_source} on {self.spec.action_topic}; services ~/start_episode, '
            '~/save_episode, ~/discard_episode')
        if p['start_recording']:
            self._begin()
            if self.restart_after_save:
                self._prepares.put(True)

    # -- inputs ------------------------------------------------------------------------
    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _store(self, stream: str, msg: Any, convert: Any) -> None:
        now = self._now()
        self.rates[stream].tick(now)
        try:
            value = convert(msg)
        except MalformedMessageError as exc:
            line = self.store.reject(stream, str(exc))
            self.rejections[stream] = self.rejections.get(stream, 0) + 1
            self.get_logger().warning(f'rejected: {line}', throttle_duration_sec=2.0)
            return
        header = getattr(msg, 'header', None)
        stamp = (header.stamp.sec + header.stamp.nanosec * 1e-9) if header is not None else now
        self.store.put(stream, value, now, stamp)
        if self.trigger == 'observation':
            with self._match_lock:  # the streams' callbacks run in parallel
                frame = self.matcher.put(stream, stamp, value)
            if frame is not None:
                self._add_matched(frame)

    def _add_matched(self, frame: dict[str, Any]) -> None:
        self._record(frame['stamp_s'], True, lambda buffer: buffer.add_frame(
            frame, frame['stamp_s']))

    # -- episode -----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Recording, or about to go on recording (a continuation awaiting its writer)."""
        return self.recording or self._awaiting is not None

    def _begin(self, continuation_only: bool = False) -> None:
        """Start an episode (its writer made now unless one was made ahead); the awaited
        continuation if there is one (``continuation_only``: nothing else)."""
        with self._lock:
            writer, self._spare = self._spare, None
        if writer is None:
            writer = self.episodes.begin(**self.writer_options)
        with self._lock:
            if continuation_only and (self._awaiting is None or self._stopped):
                if self._spare is None:
                    self._spare, writer = writer, None
            else:
                self._attach(writer)
        if writer is None:
            return
        if self._continues is None:
            self.get_logger().info(f'episode {self.saved + self.pending_saves}: recording '
                                   f'(shard {writer.index})')

    def _attach(self, writer: EpisodeWriter, continues: _SaveJob | None = None) -> None:
        """(lock held) Record into ``writer`` from the next tick on (the continuation of
        ``continues``' episode, or of the awaited one, if any)."""
        waited = None
        if continues is None and self._awaiting is not None:
            continues, waited = self._awaiting, self.buffer
        self._awaiting = None
        chain = 0
        if continues is not None:
            chain = continues.buffer.chain_frames + continues.buffer.frames
        self.writer = writer
        self.buffer = EpisodeBuffer(self.spec, self.contract, sink=writer, chain_frames=chain)
        if waited is not None:  # the ticks dropped while the writer was made
            self.buffer.take_leading_drops(waited)
        self._continues = continues
        if continues is None:
            with self._match_lock:
                self.matcher.clear()
        self.recording = True
        self._prepares.put(True)  # the next writer, made ahead for a continuation

    def _detach(self, restart: bool, ended_by: str = 'saved') -> _SaveJob | None:
        """(lock held) End the open episode: its save job, or None when not recording.
        With ``restart`` and a writer made ahead, the next episode starts at once."""
        if self.writer is None:
            return None
        job = _SaveJob(self.writer, self.buffer, continues=self._continues, ended_by=ended_by)
        self.writer, self.recording, self._continues = None, False, None
        self.buffer = EpisodeBuffer(self.spec, self.contract)
        self.pending_saves += 1
        if restart and self._spare is not None and not self._stopped:
            spare, self._spare = self._spare, None
            self._attach(spare)
        return job

    def _after_frame(self) -> _SaveJob | None:
        """(lock held) After a tick: stop an episode whose writer failed; end a full one."""
        if self.writer is not None and self.writer.error is not None:
            writer, frames = self.writer, self.buffer.frames
            self.writer, self.recording, self._continues = None, False, None
            self.buffer = EpisodeBuffer(self.spec, self.contract)
            self.discarded_frames += frames
            self.last_discard = f'{frames} frames (shard {writer.index}): writing failed'
            self.last_error = (f'episode (shard {writer.index}) discarded: {frames} frames '
                               f'not saved: writing failed: {type(writer.error).__name__}: '
                               f'{writer.error}')
            self.get_logger().error(self.last_error)
            threading.Thread(target=writer.discard, daemon=True).start()
            return None
        if self.buffer.full:
            self.get_logger().info(f'episode reached max_episode_s '
                                   f'({self.spec.max_episode_s:.1f} s): saving it')
            return self._detach(self.restart_after_save, 'max_episode_s')
        return None

    def _split_reason(self, at: float) -> str | None:
        """(lock held) Why a frame sampled at ``at`` must start a new episode, if it must."""
        if self.buffer.frames >= self.max_episode_frames:
            return f'max_episode_frames ({self.max_episode_frames})'
        missing = self.buffer.gap_before(at)
        if missing:
            return f'a gap of {missing} tick(s)'
        return None

    def _split(self, why: str, at: float) -> tuple[_SaveJob, bool]:
        """(lock held) End the open episode before the frame at ``at`` and continue in a
        new one: (the ended episode's save job, whether the new one is attached: not when
        no writer was made ahead)."""
        if why.startswith('a gap'):
            self.buffer.close_gap(at)
            why = f'{why}: {self.buffer.drops.as_dict()}'
        job = self._detach(False, why)
        self.continuations += 1
        if self._spare is None:  # made by the preparer; ticks until then are dropped
            self._awaiting = job
            self.buffer = EpisodeBuffer(self.spec, self.contract, chain_frames=(
                job.buffer.chain_frames + job.buffer.frames))
            self._prepares.put(True)
            return job, False
        spare, self._spare = self._spare, None
        self._attach(spare, continues=job)
        return job, True

    def _record(self, at: float, ready: bool, add: Any) -> None:
        """Add the frame sampled at ``at`` (``add(buffer)``; ``ready``: the tick has a
        complete set, so a frame will be added) to the open episode, after ending it and
        continuing in a new one where the frame would exceed the cap or follow a gap."""
        jobs: list[_SaveJob | None] = []
        with self._lock:
            if not self.active or self._stopped:
                return
            if self._awaiting is not None:  # no writer yet: a dropped tick, counted
                if ready:
                    self.buffer.drop(NO_WRITER, at=at)
                else:
                    add(self.buffer)  # counts why the tick was dropped
                return
            why = self._split_reason(at) if ready else None
            attached = True
            if why is not None:
                job, attached = self._split(why, at)
                jobs.append(job)
            if attached:
                add(self.buffer)
                jobs.append(self._after_frame())
            elif ready:
                self.buffer.drop(NO_WRITER, at=at)
        for job in jobs:
            if job is not None:  # saved by the saver thread; sampling goes on
                if job.ended_by != 'saved' and not job.ended_by.startswith('max_episode_s'):
                    self.get_logger().info(f'episode (shard {job.writer.index}) ended by '
                                           f'{job.ended_by}: saving it; recording continues '
                                           'in a new episode')
                self._saves.put(job)

    def _tick_time(self) -> float:
        """The time of this timer tick: the timer's grid point it belongs to (the next
        scheduled call less a period), so that a tick the executor ran late keeps its place
        and one it never ran shows as a missing tick. The inputs are sampled now, at most a
        period later (the callback's latency)."""
        now = self._now()
        left = self._timer.time_until_next_call()
        if left is None:
            return now
        return now + left * 1e-9 - self.spec.period_s

    def _tick(self) -> None:
        at = self._tick_time()
        if not self.active:
            return
        snap = self.store.snapshot(self._now())
        self._record(at, snap.ok, lambda buffer: buffer.sample(snap, at))

    def _save_loop(self) -> None:
        """The saver thread: finish and append episodes in order, off the sampling path,
        below the writer threads' priority (a save can wait, frames cannot)."""
        import os

        nice = self.writer_options['nice'] + 5
        if nice > 0 and hasattr(os, 'setpriority'):
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + nice)
            except OSError:
                pass
        while True:
            job = self._saves.get()
            if job is None:
                return
            try:
                ok, message = self._run_save(job)
            except Exception as exc:  # noqa: BLE001 - the thread must go on
                ok, message = False, f'save failed: {type(exc).__name__}: {exc}'
                self.last_error = message
            job.future.set_result((ok, message))
            if ok:
                self.get_logger().info(message)
            else:
                self.get_logger().error(message)
            self._prepares.put(True)

    def _prepare_loop(self) -> None:
        """The preparer thread: make the next episodes' writers. Not the saver: a thread
        inherits its creator's priority, and the writer and encoder threads must keep the
        sampling's (``writer_nice`` below it), not the niced saver's."""
        while self._prepares.get() is not None:
            self._prepare_next()

    def _run_save(self, job: _SaveJob) -> tuple[bool, str]:
        import time

        start = time.monotonic()
        buffer = job.buffer
        try:
            if buffer.frames == 0:
                job.writer.discard()
                raise buffer.no_frames_error()
            metadata = self._metadata(job)
            shard = job.writer.finish(metadata)
            finished = time.monotonic()
            index = self.episodes.commit(shard)
        except (ValueError, OSError, RuntimeError) as exc:
            job.continues = None
            with self._lock:
                self.pending_saves -= 1
                self.discarded_frames += buffer.frames
                self.last_discard = f'{buffer.frames} frames: save failed'
                self.last_error = f'save failed: {buffer.frames} frames not saved: {exc}'
            return False, self.last_error
        job.index = index
        job.continues = None  # its index is in the metadata; the chain is not kept
        with self._lock:
            self.pending_saves -= 1
            self.saved += 1
            self.last_error = ''  # the dataset is fine again
            self.last_save_s = time.monotonic() - start
            if metadata['flagged']:
                self.flagged += 1
        if metadata['flagged']:
            self.get_logger().warning(
                f'episode {index} flagged: {buffer.dropped_ticks} of {metadata["ticks"]} '
                f'ticks dropped ({metadata["drop_fraction"]:.1%} > max_drop_fraction '
                f'{self.max_drop_fraction:.1%}): {buffer.drops.as_dict()}')
        continued = metadata['continues_episode']
        return True, (f'episode {index} saved: {buffer.frames} frames, '
                      f'{buffer.dropped_ticks} ticks dropped {buffer.drops.as_dict() or ""}; '
                      f'{"" if continued is None else f"continues episode {continued}; "}'
                      f'{self.episodes.output} holds {self.saved} episode(s) '
                      f'(save took {self.last_save_s:.2f} s: shard {finished - start:.2f} s, '
                      f'append {time.monotonic() - finished:.2f} s)')

    def _metadata(self, job: _SaveJob) -> dict[str, Any]:
        """The episode's recording metadata (``meta/recording/episode_N.json``)."""
        meta = job.buffer.summary()
        meta['flagged'] = meta['drop_fraction'] > self.max_drop_fraction
        meta['max_drop_fraction'] = self.max_drop_fraction
        meta['ended_by'] = job.ended_by
        meta['continues_episode'] = None if job.continues is None else job.continues.index
        if job.continues is not None and job.continues.index is None:
            meta['continues_unsaved'] = job.continues.ended_by  # its save failed
        meta['trigger'] = self.trigger
        return meta

    def _prepare_next(self) -> None:
        """With restart_after_save, start the next episode if none is open; while an
        episode is open (or will be), make the writer of the next one ahead of time, so
        that a full episode or a continuation hands over between two ticks."""
        if self._stopped:
            return
        try:
            with self._lock:
                idle = self.writer is None
                awaited = self._awaiting is not None
            if idle and (self.restart_after_save or awaited):
                self._begin(continuation_only=not self.restart_after_save)
            with self._lock:
                need = (self._spare is None and not self._stopped
                        and (self.active or self.restart_after_save))
            if need:
                spare = self.episodes.begin(**self.writer_options)
                with self._lock:
                    if self._spare is None and not self._stopped:
                        self._spare, spare = spare, None
                if spare is not None:
                    spare.discard()
        except (ValueError, OSError, RuntimeError) as exc:
            self.last_error = f'cannot start the next episode: {exc}'
            self.get_logger().error(self.last_error)

    async def _save_current(self) -> tuple[bool, str]:
        """Save the open episode: hand it to the saver thread and await the result (a
        coroutine, so the executor goes on sampling meanwhile, also on one thread)."""
        with self._lock:
            awaited, self._awaiting = self._awaiting, None  # its continuation: not begun
            job = self._detach(self.restart_after_save)
        if job is None and awaited is not None:  # the episode it ended is being saved
            return await awaited.future
        if job is None:
            return False, 'not recording: call ~/start_episode first'
        self._saves.put(job)
        return await job.future

    def _start(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.active:
            response.success, response.message = False, 'already recording an episode'
        else:
            try:
                self._begin()
                response.success, response.message = True, 'recording'
            except (ValueError, OSError, RuntimeError) as exc:
                self.last_error = f'cannot start an episode: {exc}'
                response.success, response.message = False, self.last_error
        if self.restart_after_save:
            self._prepares.put(True)
        return response

    async def _save(self, request: Trigger.Request,
                    response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = await self._save_current()
        if not response.success:
            self.get_logger().warning(response.message)
        return response

    def _discard(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        with self._lock:
            writer, frames = self.writer, self.buffer.frames
            self.writer, self.recording, self._continues = None, False, None
            self._awaiting = None
            self.buffer = EpisodeBuffer(self.spec, self.contract)
        if writer is not None:
            writer.discard()
            with self._lock:
                self.discarded_frames += frames
                self.last_discard = f'{frames} frames: ~/discard_episode'
        response.success = writer is not None
        response.message = (f'discarded {frames} frames (~/discard_episode)' if writer is not None
                            else 'not recording')
        self.get_logger().info(response.message)
        return response

    def stop_recording(self) -> None:
        """No further frames (shutdown); the open episode is kept until discarded."""
        with self._lock:
            self._stopped = True
            self.restart_after_save = False

    def discard_open_episode(self, why: str) -> None:
        """Drop the episode being recorded (shutdown), let saves under way finish; saved
        episodes stay."""
        if self._preparer.is_alive():  # stopped: it makes no more writers
            self._prepares.put(None)
            self._preparer.join()
        with self._lock:
            writer, frames = self.writer, self.buffer.frames
            spare, self._spare = self._spare, None
            self.writer, self.recording, self._awaiting = None, False, None
            self.buffer = EpisodeBuffer(self.spec, self.contract)
        for w in (writer, spare):
            if w is not None:
                w.discard()
        if self._saver.is_alive():
            self._saves.put(None)
            self._saver.join()
        if frames:
            # stderr as well: at shutdown the ROS logger may already be gone.
            print(f'[record_node] {why}: discarding the open episode ({frames} frames, not '
                  'saved)', file=sys.stderr, flush=True)

    def destroy_node(self) -> None:
        """Stop recording, drop the open episode, finish the saves under way."""
        self.stop_recording()
        self.discard_open_episode('node destroyed')
        super().destroy_node()

    # -- status ------------------------------------------------------------------------
    def unconnected_topics(self) -> list[str]:
        """Input topics no publisher is matched to (discovery, or a wrong name)."""
        return [sub.topic_name for sub in self._subs if sub.get_publisher_count() == 0]

    def status_values(self) -> dict[str, Any]:
        now = self._now()
        with self._lock:
            values: dict[str, Any] = {
                'recording': self.active, 'frames': self.buffer.frames,
                'dropped_ticks': self.buffer.dropped_ticks,
                'drop_fraction': round(self.buffer.drop_fraction, 4),
                'episodes_saved': self.saved, 'episodes_flagged': self.flagged,
                'continuations': self.continuations, 'frames_discarded': self.discarded_frames,
                'last_discard': self.last_discard or 'none',
                'saves_pending': self.pending_saves,
                'last_save_s': round(self.last_save_s, 3),
                'writer_queue': self.writer.queued if self.writer is not None else 0,
                'output': str(self.episodes.output), 'last_error': self.last_error or 'none',
                'unconnected_topics': ', '.join(self.unconnected_topics()) or 'none'}
            for reason, count in self.buffer.drops.as_dict().items():
                values[f'dropped.{reason}'] = count
        for stream, meter in self.rates.items():
            values[f'rate_hz.{stream}'] = meter.rate_hz(now)
        for stream, count in self.rejections.items():
            values[f'rejected.{stream}'] = count
        return values

    def _publish_status(self) -> None:
        values = self.status_values()
        snap = self.store.snapshot(self._now())
        if self.last_error:
            level, message = DiagnosticStatus.ERROR, self.last_error
        elif values['recording'] and not snap.ok:
            level, message = DiagnosticStatus.WARN, f'dropping ticks: {snap.describe_problems()}'
        else:
            level = DiagnosticStatus.OK
            message = (f"recording: {values['frames']} frames" if values['recording']
                       else f"idle: {values['episodes_saved']} episode(s) saved")
        self._diag.publish(diagnostic_array(name=f'{self.get_name()}: recorder',
                                            hardware_id=ACTION, level=level, message=message,
                                            values=values, stamp=self.get_clock().now().to_msg()))


def main(args: list[str] | None = None) -> int:
    """Console script ``record_node`` (also ``act-ros record``)."""
    from rclpy.executors import SingleThreadedExecutor

    from act_ros.data.writer import quiet_library_output
    from act_ros.ros.spin import run_node

    quiet_library_output()
    return run_node(RecordNode, name='record_node', args=args, help_text=PARAMETERS.help,
                    executor=lambda node: SingleThreadedExecutor(),
                    # A save in progress finishes (its episode stays); the open one goes.
                    before_shutdown=lambda node: node.stop_recording(),
                    on_exit=lambda node: node.discard_open_episode('shutting down'),
                    errors=(ValueError, FileExistsError))


def parameter_declarations() -> list[ParamSpec]:
    """The recorder's parameters as ``--help`` lists them: camera and joint defaults from
    the package contract."""
    return record_parameters(load_contract())


PARAMETERS = ParameterFile(
    'record_node', 'Records demonstrations from ROS 2 topics to a LeRobot v3 dataset '
    '(also: act-ros record).', parameter_declarations, 'config/record.yaml',
    'act_ros/ros/recording/record_node.py',
    notes='Example: record_node --ros-args -p output:=data/my_demos. Per episode call '
    'the services ~/start_episode, then ~/save_episode or ~/discard_episode '
    '(std_srvs/Trigger).')


if __name__ == '__main__':
    sys.exit(main())
