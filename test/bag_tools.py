"""Test helpers for recorded demonstrations: write rosbag2 files (MCAP or SQLite3) of an
episode with ``rosbags``, and read a dataset back as arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from act_ros.core.contract import Contract


def write_episode_bag(path: Path, episode, contract: Contract, *, storage: str = 'mcap',
                      compressed: bool = False, shuffle_joints: bool = True,
                      drop_camera_ticks: tuple[tuple[str, int], ...] = (),
                      start_s: float = 100.0, extra_topics: dict[str, list[float]] | None = None,
                      compressed_cameras: tuple[str, ...] = (),
                      offsets_s: dict[str, np.ndarray] | None = None,
                      gap_after: int | None = None, gap_s: float = 0.0,
                      zstd_chunks: bool = False) -> Path:
    """One message per stream and tick at ``start_s + t / fps``: joint states (joints
    shuffled, plus an extra joint), the two cameras and the commanded JointTrajectory.
    ``drop_camera_ticks``: (camera, tick) pairs whose image is left out. ``extra_topics``:
    topic -> times (s) of ``std_msgs/Empty`` messages (episode markers).
    ``compressed_cameras``: cameras published as PNG ``CompressedImage`` on
    ``<topic>/compressed`` whatever ``compressed`` says. ``offsets_s``: stream
    (``joint_states``, ``command`` or a camera name) -> per-tick offset of its log time
    and header stamp (publishers that mean the same instant, logged a little apart).
    ``gap_after``: ticks after this one are logged ``gap_s`` later (a pause in the
    recording). ``zstd_chunks``: MCAP chunks compressed with zstd (rosbags closes a chunk
    at 1 MiB)."""
    import cv2
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    T = store.types
    Header, Time, Duration = (T['std_msgs/msg/Header'], T['builtin_interfaces/msg/Time'],
                              T['builtin_interfaces/msg/Duration'])
    plugin = StoragePlugin.MCAP if storage == 'mcap' else StoragePlugin.SQLITE3
    names = list(contract.joint_names)
    order = list(range(len(names)))[::-1] if shuffle_joints else list(range(len(names)))
    dropped = set(drop_camera_ticks)

    def stamp(t: float):
        ns = int(round(t * 1e9))
        return Header(stamp=Time(sec=ns // 10**9, nanosec=ns % 10**9), frame_id='')

    offsets = offsets_s or {}

    def when(stream: str, t: int) -> float:
        base = start_s + t / contract.fps + (gap_s if gap_after is not None and t > gap_after
                                            else 0.0)
        return base + (float(offsets[stream][t]) if stream in offsets else 0.0)

    writer_cm = Writer(path, version=9, storage_plugin=plugin)
    if zstd_chunks:
        from rosbags.rosbag2 import CompressionFormat, CompressionMode

        writer_cm.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
    with writer_cm as writer:
        js = writer.add_connection('/joint_states', 'sensor_msgs/msg/JointState', typestore=store)
        cmd = writer.add_connection('/arm_controller/joint_trajectory',
                                    'trajectory_msgs/msg/JointTrajectory', typestore=store)

        def packed(cam: str) -> bool:
            return compressed or cam in compressed_cameras

        cams = {cam: writer.add_connection(
            f'/camera/{cam}/image_raw' + ('/compressed' if packed(cam) else ''),
            'sensor_msgs/msg/CompressedImage' if packed(cam) else 'sensor_msgs/msg/Image',
            typestore=store) for cam in contract.camera_names}
        markers = {topic: writer.add_connection(topic, 'std_msgs/msg/Empty', typestore=store)
                   for topic in (extra_topics or {})}
        events = []
        for t in range(episode.length):
            now = when('joint_states', t)
            ns = int(round(now * 1e9))
            state = episode.state[t]
            msg = T['sensor_msgs/msg/JointState'](
                header=stamp(now), name=[names[i] for i in order] + ['camera_mount'],
                position=np.array([state[i] for i in order] + [0.5], dtype=np.float64),
                velocity=np.zeros(0), effort=np.zeros(0))
            events.append((ns, 0, js, store.serialize_cdr(msg, js.msgtype)))
            point = T['trajectory_msgs/msg/JointTrajectoryPoint'](
                positions=episode.action[t].astype(np.float64), velocities=np.zeros(0),
                accelerations=np.zeros(0), effort=np.zeros(0),
                time_from_start=Duration(sec=0, nanosec=33_333_333))
            now = when('command', t)
            ns = int(round(now * 1e9))
            msg = T['trajectory_msgs/msg/JointTrajectory'](header=stamp(now), joint_names=names,
                                                           points=[point])
            events.append((ns, 1, cmd, store.serialize_cdr(msg, cmd.msgtype)))
            for k, (cam, conn) in enumerate(cams.items()):
                if (cam, t) in dropped:
                    continue
                rgb = episode.images[cam][t]
                now = when(cam, t)
                ns = int(round(now * 1e9))
                if packed(cam):
                    ok, buf = cv2.imencode('.png', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
                    msg = T['sensor_msgs/msg/CompressedImage'](
                        header=stamp(now), format='png', data=np.frombuffer(buf, np.uint8))
                else:
                    bgr = np.ascontiguousarray(rgb[:, :, ::-1])  # bgr8: the colour order test
                    msg = T['sensor_msgs/msg/Image'](
                        header=stamp(now), height=rgb.shape[0], width=rgb.shape[1],
                        encoding='bgr8', is_bigendian=0, step=rgb.shape[1] * 3,
                        data=bgr.reshape(-1))
                events.append((ns, 2 + k, conn, store.serialize_cdr(msg, conn.msgtype)))
        for topic, times in (extra_topics or {}).items():
            for when in times:
                events.append((int(round(when * 1e9)), 9, markers[topic],
                               store.serialize_cdr(T['std_msgs/msg/Empty'](),
                                                   'std_msgs/msg/Empty')))
        for ns, _, conn, data in sorted(events, key=lambda e: (e[0], e[1])):
            writer.write(conn, ns, data)
    return path


def read_dataset(root: Path, contract: Contract, size: tuple[int, int]):
    """(dataset, FrameStore) of a LeRobot dataset, decoded at ``size``."""
    from act_ros.training.data import load_frames, open_dataset

    dataset = open_dataset(root, contract)
    n = len(dataset.hf_dataset)
    store = load_frames(dataset, contract, size, seg_start=np.zeros(n, np.int64),
                        seg_end=np.full(n, n, np.int64))
    return dataset, store
