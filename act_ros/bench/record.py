"""``act-ros bench record``: memory and dropped ticks of a long recording, and of
``act-ros import-bag`` over a long bag.

``record``: a publisher process sends two 480x640 rgb8 cameras (a moving textured scene,
so the video encoder has real work), the follower's and a leader arm's joint states at
30 Hz over the middleware; ``record_node`` runs in its own process recording back-to-back
episodes of ``--episode-s`` (videos) for ``--minutes``, then is stopped with SIGINT.
Sampled every 0.5 s with psutil: the resident memory of the recorder's process tree
(its peak is the figure), and from its log: every saved episode's frames, dropped ticks
by reason and save time.

``import``: writes a bag of ``--minutes`` (rosbags, MCAP: two JPEG 480x640 cameras, joint
states, a leader arm at 30 Hz) and imports it with ``act-ros import-bag
--image-transport compressed --action-source leader`` in a child process (one episode:
the whole bag), sampling its tree's memory the same way.

Each prints one JSON summary (and writes it to ``--output``). Nothing here asserts a
bound: the figures are for docs/recording.md. On a shared machine run it when nothing
else runs; ``--minutes 1 --episode-s 15`` is a quick check of the harness itself (with
episodes as long as the run, the stop loses the only one).

``store``: the time of appending a saved episode to the dataset, at episode 1 and at
episode ``--episodes`` (small PNG episodes: what the append costs, without encoding).

    act-ros bench record record --minutes 10
    act-ros bench record import --minutes 10
    act-ros bench record store --episodes 50 --episode-s 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from act_ros.core.arguments import HelpFormatter
from act_ros.ros.evaluation.dds import dds_environment

SAVED = re.compile(r'episode (\d+) saved: (\d+) frames, (\d+) ticks dropped ?(\{[^}]*\})?;.*'
                   r'\(save took ([\d.]+) s: shard ([\d.]+) s, append ([\d.]+) s\)')


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    env.setdefault('HF_HUB_OFFLINE', '1')
    env.setdefault('SVT_LOG', '1')
    return dds_environment(env)


def _tree_rss(proc: Any) -> int:
    """Resident bytes of a process and all its descendants (0 once it is gone)."""
    import psutil

    total = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class _Sampler:
    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self.start = time.monotonic()

    def sample(self) -> int:
        rss = _tree_rss(self.proc)
        self.peak = max(self.peak, rss)
        self.samples.append((time.monotonic() - self.start, rss))
        return rss


def _frames(size: tuple[int, int], count: int = 60):
    """``count`` frames of a textured scene moving across the image (encoder load like a
    real camera's: detail and motion, not noise)."""
    import numpy as np

    h, w = size
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 255, (h // 8, 2 * w // 8, 3), dtype=np.uint8)
    texture = np.repeat(np.repeat(texture, 8, axis=0), 8, axis=1)
    out = []
    for k in range(count):
        shift = int(k * w / count)
        frame = texture[:, shift:shift + w].copy()
        frame[h // 3:h // 3 + 40, (7 * k) % (w - 40):(7 * k) % (w - 40) + 40] = 255
        out.append(frame)
    return out


# -- record ----------------------------------------------------------------------------
def publisher_main(argv: list[str]) -> int:
    """The publisher process (cameras, follower and leader joint states at 30 Hz)."""
    import numpy as np
    import rclpy

    from act_ros.core.contract import load_contract
    from act_ros.ros.harness import RobotHarness
    from act_ros.ros.spin import PoolExecutor

    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument('--size', default='480x640')
    args = p.parse_args(argv)
    h, w = (int(v) for v in args.size.split('x'))
    contract = load_contract()
    rclpy.init()
    frames = _frames((h, w))
    phase = np.linspace(0, 2 * np.pi, contract.num_joints)
    joints = dict(zip(contract.joint_names, np.zeros(contract.num_joints)))
    follower = RobotHarness(joints=joints, image=frames[0], rate_hz=30.0, name='bench_arm')
    leader = RobotHarness(joints=joints, image=frames[0], cameras=(), rate_hz=30.0,
                          namespace='leader', name='bench_leader')
    state = {'k': 0}

    def advance() -> None:
        state['k'] += 1
        k = state['k']
        follower.image = frames[k % len(frames)]
        q = 0.5 * np.sin(k / 30.0 + phase)
        follower.joints = dict(zip(contract.joint_names, q))
        leader.joints = dict(zip(contract.joint_names, q + 0.01))

    follower.create_timer(1 / 30.0, advance)
    executor = PoolExecutor(2)
    executor.add_node(follower)
    executor.add_node(leader)
    try:
        executor.spin()
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    return 0


def bench_record(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix='bench_record_', dir=args.workdir))
    output = work / 'demos'
    env = _env()
    env.setdefault('ROS_DOMAIN_ID', str(args.domain_id))
    logs = {name: (work / f'{name}.log').open('w') for name in ('publisher', 'recorder')}
    py = sys.executable
    publisher = subprocess.Popen([py, '-m', 'act_ros.bench.record', '_publisher', '--size',
                                  args.size], env=env, stdout=logs['publisher'],
                                 stderr=subprocess.STDOUT)
    h, w = (int(v) for v in args.size.split('x'))
    recorder = subprocess.Popen(
        [py, '-m', 'act_ros.ros.recording.record_node', '--ros-args',
         '-p', f'output:={output}', '-p', 'start_recording:=true',
         '-p', f'max_episode_s:={args.episode_s}', '-p', 'restart_after_save:=true',
         '-p', f'image_height:={h}', '-p', f'image_width:={w}', '-p', 'use_video:=true',
         '-p', f'video_codec:={args.video_codec}',
         '-p', 'action_source:=leader', '-p', 'action_topic:=leader/joint_states'],
        env=env, stdout=logs['recorder'], stderr=subprocess.STDOUT)
    sampler = _Sampler(recorder.pid)
    deadline = time.monotonic() + 60 * args.minutes
    try:
        while time.monotonic() < deadline:
            if recorder.poll() is not None or publisher.poll() is not None:
                raise RuntimeError(f'a process ended early; see {work}/*.log')
            sampler.sample()
            time.sleep(0.5)
        recorder.send_signal(signal.SIGINT)
        while recorder.poll() is None and time.monotonic() < deadline + 300:
            sampler.sample()
            time.sleep(0.5)
    finally:
        for proc in (recorder, publisher):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for log in logs.values():
            log.close()
    text = (work / 'recorder.log').read_text()
    episodes = [{'episode': int(m[1]), 'frames': int(m[2]), 'dropped_ticks': int(m[3]),
                 'drops': m[4] or '{}', 'save_s': float(m[5]), 'append_s': float(m[7])}
                for m in SAVED.finditer(text)]
    dropped: dict[str, int] = {}
    for e in episodes:
        for reason, count in json.loads(e['drops'].replace("'", '"')).items():
            dropped[reason] = dropped.get(reason, 0) + count
    result = {
        'what': 'record', 'minutes': args.minutes, 'episode_s': args.episode_s,
        'video_codec': args.video_codec,
        'size': args.size, 'peak_rss_mb': round(sampler.peak / 2**20, 1),
        'rss_mb_at': {f'{t:.0f}s': round(r / 2**20) for t, r in sampler.samples[::60]},
        'episodes_saved': len(episodes), 'frames': sum(e['frames'] for e in episodes),
        'dropped_ticks': sum(e['dropped_ticks'] for e in episodes),
        'dropped_by_reason': dropped,
        'save_s_first': episodes[0]['save_s'] if episodes else None,
        'save_s_last': episodes[-1]['save_s'] if episodes else None,
        'save_s': [e['save_s'] for e in episodes],
        'append_s': [e['append_s'] for e in episodes],
        'recorder_exit': recorder.returncode, 'workdir': _kept(work, args.keep)}
    result['dataset'] = _check_dataset(output)
    result['recording'] = _recording_summary(output, result['dataset'].get('episodes', 0))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _kept(work: Path, keep: bool) -> str | None:
    """Where a run with ``--keep`` left its data, for the summary: the folder's name in
    ``--workdir`` (a committed result names no path of this machine; the log has it)."""
    if not keep:
        return None
    print(f'[bench record] data and logs kept in {work}', file=sys.stderr)
    return f'WORKDIR/{work.name}'


def _check_dataset(root: Path) -> dict[str, Any]:
    """Episodes and frames of the dataset, as LeRobot opens it."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        from act_ros.data.video_backend import video_backend

        ds = LeRobotDataset(f'local/{root.name}', root=root, video_backend=video_backend())
        item = ds[len(ds) - 1]  # the last frame decodes
        return {'episodes': ds.meta.total_episodes, 'frames': ds.meta.total_frames,
                'last_frame_keys': sorted(k for k in item if k.startswith('observation'))}
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return {'error': f'{type(exc).__name__}: {exc}'}


def _recording_summary(root: Path, episodes: int) -> dict[str, Any]:
    """What the recorder's per-episode metadata says over the run: episodes that continue
    the one before (a cap or a gap split them), episodes flagged for drops, why each ended,
    and the shortest episode."""
    from act_ros.data.episode_store import recording_metadata

    metas = [m for m in (recording_metadata(root, k) for k in range(episodes)) if m]
    ended: dict[str, int] = {}
    for m in metas:
        ended[str(m.get('ended_by'))] = ended.get(str(m.get('ended_by')), 0) + 1
    return {'episodes_with_metadata': len(metas),
            'continuations': sum(m.get('continues_episode') is not None for m in metas),
            'flagged': sum(bool(m.get('flagged')) for m in metas),
            'ended_by': ended,
            'shortest_frames': min((m.get('frames', 0) for m in metas), default=None)}


# -- store -----------------------------------------------------------------------------
def bench_store(args: argparse.Namespace) -> dict[str, Any]:
    """Time of appending a saved episode to the dataset (EpisodeStore.commit) at every
    save of ``--episodes`` episodes of ``--episode-s`` (48x64 PNG frames: the cost of the
    append, not of encoding)."""
    from act_ros.core.contract import load_contract
    from act_ros.data.episode import DatasetLayout
    from act_ros.data.episode_store import EpisodeStore
    from act_ros.data.synthetic import synthetic_episode
    from act_ros.data.writer import AtomicDatasetWriter

    contract = load_contract()
    work = Path(tempfile.mkdtemp(prefix='bench_store_', dir=args.workdir))
    layout = DatasetLayout(contract=contract, image_height=48, image_width=64, use_video=False,
                           robot_type='bench', task_text='bench')
    store = EpisodeStore(work / 'demos', layout)
    store.shards.mkdir(parents=True)
    frames = max(2, int(args.episode_s * contract.fps))
    times = []
    for k in range(args.episodes):
        shard = store.shards / f'episode_{k:06d}'
        with AtomicDatasetWriter(layout, shard) as writer:
            writer.add_episode(synthetic_episode(layout, frames, k))
        start = time.perf_counter()
        store.commit(shard)
        times.append(time.perf_counter() - start)
    result = {'what': 'store append', 'episodes': args.episodes, 'frames_per_episode': frames,
              'append_s_first': round(times[0], 4), 'append_s_last': round(times[-1], 4),
              'append_s_median_first_10': round(sorted(times[:10])[len(times[:10]) // 2], 4),
              'append_s_median_last_10': round(sorted(times[-10:])[len(times[-10:]) // 2], 4),
              'dataset': _check_dataset(work / 'demos')}
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


# -- import ----------------------------------------------------------------------------
def write_bag(path: Path, minutes: float, size: tuple[int, int]) -> dict[str, Any]:
    """A rosbags MCAP bag like a real session's: two JPEG cameras, joint states and a
    leader arm at 30 Hz, ``minutes`` long."""
    import cv2
    import numpy as np
    from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    from act_ros.core.contract import load_contract

    contract = load_contract()
    store = get_typestore(Stores.ROS2_JAZZY)
    T = store.types
    names = list(contract.joint_names)
    frames = _frames(size)
    jpegs = [np.frombuffer(cv2.imencode('.jpg', cv2.cvtColor(f, cv2.COLOR_RGB2BGR),
                                        [cv2.IMWRITE_JPEG_QUALITY, 90])[1], np.uint8)
             for f in frames]
    ticks = int(minutes * 60 * contract.fps)
    start = 1_000_000_000_000
    writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
    writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
    with writer:
        cams = {cam: writer.add_connection(f'/camera/{cam}/image_raw/compressed',
                                           'sensor_msgs/msg/CompressedImage', typestore=store)
                for cam in contract.camera_names}
        js = writer.add_connection('/joint_states', 'sensor_msgs/msg/JointState', typestore=store)
        leader = writer.add_connection('/leader/joint_states', 'sensor_msgs/msg/JointState',
                                       typestore=store)
        phase = np.linspace(0, 2 * np.pi, len(names))
        for k in range(ticks):
            ns = start + round(k * 1e9 / contract.fps)
            header = T['std_msgs/msg/Header'](
                stamp=T['builtin_interfaces/msg/Time'](sec=ns // 10**9, nanosec=ns % 10**9),
                frame_id='')
            q = 0.5 * np.sin(k / 30.0 + phase)
            for conn, values in ((js, q), (leader, q + 0.01)):
                msg = T['sensor_msgs/msg/JointState'](header=header, name=names,
                                                      position=values.astype(np.float64),
                                                      velocity=np.zeros(0), effort=np.zeros(0))
                writer.write(conn, ns, store.serialize_cdr(msg, conn.msgtype))
            for i, conn in enumerate(cams.values()):
                msg = T['sensor_msgs/msg/CompressedImage'](header=header, format='jpeg',
                                                           data=jpegs[(k + 7 * i) % len(jpegs)])
                writer.write(conn, ns, store.serialize_cdr(msg, conn.msgtype))
    size_mb = sum(p.stat().st_size for p in path.rglob('*') if p.is_file()) / 2**20
    return {'ticks': ticks, 'bag_mb': round(size_mb, 1)}


def bench_import(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix='bench_import_', dir=args.workdir))
    h, w = (int(v) for v in args.size.split('x'))
    started = time.monotonic()
    bag_info = write_bag(work / 'bag', args.minutes, (h, w))
    write_s = time.monotonic() - started
    log = (work / 'import.log').open('w')
    cmd = [sys.executable, '-m', 'act_ros.cli', 'import-bag', str(work / 'bag'), '--output',
           str(work / 'ds'), '--image-transport', 'compressed', '--action-source', 'leader',
           '--action-topic', '/leader/joint_states', '--joint-states-topic', '/joint_states',
           '--camera-topic', 'top=/camera/top/image_raw',
           '--camera-topic', 'wrist=/camera/wrist/image_raw', '--image-size', args.size,
           '--video-codec', args.video_codec, '--no-progress']
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    sampler = _Sampler(proc.pid)
    while proc.poll() is None:
        sampler.sample()
        time.sleep(0.5)
    log.close()
    text = (work / 'import.log').read_text()
    result = {'what': 'import-bag', 'minutes': args.minutes, 'size': args.size,
              'video_codec': args.video_codec, **bag_info,
              'bag_write_s': round(write_s, 1), 'import_s': round(time.monotonic() - started, 1),
              'peak_rss_mb': round(sampler.peak / 2**20, 1),
              'rss_mb_at': {f'{t:.0f}s': round(r / 2**20) for t, r in sampler.samples[::60]},
              'exit': proc.returncode, 'summary': text.strip().splitlines()[-2:],
              'dataset': _check_dataset(work / 'ds'), 'workdir': _kept(work, args.keep)}
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='act-ros bench record', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('what', choices=('record', 'import', 'both', 'store'))
    p.add_argument('--episodes', type=int, default=50, help='store: episodes to append')
    p.add_argument('--minutes', type=float, default=10.0)
    p.add_argument('--episode-s', type=float, default=60.0,
                   help='record: length of each back-to-back episode')
    p.add_argument('--size', default='480x640', help='camera size HxW')
    p.add_argument('--video-codec', choices=('h264', 'libsvtav1'), default='h264',
                   help='codec of the recorded or imported videos')
    p.add_argument('--domain-id', type=int, default=77, help='record: ROS_DOMAIN_ID if unset')
    p.add_argument('--workdir', type=Path, default=None, help='where the data goes (a temp dir '
                   'inside it; default: the system temp dir)')
    p.add_argument('--keep', action='store_true', help='keep the recorded data and logs')
    p.add_argument('--output', type=Path, help='also write the JSON summary here')
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['_publisher']:
        return publisher_main(argv[1:])
    args = build_parser().parse_args(argv)
    if not args.minutes > 0:
        print(f'--minutes must be > 0, got {args.minutes}', file=sys.stderr)
        return 2
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    results = []
    if args.what in ('record', 'both'):
        results.append(bench_record(args))
        print(json.dumps(results[-1], indent=1), flush=True)
    if args.what == 'store':
        results.append(bench_store(args))
        print(json.dumps(results[-1], indent=1), flush=True)
    if args.what in ('import', 'both'):
        results.append(bench_import(args))
        print(json.dumps(results[-1], indent=1), flush=True)
    if args.output:
        from act_ros.core.atomic import write_text_atomic
        from act_ros.provenance import result_provenance

        provenance = result_provenance('act-ros bench record',
                                       argv if argv is not None else sys.argv[1:],
                                       output_path=args.output, output_option='--output',
                                       omit=('--workdir',))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.output, json.dumps({'provenance': provenance, 'runs': results},
                                                  indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
