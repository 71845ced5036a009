"""``act-ros import-bag``: rosbag2 recordings (MCAP or SQLite3) to a LeRobot v3 dataset.

Reads the bags with ``rosbags`` (pure Python: no ROS install needed) and applies the
recorder's rules (:mod:`act_ros.data.recording`): the inputs are sampled at the
contract's fps on the bag's log time, each tick takes the newest message of every input
and is kept only if all of them are younger than the tolerance, joints are matched by
name, images are converted to RGB and resized. Ticks before every input has appeared
are not counted; later ticks without a fresh set are dropped and counted by reason.

Episodes: one per bag (default), or split where a marker topic publishes (any message
type) or where no input arrived for ``--split-gap`` seconds. The dataset appears at
``--output`` only when every bag has been read and written (atomic writer).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
import logging
from pathlib import Path
import sys
from typing import Any

from act_ros.core.contract import Contract, load_contract
from act_ros.core.decode import MalformedMessageError
from act_ros.data.episode import DatasetLayout, Episode
from act_ros.data.recording import EpisodeBuffer, RecordingSpec, load_spec, make_store

logger = logging.getLogger(__name__)
SPLITS = ('bag', 'marker', 'gap')
# A stream whose first messages are all rejected for the same reason is misconfigured
# (wrong joint names, unsupported encoding): the import stops and says so.
SYSTEMATIC_REJECTIONS = 5
# A message logged up to this long after a tick still counts for that tick (clock jitter
# between publishers that mean the same instant).
TICK_SLACK_NS = 1_000_000


class BagImportError(ValueError):
    """A bag cannot be imported as configured (missing topic, unknown type, bad joints)."""


@dataclass
class ImportReport:
    """What an import read and wrote."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    messages: int = 0
    rejected: Counter = field(default_factory=Counter)

    @property
    def frames(self) -> int:
        return sum(e['frames'] for e in self.episodes)

    @property
    def dropped_ticks(self) -> int:
        return sum(e['dropped_ticks'] for e in self.episodes)

    def as_dict(self) -> dict[str, Any]:
        return {'episodes': self.episodes, 'frames': self.frames,
                'dropped_ticks': self.dropped_ticks, 'messages': self.messages,
                'rejected': dict(self.rejected)}


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


class _BagEpisodes:
    """Iterates the episodes of one bag (see the module docstring)."""

    def __init__(self, bag: Path, spec: RecordingSpec, contract: Contract, *, split: str,
                 marker_topic: str | None, gap_s: float, report: ImportReport,
                 progress: Any = None) -> None:
        self.bag, self.spec, self.contract = bag, spec, contract
        self.split, self.marker_topic, self.gap_s = split, marker_topic, gap_s
        self.report, self.progress = report, progress
        self.streams = spec.topic_streams()
        self.convert = {stream: spec.converter(stream) for stream, _ in self.streams.values()}
        self._first_reasons: dict[str, list[str] | None] = {}

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

    def __iter__(self) -> Iterator[tuple[Episode, EpisodeBuffer]]:
        from rosbags.highlevel import AnyReader

        try:
            reader_cm = AnyReader([self.bag], default_typestore=_typestore())
            reader = reader_cm.__enter__()
        except Exception as exc:  # rosbags raises its own error types per storage
            raise BagImportError(f'{self.bag}: cannot be read as a rosbag2 recording '
                                 f'({type(exc).__name__}: {exc})') from exc
        try:
            yield from self._episodes(reader)
        finally:
            reader_cm.__exit__(None, None, None)

    def _episodes(self, reader: Any) -> Iterator[tuple[Episode, EpisodeBuffer]]:
        connections = self._check_connections(reader)
        store = make_store(self.spec)
        buffer = EpisodeBuffer(self.spec, self.contract)
        period_ns = 1e9 / self.spec.fps
        # Ticks in integer nanoseconds of log time (start + round(k * period)), so that a
        # message stamped at a tick's time always counts for that tick.
        start_ns: int | None = None
        tick = 0
        last_input_ns: int | None = None
        seen: set[str] = set()

        def tick_ns() -> int:
            return start_ns + round(tick * period_ns)

        for conn, stamp_ns, raw in reader.messages(connections=connections):
            self.report.messages += 1
            if self.progress is not None:
                self.progress.update(1)
            marker = self.split == 'marker' and conn.topic == self.marker_topic
            gap = (self.split == 'gap' and last_input_ns is not None
                   and (stamp_ns - last_input_ns) * 1e-9 > self.gap_s)
            if start_ns is not None and not gap:  # the ticks up to this message
                while tick_ns() + TICK_SLACK_NS < stamp_ns:
                    buffer.sample(store.snapshot(tick_ns() * 1e-9))
                    tick += 1
                    if buffer.full:
                        yield buffer.episode(), buffer
                        buffer.clear()
            if marker or gap:  # end the episode; the next one starts with a complete set
                if buffer.frames:
                    yield buffer.episode(), buffer
                buffer.clear()
                store.clear()
                seen.clear()
                start_ns = None
                if marker:
                    continue
            stream, _ = self.streams[conn.topic]
            last_input_ns = stamp_ns
            msg = reader.deserialize(raw, conn.msgtype)
            try:
                value = self._convert(stream, msg)
            except MalformedMessageError as exc:
                store.reject(stream, str(exc))
                continue
            self._first_reasons[stream] = None  # a good message: rejections are not systematic
            store.put(stream, value, stamp_ns * 1e-9, stamp_ns * 1e-9)
            seen.add(stream)
            if start_ns is None and len(seen) == len(self.streams):
                start_ns, tick = stamp_ns, 0  # the first tick with every input present
        if start_ns is not None and last_input_ns is not None:
            while tick_ns() <= last_input_ns + TICK_SLACK_NS:
                buffer.sample(store.snapshot(tick_ns() * 1e-9))
                tick += 1
        if buffer.frames:
            yield buffer.episode(), buffer
        elif buffer.dropped_ticks:
            logger.warning('%s: the last segment has no complete frame (%s)', self.bag,
                           buffer.drops.as_dict())


def import_bags(bags: Sequence[Path], output: Path, spec: RecordingSpec, *,
                contract: Contract | None = None, split: str = 'bag',
                marker_topic: str | None = None, gap_s: float = 1.0, min_frames: int = 2,
                use_video: bool = True, overwrite: bool = False, robot_type: str = 'ros2_bag',
                progress: bool = True) -> ImportReport:
    """Import ``bags`` into a dataset at ``output`` (see the module docstring)."""
    from tqdm import tqdm

    from act_ros.data.writer import AtomicDatasetWriter, check_output

    contract = contract or load_contract()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got '{split}'")
    if split == 'marker' and not marker_topic:
        raise ValueError('split by marker needs --marker-topic')
    if not bags:
        raise ValueError('no bag given')
    for bag in bags:
        if not Path(bag).exists():
            raise FileNotFoundError(f'{bag}: no such bag (a rosbag2 directory or .mcap/.db3 file)')
    check_output(Path(output), overwrite)
    layout = DatasetLayout(contract=contract, image_height=spec.image_height,
                           image_width=spec.image_width, use_video=use_video,
                           robot_type=robot_type, task_text=spec.task)
    report = ImportReport()
    total = _message_count(bags)
    bar = tqdm(total=total, unit='msg', desc='import', disable=not progress, dynamic_ncols=True)
    try:
        with AtomicDatasetWriter(layout, output, overwrite=overwrite) as writer:
            for bag in bags:
                episodes = _BagEpisodes(Path(bag), spec, contract, split=split,
                                        marker_topic=marker_topic, gap_s=gap_s, report=report,
                                        progress=bar)
                for episode, buffer in episodes:
                    entry = {'bag': str(bag), 'frames': episode.length,
                             'dropped_ticks': buffer.dropped_ticks,
                             'drops': buffer.drops.as_dict()}
                    if episode.length < min_frames:
                        logger.warning('%s: skipping an episode of %d frame(s) (fewer than %d)',
                                       bag, episode.length, min_frames)
                        continue
                    writer.add_episode(episode)
                    report.episodes.append(entry)
            if not report.episodes:
                raise BagImportError(f'no episode with at least {min_frames} frames in {list(bags)}'
                                     f' (rejected messages: {dict(report.rejected) or "none"})')
    finally:
        bar.close()
    return report


def _message_count(bags: Sequence[Path]) -> int | None:
    from rosbags.highlevel import AnyReader

    total = 0
    for bag in bags:
        try:
            with AnyReader([Path(bag)], default_typestore=_typestore()) as reader:
                total += int(reader.message_count)
        except Exception:  # noqa: BLE001 - reported properly when the bag is read
            return None
    return total


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='act-ros import-bag', description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('bags', nargs='+', type=Path, help='rosbag2 directories (or .mcap / .db3)')
    p.add_argument('--output', type=Path, required=True, help='dataset directory to create')
    p.add_argument('--spec', type=Path, help='recording YAML (topics, action source, fps, '
                   'tolerance, image size; see config/record.yaml)')
    p.add_argument('--joint-states-topic')
    p.add_argument('--camera-topic', action='append', default=[], metavar='NAME=TOPIC',
                   help='camera topic, e.g. top=/camera/top/image_raw (repeatable)')
    p.add_argument('--image-transport', choices=('raw', 'compressed'))
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
    p.add_argument('--overwrite', action='store_true')
    p.add_argument('--contract', type=Path)
    p.add_argument('--no-progress', action='store_true')
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
    if args.image_size:
        overrides['image_height'], overrides['image_width'] = parse_image_size(args.image_size)
    if args.spec:
        return load_spec(args.spec, contract, **overrides)
    return RecordingSpec.for_contract(contract, **{k: v for k, v in overrides.items()
                                                   if v is not None})


def main(argv: list[str] | None = None) -> int:
    from act_ros.data.writer import quiet_library_output

    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    args = build_parser().parse_args(argv)
    try:
        contract = load_contract(args.contract)
        spec = spec_from_args(args, contract)
        quiet_library_output()
        report = import_bags(args.bags, args.output, spec, contract=contract, split=args.split,
                             marker_topic=args.marker_topic, gap_s=args.split_gap,
                             min_frames=args.min_frames, use_video=args.video,
                             overwrite=args.overwrite, progress=not args.no_progress)
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
              f"{entry['drops'] or ''} ({entry['bag']})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
