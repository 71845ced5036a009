"""Write episodes to a LeRobot v3 dataset that appears at its destination only when complete.

The dataset is built in a hidden staging directory next to the destination
(``.<name>.partial-XXXX/dataset``) and renamed into place only after LeRobot's
``finalize()`` succeeded. An exception or Ctrl-C while writing removes the staging
directory, so a directory at the destination is always a finished dataset.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np

from act_ros.data.episode import DatasetLayout, Episode
from act_ros.data.video_backend import video_backend

logger = logging.getLogger(__name__)

STAGING_PREFIX_FMT = '.{name}.partial-'
# LeRobot's streaming encoder drops a frame when its per-camera queue stays full for
# 0.1 s. Episodes are written from memory, faster than the encoder, so the queue must be
# able to hold a whole episode: frames are then never dropped (episodes longer than this
# are refused).
MAX_EPISODE_FRAMES = 100_000
# Video codecs a dataset can be written with: LeRobot's default (AV1, small files; about
# 1.8 cores per 480x640 camera at 30 fps on a 2-core EPYC with SVT-AV1 preset 12) and
# H.264 ultrafast (about 0.12 core per camera there, files a few times larger): the one a
# CPU can encode live while recording.
VIDEO_CODECS = ('libsvtav1', 'h264')
# Rows per call when image bytes are embedded before a Parquet write (fast_image_embedding):
# 64 frames of two 480x640 PNG cameras are about 60 MB.
EMBED_BATCH_ROWS = 64


def local_repo_id(output: Path) -> str:
    """A repo id for a dataset that lives only on disk: ``local/<directory name>``."""
    name = ''.join(c if c.isalnum() or c in '-_.' else '_' for c in output.name) or 'dataset'
    return f'local/{name}'


def quiet_library_output() -> None:
    """Silence the per-episode chatter of the encoder, the muxer and ``datasets`` (for CLIs).

    SVT-AV1 prints its configuration for every video it encodes, FFmpeg's MP4 muxer a line
    per file, and ``datasets`` shows a progress bar for every saved episode; they drown a
    command's own progress bar. A ``SVT_LOG`` already set by the user wins.
    """
    os.environ.setdefault('SVT_LOG', '1')  # errors only
    import av.logging
    import datasets
    datasets.disable_progress_bars()
    # LeRobot hands FFmpeg's log back to FFmpeg's own callback after each video
    # (av.logging.restore_default_callback), which prints at FFmpeg's level, INFO:
    # "Starting second pass: moving the moov atom ..." for every file. Warnings stay.
    av.logging.set_libav_level(av.logging.WARNING)


def check_output(output: Path, overwrite: bool) -> None:
    """Fail early if ``output`` cannot receive a new dataset.

    An existing non-empty directory is refused unless ``overwrite``; an existing file is
    always refused.
    """
    if output.is_file() or output.is_symlink():
        raise FileExistsError(f'--output {output} exists and is not a directory; '
                              'expected a dataset directory path')
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise FileExistsError(f'--output {output} exists and is not empty; '
                              'pass --overwrite to replace it, or choose another directory')


@dataclass(frozen=True)
class WriteResult:
    """What a finished writer produced."""

    path: Path
    repo_id: str
    episodes: int
    frames: int


class AtomicDatasetWriter:
    """Context manager that writes :class:`Episode` objects to a LeRobot dataset atomically.

    Usage::

        with AtomicDatasetWriter(layout, output) as writer:
            writer.add_episode(episode)
        print(writer.result)

    Leaving the ``with`` block normally finalizes the dataset and moves it to ``output``
    (replacing a previous dataset there only when ``overwrite``). Leaving it with an
    exception discards everything written, leaving ``output`` as it was.
    """

    def __init__(self, layout: DatasetLayout, output: str | Path, *, overwrite: bool = False,
                 repo_id: str | None = None, streaming_encoding: bool = True,
                 image_writer_threads: int = 2,
                 encoder_queue_frames: int = MAX_EPISODE_FRAMES,
                 video_codec: str = 'libsvtav1') -> None:
        """Prepare a writer; nothing touches the disk before the ``with`` block.

        Args:
            layout: features, image size and storage mode of the dataset.
            output: the dataset directory to create.
            overwrite: replace a non-empty ``output`` (only once the new one is complete).
            repo_id: id stored in the dataset; default ``local/<output name>``.
            streaming_encoding: encode videos while frames are added (about twice as fast
                as LeRobot's PNG-then-encode path at 480x640); ignored for image datasets.
            image_writer_threads: threads writing PNG files (image datasets, and videos
                when not streaming).
            encoder_queue_frames: frames the streaming encoder may hold per camera. A
                whole episode by default (:meth:`add_episode` writes from memory); frames
                added one by one (:meth:`add_frame`) wait for room instead, so a small
                queue bounds the memory of an episode of any length.
            video_codec: one of :data:`VIDEO_CODECS`.
        """
        self.layout = layout
        self.output = Path(output).expanduser().absolute()
        self.overwrite = overwrite
        self.repo_id = repo_id or local_repo_id(self.output)
        self.streaming_encoding = streaming_encoding and layout.use_video
        self.image_writer_threads = image_writer_threads
        if encoder_queue_frames < 2:
            raise ValueError(f'encoder_queue_frames must be >= 2, got {encoder_queue_frames}')
        self.encoder_queue_frames = int(encoder_queue_frames)
        if video_codec not in VIDEO_CODECS:
            raise ValueError(f"video_codec must be one of {VIDEO_CODECS}, got '{video_codec}'")
        self.video_codec = video_codec
        self.result: WriteResult | None = None
        # Dataset card (markdown), written as README.md beside meta/ when the dataset is
        # committed; set it any time before the with-block ends.
        self.card: str | None = None
        # Further text files (path inside the dataset -> text), written with the card.
        self.extra_files: dict[str, str] = {}
        self._staging: Path | None = None
        self._dataset = None  # LeRobotDataset while open
        self._episodes = 0
        self._frames = 0
        self._open_frames = 0  # frames of the episode being added frame by frame

    @property
    def episodes_written(self) -> int:
        """Episodes saved so far."""
        return self._episodes

    @property
    def frames_written(self) -> int:
        """Frames saved so far."""
        return self._frames

    @property
    def staging_dir(self) -> Path | None:
        """The hidden directory the dataset is built in while the writer is open."""
        return self._staging

    def __enter__(self) -> Self:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        fast_image_embedding()
        check_output(self.output, self.overwrite)
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._staging = Path(tempfile.mkdtemp(
            prefix=STAGING_PREFIX_FMT.format(name=self.output.name), dir=self.output.parent))
        try:
            self._dataset = LeRobotDataset.create(
                repo_id=self.repo_id,
                fps=self.layout.fps,
                features=self.layout.features(),
                root=self._staging / 'dataset',  # LeRobot requires that root does not exist
                robot_type=self.layout.robot_type,
                use_videos=self.layout.use_video,
                video_backend=video_backend(),  # decoder for read-back only
                image_writer_threads=self.image_writer_threads,
                streaming_encoding=self.streaming_encoding,
                encoder_queue_maxsize=self.encoder_queue_frames,
                rgb_encoder=_rgb_encoder(self.video_codec),
            )
        except BaseException:
            self._discard()
            raise
        return self

    def add_episode(self, episode: Episode) -> None:
        """Append one episode (validated against the layout) and save it."""
        if self._dataset is None:
            raise RuntimeError('AtomicDatasetWriter.add_episode() called outside its with-block')
        self.layout.check_episode(episode)
        if episode.length > MAX_EPISODE_FRAMES:
            raise ValueError(f'episode has {episode.length} frames; at most '
                             f'{MAX_EPISODE_FRAMES} are supported per episode')
        contract = self.layout.contract
        state = episode.state.astype(np.float32, copy=False)
        action = episode.action.astype(np.float32, copy=False)
        cameras = [(cam.feature, episode.images[cam.name]) for cam in contract.cameras]
        for t in range(episode.length):
            frame = {feature: frames[t] for feature, frames in cameras}
            frame[contract.state_feature] = state[t]
            frame[contract.action_feature] = action[t]
            for key, values in episode.extras.items():
                frame[key] = values[t].astype(np.float32, copy=False)
            frame['task'] = self.layout.task
            self._dataset.add_frame(frame)
        # One process: forking LeRobot's per-episode encoder pool from this multi-threaded
        # process can deadlock, and streaming encoding does not use it anyway.
        self._dataset.save_episode(parallel_encoding=False)
        self._episodes += 1
        self._frames += episode.length

    @property
    def open_frames(self) -> int:
        """Frames of the episode being added with :meth:`add_frame`, not saved yet."""
        return self._open_frames

    def add_frame(self, images: dict[str, np.ndarray], state: np.ndarray, action: np.ndarray,
                  extras: dict[str, np.ndarray] | None = None) -> bool:
        """Append one frame to the open episode (:meth:`save_open_episode` ends it).

        Images go to the streaming encoder (videos) or to PNG files (image datasets) as
        they come; only the joint values stay in memory. When the encoder is behind this
        waits for room in its queue (never drops a frame). Returns True (the
        :class:`~act_ros.data.recording.FrameSink` protocol).
        """
        if self._dataset is None:
            raise RuntimeError('AtomicDatasetWriter.add_frame() called outside its with-block')
        if self._open_frames >= MAX_EPISODE_FRAMES:
            raise ValueError(f'an episode holds at most {MAX_EPISODE_FRAMES} frames')
        contract = self.layout.contract
        expected = (self.layout.image_height, self.layout.image_width, 3)
        frame: dict = {}
        for cam in contract.cameras:
            image = images[cam.name]
            if image.shape != expected or image.dtype != np.uint8:
                raise ValueError(f"camera '{cam.name}': expected a uint8 {expected} frame, got "
                                 f'{image.dtype} {image.shape}')
            frame[cam.feature] = image
        state = np.asarray(state, dtype=np.float32)
        action = np.asarray(action, dtype=np.float32)
        if not (np.all(np.isfinite(state)) and np.all(np.isfinite(action))):
            raise ValueError('frame state or action contains NaN or infinite values')
        frame[contract.state_feature] = state
        frame[contract.action_feature] = action
        for key, values in (extras or {}).items():
            frame[key] = np.asarray(values, dtype=np.float32)
        frame['task'] = self.layout.task
        self._wait_encoder_room()
        self._dataset.add_frame(frame)
        self._open_frames += 1
        return True

    def save_open_episode(self) -> int:
        """Save the episode built with :meth:`add_frame`; its length."""
        if self._dataset is None:
            raise RuntimeError('AtomicDatasetWriter.save_open_episode() called outside its '
                               'with-block')
        if self._open_frames == 0:
            raise ValueError('the open episode has no frames')
        self._dataset.save_episode(parallel_encoding=False)
        length, self._open_frames = self._open_frames, 0
        self._episodes += 1
        self._frames += length
        return length

    def discard_open_episode(self) -> int:
        """Drop the frames added since the last save (their video is not written); how many."""
        if self._dataset is None or self._open_frames == 0:
            return 0
        _drop_queued_video_frames(self._dataset)
        self._dataset.clear_episode_buffer()  # also cancels the streaming encoder
        dropped, self._open_frames = self._open_frames, 0
        return dropped

    def _wait_encoder_room(self) -> None:
        """Block while a streaming encoder queue is full (LeRobot would drop the frame
        after 0.1 s)."""
        encoder = getattr(getattr(self._dataset, 'writer', None), '_streaming_encoder', None)
        queues = getattr(encoder, '_frame_queues', None)
        if not isinstance(queues, dict):
            return
        while any(q.maxsize and q.qsize() >= q.maxsize - 1 for q in queues.values()):
            time.sleep(0.002)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            if self._open_frames:
                raise RuntimeError(f'{self._open_frames} frame(s) added with add_frame() were '
                                   'neither saved nor discarded')
            if self._episodes == 0:
                raise RuntimeError(f'no episode was written; refusing to create an empty '
                                   f'dataset at {self.output}')
            self._dataset.finalize()
            self._dataset = None
            self._commit()
        except BaseException:
            self._discard()
            raise
        self.result = WriteResult(path=self.output, repo_id=self.repo_id,
                                  episodes=self._episodes, frames=self._frames)

    def _commit(self) -> None:
        """Move the finished dataset to ``output``; the previous one goes only after that."""
        built = self._staging / 'dataset'
        previous = self._staging / 'previous'
        _prune_empty_dirs(built / 'images')  # LeRobot's staging area for frames, now empty
        if self.card is not None:
            (built / 'README.md').write_text(self.card)
        for name, text in self.extra_files.items():
            (built / name).parent.mkdir(parents=True, exist_ok=True)
            (built / name).write_text(text)
        if self.output.is_dir():
            if any(self.output.iterdir()):
                check_output(self.output, self.overwrite)  # it may have appeared meanwhile
                self.output.rename(previous)
            else:
                self.output.rmdir()
        try:
            built.rename(self.output)
        except OSError:
            if previous.exists() and not self.output.exists():
                previous.rename(self.output)
            raise
        shutil.rmtree(self._staging)
        self._staging = None

    def _discard(self) -> None:
        """Drop the partial dataset: let LeRobot close its files, then delete the staging dir."""
        dataset, self._dataset = self._dataset, None
        if dataset is not None:
            _drop_queued_video_frames(dataset)
            try:
                # Closing its writers now keeps LeRobot's __del__ safety net from writing
                # into (and so re-creating) the staging directory after it is deleted.
                dataset.finalize()
            except Exception as exc:  # noqa: BLE001 - the original error matters more
                logger.warning('closing the partial dataset failed (%s: %s); it is deleted '
                               'anyway', type(exc).__name__, exc)
            del dataset
            gc.collect()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None


def fast_image_embedding() -> None:
    """Make LeRobot's image embedding skip tables without images and batch the rest.

    Before a table is written to Parquet, LeRobot maps ``embed_table_storage`` over it one
    row at a time (``embed_images``): one Python call per frame, about 4 ms each here. On a
    saved episode that is a minute for a 10-minute episode, and it runs even when the
    cameras are videos; on LeRobot's aggregation (``act-ros collect --join``, DAgger) it
    runs over every frame of the joined dataset again, 20 minutes for 300 000 frames.
    Tables without an image column are returned as they are; the others are embedded in
    batches of rows by the same function, which gives the same table. Best effort: where
    LeRobot's modules do not have the function by that name, nothing changes.
    """
    import datasets
    from datasets.table import embed_table_storage
    from lerobot.datasets import dataset_writer, io_utils

    original = getattr(io_utils, 'embed_images', None)
    if original is None or getattr(original, '_act_ros_fast', False):
        return

    def embed_images(dataset: datasets.Dataset) -> datasets.Dataset:
        if not any(isinstance(f, datasets.Image) for f in dataset.features.values()):
            return dataset
        layout = dataset.format
        dataset = dataset.with_format('arrow')
        dataset = dataset.map(embed_table_storage, batched=True, batch_size=EMBED_BATCH_ROWS)
        return dataset.with_format(**layout)

    embed_images._act_ros_fast = True  # type: ignore[attr-defined]
    embed_images._act_ros_original = original  # type: ignore[attr-defined]
    io_utils.embed_images = embed_images  # to_parquet_with_hf_images (aggregation)
    if hasattr(dataset_writer, 'embed_images'):
        dataset_writer.embed_images = embed_images  # save_episode


def _rgb_encoder(codec: str):
    """LeRobot's encoder settings for ``codec`` (None: LeRobot's default)."""
    if codec == 'libsvtav1':
        return None
    from lerobot.configs.video import RGBEncoderConfig

    return RGBEncoderConfig(vcodec='h264', preset='ultrafast', crf=23, g=2)


def _prune_empty_dirs(root: Path) -> None:
    """Remove ``root`` and its subdirectories bottom-up where they are empty."""
    if not root.is_dir():
        return
    for path in sorted((p for p in root.rglob('*') if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(path.iterdir()):
            path.rmdir()
    if not any(root.iterdir()):
        root.rmdir()


def _drop_queued_video_frames(dataset) -> None:
    """Empty the streaming encoder's frame queues of a dataset that is being discarded.

    LeRobot's encoder threads check their stop flag only once their queue is empty, and a
    whole episode is queued at once here, so cancelling would otherwise wait (up to 5 s
    per camera) for frames nobody wants to be encoded. Best effort: this reaches into
    LeRobot's private state and does nothing where that state is not found.
    """
    encoder = getattr(getattr(dataset, 'writer', None), '_streaming_encoder', None)
    queues = getattr(encoder, '_frame_queues', None)
    if not isinstance(queues, dict):
        return
    for frame_queue in queues.values():
        try:
            while True:
                frame_queue.get_nowait()
        except queue.Empty:
            pass
