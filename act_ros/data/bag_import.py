"""``act-ros import-bag``: rosbag2 recordings (MCAP or SQLite3) to a LeRobot v3 dataset.

Reads the bags with ``rosbags`` (pure Python: no ROS install needed) and applies the
recorder's rules (:mod:`act_ros.data.recording`): the inputs are sampled at the
contract's fps on the bag's log time, each tick takes, of every input, the message
nearest to it within half a period (messages meant for one instant but logged a few
milliseconds apart by different publishers pair up) and is kept only if all of them are
at most the tolerance older than the tick; joints are matched by name, images are
converted to RGB and resized. Ticks before every input has appeared are not counted;
later ticks without a fresh set are dropped and counted by reason. Frames keep their
times: a frame after dropped ticks starts a new episode (LeRobot places frame ``i`` of an
episode at ``i / fps``, so an episode cannot hold a gap; ``record_node`` splits alike),
and each episode's entry in the report says what ended it.

Episodes: one per bag (default), or split where a marker topic publishes (any message
type) or where no input arrived for ``--split-gap`` seconds. Frames stream to the
dataset writer as they are sampled (videos encoded as they come), so memory does not
grow with the length of a bag. The dataset appears at ``--output`` only when every bag
has been read and written (atomic writer).

A bag cut short (a recorder that crashed or lost power: an MCAP file without its footer
and index or cut inside a chunk, a bag directory without ``metadata.yaml``) is imported up
to the cut, every whole message of it, with one line saying what was recovered and where
the file ends (:mod:`act_ros.data.bag_recovery`); ``--strict`` refuses such a bag
instead. Any other bag that cannot be read (a corrupt header, another format, a chunk
damaged in the middle, a message that does not decode) stops the import with one line
naming the file and the reason; every bag is opened before anything is written.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.core.contract import Contract, load_contract
from act_ros.core.control.decode import MalformedMessageError
from act_ros.core.control.inputs import Sample, Snapshot
from act_ros.core.logs import setup_logging
from act_ros.data.episode import DatasetLayout
from act_ros.data.recording import EpisodeBuffer, FrameSink, RecordingSpec, load_spec

logger = logging.getLogger(__name__)
SPLITS = ('bag', 'marker', 'gap')
# A stream whose first messages are all rejected for the same reason is misconfigured
# (wrong joint names, unsupported encoding): the import stops and says so.
SYSTEMATIC_REJECTIONS = 5
# Frames the video encoder may hold per camera while importing (the reader waits).
ENCODER_QUEUE_FRAMES = 60


class BagImportError(ValueError):
    """A bag cannot be imported as configured (missing topic, unknown type, bad joints)."""


@dataclass
class ImportReport:
    """What an import read and wrote."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    messages: int = 0
    rejected: Counter = field(default_factory=Counter)
    recovered: list[str] = field(default_factory=list)  # one line per bag read past a cut

    @property
    def frames(self) -> int:
        return sum(e['frames'] for e in self.episodes)

    @property
    def dropped_ticks(self) -> int:
        return sum(e['dropped_ticks'] for e in self.episodes)

    def as_dict(self) -> dict[str, Any]:
        return {'episodes': self.episodes, 'frames': self.frames,
                'dropped_ticks': self.dropped_ticks, 'messages': self.messages,
                'rejected': dict(self.rejected), 'recovered': self.recovered}


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


class _TickSampler:
    """What a tick of an import sees: per input, of its recent messages, the one nearest to
    the tick among those logged up to half a period after it (the sampler is asked only
    once those are all read); stale when that one is more than the tolerance older than
    the tick. A rejected message makes its input unusable until the next good one (as
    :class:`~act_ros.core.control.inputs.InputStore`)."""

    def __init__(self, streams: list[str], tolerance_s: float, depth: int = 8) -> None:
        self.streams = list(streams)
        self.tolerance_s = tolerance_s
        self.depth = depth
        self.clear()

    def clear(self) -> None:
        self._recent: dict[str, list[tuple[float, Any]]] = {s: [] for s in self.streams}
        self._invalid: dict[str, str] = {}

    def put(self, stream: str, value: Any, stamp_s: float) -> None:
        recent = self._recent[stream]
        recent.append((stamp_s, value))
        del recent[:-self.depth]
        self._invalid.pop(stream, None)

    def reject(self, stream: str, reason: str) -> None:
        self._recent[stream].clear()
        self._invalid[stream] = f'rejected ({reason})'

    def snapshot(self, tick_s: float) -> Snapshot:
        samples, problems = {}, {}
        for stream in self.streams:
            recent = self._recent[stream]
            if not recent:
                problems[stream] = self._invalid.get(stream, 'never received')
                continue
            stamp, value = min(recent, key=lambda item: abs(item[0] - tick_s))
            samples[stream] = Sample(value, stamp, stamp, 0)
            if tick_s - stamp > self.tolerance_s:
                problems[stream] = (f'stale ({tick_s - stamp:.3f} s old, max '
                                    f'{self.tolerance_s:.3f} s)')
        return Snapshot(samples, problems, tick_s)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _open_whole(bag: Path) -> tuple[Any, str]:
    """rosbags' reader of ``bag``, opened; or None and why it could not be."""
    from rosbags.highlevel import AnyReader

    try:
        reader = AnyReader([bag], default_typestore=_typestore())
        reader.open()
        return reader, ''
    except Exception as exc:  # noqa: BLE001 - rosbags raises its own error types per storage
        return None, _one_line(exc)


def _unreadable(bag: Path, problem: str, strict: bool) -> tuple[bool, str | None]:
    """(cut short, the error line) for a bag rosbags cannot open: the error line is None
    only for a bag cut short that may be recovered (not ``strict``)."""
    from act_ros.data.bag_recovery import diagnose

    found = diagnose(bag)
    if not found.cut_short:
        detail = f'; {found.what}' if found.what else ''
        return False, (f'{bag}: not a readable rosbag2 recording ({problem}){detail}; not a '
                       'recording cut short, so nothing is imported')
    if strict:
        return True, (f'{bag}: cannot be read as a complete rosbag2 recording ({problem}; '
                      f'{found.what}); --strict refuses bags cut short (without it, the whole '
                      'messages before the cut are imported)')
    return True, None


def _open_bag(bag: Path, strict: bool, report: ImportReport) -> Any:
    """A reader of ``bag`` (context manager): rosbags for a whole bag; for one cut short
    (missing footer, index or metadata, a truncated chunk), its readable part unless
    ``strict``, announced with one line. Any other failure: :class:`BagImportError`, one
    line naming the file and the reason."""
    from act_ros.data.bag_recovery import RecoveryError, recover

    reader, problem = _open_whole(bag)
    if reader is not None:
        return reader
    _, error = _unreadable(bag, problem, strict)
    if error is not None:
        raise BagImportError(error)
    try:
        recovered = recover(bag, _typestore())
    except RecoveryError as exc:
        raise BagImportError(f'{bag}: cannot be read as a rosbag2 recording ({problem}); '
                             f'nothing to recover either: {exc}') from None
    logger.warning('%s', recovered.summary)
    report.recovered.append(recovered.summary)
    return recovered


def check_bags(bags: Sequence[Path], strict: bool = False) -> int | None:
    """Open every bag before anything is written: :class:`BagImportError` (one line naming
    the file and the reason) for one that is neither whole nor cut short (or cut short
    with ``strict``); the messages of all of them, or None when a bag is cut short (its
    count is known only once it is read)."""
    total: int | None = 0
    for bag in bags:
        reader, problem = _open_whole(Path(bag))
        if reader is None:
            _, error = _unreadable(Path(bag), problem, strict)
            if error is not None:
                raise BagImportError(error)
            total = None
            continue
        try:
            if total is not None:
                total += int(reader.message_count)
        finally:
            reader.close()
    return total


def _read_errors(bag: Path, messages: Iterator[Any]) -> Iterator[Any]:
    """``messages`` of a reader, a failure to read them (a damaged chunk in the middle of
    a bag) as :class:`BagImportError` naming the file and the reason."""
    try:
        yield from messages
    except Exception as exc:  # noqa: BLE001 - rosbags' and the decompressors' own types
        raise BagImportError(f'{bag}: reading its messages failed ({_one_line(exc)}); the '
                             'bag is damaged inside, not cut short: nothing is imported') from None


class _BagEpisodes:
    """Streams the frames of one bag into ``sink`` and yields the
    :class:`~act_ros.data.recording.EpisodeBuffer` (counts) at the end of every episode:
    the caller then saves or discards the sink's open episode (see the module docstring).
    """

    def __init__(self, bag: Path, spec: RecordingSpec, contract: Contract, *, split: str,
                 marker_topic: str | None, gap_s: float, report: ImportReport,
                 sink: FrameSink, progress: Any = None, strict: bool = False) -> None:
        self.bag, self.spec, self.contract = bag, spec, contract
        self.split, self.marker_topic, self.gap_s = split, marker_topic, gap_s
        self.report, self.progress, self.sink, self.strict = report, progress, sink, strict
        self.streams = spec.topic_streams()
        self.convert = {stream: spec.converter(stream) for stream, _ in self.streams.values()}
        self._first_reasons: dict[str, list[str] | None] = {}
        self.ended_by = ''  # why the episode last yielded ended

    def _check_connections(self, reader: Any) -> list[Any]:
        by_topic = {c.topic: c for c in reader.connections}
        problems = []
        for topic, (stream, msgtype) in self.streams.items():
            conn = by_topic.get(topic)
            if conn is None:
                problems.append(f"topic '{topic}' ({stream}, {msgtype}) is not in the bag")
            elif conn.msgtype != msgtype:
                problems.append(f"topic '{topic}' ({stream}) has type {conn.msgtype}, expected "
                                f'{msgtype}')
        if self.split == 'marker':
            if self.marker_topic not in by_topic:
                problems.append(f"marker topic '{self.marker_topic}' is not in the bag")
        if problems:
            present = ', '.join(f'{c.topic} [{c.msgtype}]' for c in reader.connections)
            raise BagImportError(f'{self.bag}: {"; ".join(problems)}. The bag holds: '
                                 f'{present or "no topics"}')
        wanted = set(self.streams) | ({self.marker_topic} if self.split == 'marker' else set())
        return [c for c in reader.connections if c.topic in wanted]

    def _convert(self, stream: str, msg: Any) -> Any:
        try:
            return self.convert[stream](msg)
        except MalformedMessageError as exc:
            reason = str(exc)
            first = self._first_reasons.setdefault(stream, [])
            if first is not None:
                first.append(reason)
                if len(first) >= SYSTEMATIC_REJECTIONS and len(set(first)) == 1:
                    raise BagImportError(f'{self.bag}: every {stream} message is rejected: '
                                         f'{reason}') from None
            self.report.rejected[stream] += 1
            raise

    def __iter__(self) -> Iterator[EpisodeBuffer]:
        reader = _open_bag(self.bag, self.strict, self.report)
        try:
            yield from self._episodes(reader)
        finally:
            reader.__exit__(None, None, None)

    def _episodes(self, reader: Any) -> Iterator[EpisodeBuffer]:
        connections = self._check_connections(reader)
        sampler = _TickSampler(self.spec.streams(), self.spec.tolerance_s)
        buffer = EpisodeBuffer(self.spec, self.contract, sink=self.sink)
        period_ns = 1e9 / self.spec.fps
        half_ns = period_ns / 2  # a tick takes messages logged up to half a period after it
        # Ticks in integer nanoseconds of log time (start + round(k * period)), so that a
        # message stamped at a tick's time always counts for that tick.
        start_ns: int | None = None
        tick = 0
        last_input_ns: int | None = None
        latest: dict[str, int] = {}

        def tick_ns() -> int:
            return start_ns + round(tick * period_ns)

        def sample_while(more) -> Iterator[EpisodeBuffer]:
            nonlocal tick
            while more(tick_ns()):
                at = tick_ns() * 1e-9
                snap = sampler.snapshot(at)
                if snap.ok and buffer.gap_before(at):
                    # Frames keep their times: LeRobot places frame i at i / fps, so a frame
                    # after dropped ticks starts a new episode (as record_node does).
                    self.ended_by = f'a gap of {buffer.close_gap(at)} tick(s)'
                    yield buffer
                    buffer.clear()
                buffer.sample(snap, at)
                tick += 1
                if buffer.full:
                    self.ended_by = 'max_episode_s'
                    yield buffer
                    buffer.clear()

        for conn, stamp_ns, raw in _read_errors(self.bag,
                                                reader.messages(connections=connections)):
            self.report.messages += 1
            if self.progress is not None:
                self.progress.update(1)
            marker = self.split == 'marker' and conn.topic == self.marker_topic
            gap = (self.split == 'gap' and last_input_ns is not None
                   and (stamp_ns - last_input_ns) * 1e-9 > self.gap_s)
            if start_ns is not None:
                if marker:  # the ticks up to the marker end this episode
                    yield from sample_while(lambda t, end=stamp_ns: t <= end)
                elif gap:  # the ticks the inputs before the gap belong to
                    yield from sample_while(lambda t, last=last_input_ns: t - half_ns <= last)
                else:  # the ticks whose messages have all been read
                    yield from sample_while(lambda t, now=stamp_ns: t + half_ns < now)
            if marker or gap:  # end the episode; the next one starts with a complete set
                if buffer.frames or buffer.dropped_ticks:
                    self.ended_by = 'marker' if marker else f'no input for {self.gap_s:g} s'
                    yield buffer
                buffer.clear()
                sampler.clear()
                latest.clear()
                start_ns = None
                if marker:
                    continue
            stream, _ = self.streams[conn.topic]
            last_input_ns = stamp_ns
            try:
                msg = reader.deserialize(raw, conn.msgtype)
            except Exception as exc:  # noqa: BLE001 - rosbags' CDR errors
                raise BagImportError(f'{self.bag}: a {conn.msgtype} message on {conn.topic} at '
                                     f'log time {stamp_ns * 1e-9:.3f} s cannot be decoded '
                                     f'({_one_line(exc)}): nothing is imported') from None
            try:
                value = self._convert(stream, msg)
            except MalformedMessageError as exc:
                sampler.reject(stream, str(exc))
                continue
            self._first_reasons[stream] = None  # a good message: rejections are not systematic
            sampler.put(stream, value, stamp_ns * 1e-9)
            latest[stream] = stamp_ns
            if start_ns is None and len(latest) == len(self.streams):
                # The first tick: the earliest of the newest message of every input, so that
                # one instant's messages, logged a little apart, make its first frame.
                start_ns, tick = min(latest.values()), 0
        if start_ns is not None and last_input_ns is not None:
            yield from sample_while(lambda t: t - half_ns <= last_input_ns)
        if buffer.frames or buffer.dropped_ticks:
            self.ended_by = 'end of the bag'
            yield buffer


def import_bags(bags: Sequence[Path], output: Path, spec: RecordingSpec, *,
                contract: Contract | None = None, split: str = 'bag',
                marker_topic: str | None = None, gap_s: float = 1.0, min_frames: int = 2,
                use_video: bool = True, overwrite: bool = False, robot_type: str = 'ros2_bag',
                progress: bool = True, strict: bool = False,
                video_codec: str = 'libsvtav1') -> ImportReport:
    """Import ``bags`` into a dataset at ``output`` (see the module docstring)."""
    from tqdm import tqdm

    from act_ros.data.writer import AtomicDatasetWriter, check_output

    contract = contract or load_contract()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got '{split}'")
    if split == 'marker' and not marker_topic:
        raise ValueError('split by marker needs --marker-topic')
    if split == 'gap' and not gap_s > 0:
        raise ValueError(f'--split-gap must be > 0 seconds, got {gap_s}')
    if not bags:
        raise ValueError('no bag given')
    for bag in bags:
        if not Path(bag).exists():
            raise FileNotFoundError(f'{bag}: no such bag (a rosbag2 directory or .mcap/.db3 file)')
    check_output(Path(output), overwrite)
    layout = DatasetLayout(contract=contract, image_height=spec.image_height,
                           image_width=spec.image_width, use_video=use_video,
                           robot_type=robot_type, task_text=spec.task)
    total = check_bags([Path(b) for b in bags], strict)  # before anything is written
    report = ImportReport()
    bar = tqdm(total=total, unit='msg', desc='import', disable=not progress, dynamic_ncols=True)
    try:
        with AtomicDatasetWriter(layout, output, overwrite=overwrite,
                                 encoder_queue_frames=ENCODER_QUEUE_FRAMES,
                                 video_codec=video_codec) as writer:
            for bag in bags:
                episodes = _BagEpisodes(Path(bag), spec, contract, split=split,
                                        marker_topic=marker_topic, gap_s=gap_s, report=report,
                                        sink=writer, progress=bar, strict=strict)
                for buffer in episodes:
                    entry = {'bag': str(bag), 'frames': buffer.frames,
                             'dropped_ticks': buffer.dropped_ticks,
                             'drops': buffer.drops.as_dict(), 'ended_by': episodes.ended_by,
                             'start_time_s': buffer.start_s}
                    if buffer.frames < min_frames:
                        writer.discard_open_episode()
                        logger.warning('%s: skipping an episode of %d frame(s) (fewer than %d;'
                                       ' drops %s)', bag, buffer.frames, min_frames,
                                       buffer.drops.as_dict())
                        continue
                    writer.save_open_episode()
                    report.episodes.append(entry)
            if not report.episodes:
                raise BagImportError(f'no episode with at least {min_frames} frames in {list(bags)}'
                                     f' (rejected messages: {dict(report.rejected) or "none"})')
    finally:
        bar.close()
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='act-ros import-bag', description=__doc__,
        formatter_class=HelpFormatter)
    p.add_argument('bags', nargs='+', type=Path, help='rosbag2 directories (or .mcap / .db3)')
    p.add_argument('--output', type=Path, required=True, help='dataset directory to create')
    p.add_argument('--spec', type=Path, help='recording YAML (topics, action source, fps, '
                   'tolerance, image size; see config/record.yaml)')
    p.add_argument('--joint-states-topic')
    p.add_argument('--camera-topic', action='append', default=[], metavar='NAME=TOPIC',
                   help='camera topic, e.g. top=/camera/top/image_raw (repeatable)')
    p.add_argument('--image-transport', choices=('raw', 'compressed'),
                   help='transport of every camera not named by --camera-transport')
    p.add_argument('--camera-transport', action='append', default=[], metavar='NAME=TRANSPORT',
                   help='raw or compressed for one camera, e.g. wrist=compressed (repeatable)')
    p.add_argument('--action-source', choices=('command', 'leader'))
    p.add_argument('--action-topic', help='controller command topic or leader joint states')
    p.add_argument('--command-type', choices=('JointTrajectory', 'Float64MultiArray'))
    p.add_argument('--tolerance', type=float, dest='tolerance_s',
                   help='largest age of an input at a tick, seconds')
    p.add_argument('--image-size', help='stored image size HxW (default: the contract)')
    p.add_argument('--task', help='task string stored with every frame')
    p.add_argument('--split', choices=SPLITS, default='bag', help='one episode per bag, or '
                   'split on a marker topic or on time gaps')
    p.add_argument('--marker-topic', help='topic whose messages end an episode (--split marker)')
    p.add_argument('--split-gap', type=float, default=1.0, help='seconds without input that '
                   'end an episode (--split gap)')
    p.add_argument('--min-frames', type=int, default=2)
    p.add_argument('--video', action=argparse.BooleanOptionalAction, default=True)
    p.add_argument('--video-codec', choices=('libsvtav1', 'h264'), default='libsvtav1',
                   help="libsvtav1 (LeRobot's default, small files) or h264 (ultrafast: about "
                   '15x less CPU, larger files)')
    p.add_argument('--overwrite', action='store_true')
    p.add_argument('--contract', type=Path)
    p.add_argument('--no-progress', action='store_true')
    p.add_argument('--strict', action='store_true', help='refuse a bag cut short (an MCAP file '
                   'without footer or index, a SQLite3 bag without metadata.yaml) instead of '
                   'importing its whole messages up to the cut')
    return p


def spec_from_args(args: argparse.Namespace, contract: Contract) -> RecordingSpec:
    from act_ros.core.contract import parse_image_size

    overrides: dict[str, Any] = {
        'joint_states_topic': args.joint_states_topic, 'image_transport': args.image_transport,
        'action_source': args.action_source, 'action_topic': args.action_topic,
        'command_type': args.command_type, 'tolerance_s': args.tolerance_s, 'task': args.task}
    if args.camera_topic:
        cameras = {}
        for item in args.camera_topic:
            name, sep, topic = item.partition('=')
            if not sep or not topic:
                raise ValueError(f"--camera-topic expects NAME=TOPIC, got '{item}'")
            cameras[name] = topic
        overrides['camera_topics'] = cameras
    if args.camera_transport:
        transports = {}
        for item in args.camera_transport:
            name, sep, transport = item.partition('=')
            if not sep or transport not in ('raw', 'compressed'):
                raise ValueError(f"--camera-transport expects NAME=raw or NAME=compressed, got "
                                 f"'{item}'")
            transports[name] = transport
        overrides['camera_transports'] = transports
    if args.image_size:
        overrides['image_height'], overrides['image_width'] = parse_image_size(args.image_size)
    if args.spec:
        return load_spec(args.spec, contract, **overrides)
    return RecordingSpec.for_contract(contract, **{k: v for k, v in overrides.items()
                                                   if v is not None})


def main(argv: list[str] | None = None) -> int:
    from act_ros.data.writer import quiet_library_output

    setup_logging()
    args = build_parser().parse_args(argv)
    try:
        contract = load_contract(args.contract)
        spec = spec_from_args(args, contract)
        quiet_library_output()
        report = import_bags(args.bags, args.output, spec, contract=contract, split=args.split,
                             marker_topic=args.marker_topic, gap_s=args.split_gap,
                             min_frames=args.min_frames, use_video=args.video,
                             overwrite=args.overwrite, progress=not args.no_progress,
                             strict=args.strict, video_codec=args.video_codec)
    except (BagImportError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f'act-ros import-bag: {exc}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('act-ros import-bag: interrupted; no dataset was written', file=sys.stderr)
        return 130
    print(f'imported {len(report.episodes)} episode(s), {report.frames} frames '
          f'({report.dropped_ticks} ticks dropped, {sum(report.rejected.values())} messages '
          f'rejected) from {len(args.bags)} bag(s) to {args.output}')
    for i, entry in enumerate(report.episodes):
        print(f"  episode {i}: {entry['frames']} frames, {entry['dropped_ticks']} dropped "
              f"{entry['drops'] or ''}, ended by {entry['ended_by']} ({entry['bag']})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
