"""Episodes saved one at a time (a recording session), each readable as soon as it is saved.

Layout for a dataset at ``OUTPUT``:

- ``.OUTPUT.episodes/episode_NNNNNN/``: one LeRobot v3 dataset per saved episode, written
  atomically (:class:`~act_ros.data.writer.AtomicDatasetWriter`): it exists complete or
  not at all. An episode being recorded streams into the hidden staging directory of its
  shard as its frames arrive (:class:`EpisodeWriter`: a background thread feeds the video
  encoder or the PNG writers), so memory does not grow with its length;
- ``OUTPUT``: every saved episode in one LeRobot v3 dataset with one data file, one video
  file per camera and one metadata file per episode. A save appends the new episode
  (:meth:`EpisodeStore.commit`): its videos are hard links to the shard's (copied where
  links are not possible), its small tables are rewritten with the dataset's indices, the
  statistics are merged with the running ones, and ``meta/info.json`` is replaced last:
  the episode is part of the dataset from that rename on. Nothing already saved is read
  or rewritten, so a save takes the same time at episode 1 and at episode 500.

What the recorder knows of an episode beyond LeRobot's tables (its frames, dropped ticks
by reason, the sample time of its first frame, the episode it continues: see
``act_ros.ros.recording.record_node``) is saved with it: ``meta/recording.json`` in its
shard, ``meta/recording/episode_NNNNNN.json`` (the episode's index in ``OUTPUT``) in the
dataset, written before the commit point and read with :func:`recording_metadata`.

A crash or SIGKILL while an episode is being recorded loses only that episode (its
staging directory is removed by the next session); one during a save leaves the episodes
saved before it, and the next session (:meth:`EpisodeStore.sync`) removes the files of an
append that did not reach ``meta/info.json`` and appends every shard ``OUTPUT`` lacks.
A new session on the same ``OUTPUT`` continues it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.atomic import replace_dir, write_text_atomic
from act_ros.data.episode import DatasetLayout, Episode

logger = logging.getLogger(__name__)
SHARD_PREFIX = 'episode_'
_CHUNK_FILE = re.compile(r'chunk-(\d+)/file-(\d+)\.(parquet|mp4)$')
#: The recorder's metadata of an episode: in its shard, and per episode in the dataset.
SHARD_RECORDING_META = 'meta/recording.json'
RECORDING_META_FMT = 'meta/recording/episode_{index:06d}.json'
_RECORDING_META_FILE = re.compile(r'meta/recording/episode_(\d+)\.json$')
# Statistics of bookkeeping columns that shift with an episode's place in the dataset.
_SHIFTED_STATS = ('min', 'max', 'mean', 'q01', 'q10', 'q50', 'q90', 'q99')


class EpisodeStore:
    """Saved episodes of ``output`` (see the module docstring)."""

    def __init__(self, output: str | Path, layout: DatasetLayout) -> None:
        self.output = Path(output).expanduser().absolute()
        self.layout = layout
        self.shards = self.output.parent / f'.{self.output.name}.episodes'
        if self.output.exists() and not self.shards.is_dir():
            raise FileExistsError(f'{self.output} exists and was not written by a recording '
                                  f'session (no {self.shards}); choose another output')
        self._lock = threading.Lock()  # index allocation and appends
        self._allocated = -1

    # -- shards ------------------------------------------------------------------------
    def saved(self) -> list[Path]:
        """The complete episode datasets, in order."""
        if not self.shards.is_dir():
            return []
        return sorted(p for p in self.shards.iterdir() if p.name.startswith(SHARD_PREFIX)
                      and (p / 'meta' / 'info.json').is_file())

    def next_index(self) -> int:
        """The shard number the next episode gets."""
        saved = self.saved()
        last = int(saved[-1].name[len(SHARD_PREFIX):]) if saved else -1
        return max(last, self._allocated) + 1

    def _allocate(self) -> int:
        with self._lock:
            index = self.next_index()
            self._allocated = index
            return index

    def remove_partial(self) -> list[Path]:
        """Delete the staging directories of episodes that were being recorded or saved
        when a session died (only whole shards are episodes); the removed paths."""
        if not self.shards.is_dir():
            return []
        removed = [p for p in self.shards.iterdir()
                   if p.name.startswith(f'.{SHARD_PREFIX}') and '.partial-' in p.name]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def begin(self, queue_frames: int = 60, video_codec: str = 'h264',
              nice: int = 0) -> EpisodeWriter:
        """Start streaming the next episode into its shard (see :class:`EpisodeWriter`)."""
        self.shards.mkdir(parents=True, exist_ok=True)
        return EpisodeWriter(self.layout, self.shards / f'{SHARD_PREFIX}{self._allocate():06d}',
                             queue_frames=queue_frames, video_codec=video_codec, nice=nice)

    def save(self, episode: Episode) -> int:
        """Write ``episode`` (in memory) as the next saved episode and append it to
        ``output``; its index in ``output``."""
        from act_ros.data.writer import AtomicDatasetWriter

        self.shards.mkdir(parents=True, exist_ok=True)
        shard = self.shards / f'{SHARD_PREFIX}{self._allocate():06d}'
        with AtomicDatasetWriter(self.layout, shard) as writer:
            writer.add_episode(episode)
        return self.commit(shard)

    # -- the dataset at output ---------------------------------------------------------
    def episodes_in_output(self) -> int:
        info = self.output / 'meta' / 'info.json'
        if not info.is_file():
            return 0
        return int(json.loads(info.read_text()).get('total_episodes', 0))

    def needs_rebuild(self) -> bool:
        """Whether ``output`` lacks saved episodes (a session stopped during a save)."""
        return self.episodes_in_output() != len(self.saved())

    def sync(self) -> int:
        """Bring ``output`` up to date with the shards after an interrupted session: drop
        what an unfinished append left, append the shards it lacks; episodes appended."""
        saved = self.saved()
        with self._lock:
            present = self._repair()
            if present > len(saved):
                raise RuntimeError(f'{self.output} holds {present} episodes but only '
                                   f'{len(saved)} are saved in {self.shards}')
            for shard in saved[present:]:
                self._append(shard)
        return len(saved) - present

    rebuild = sync  # the name of earlier versions

    def commit(self, shard: Path) -> int:
        """Append the saved episode ``shard`` (one episode, this store's layout) to
        ``output``; its episode index there."""
        with self._lock:
            return self._append(Path(shard))

    def _append(self, shard: Path) -> int:
        src_info = _info(shard)
        if src_info['total_episodes'] != 1:
            raise ValueError(f'{shard}: expected one episode, found {src_info["total_episodes"]}')
        if not (self.output / 'meta' / 'info.json').is_file():
            self._create_from(shard)
            return 0
        info = _info(self.output)
        _check_same_features(info, src_info, self.output, shard)
        index, offset = int(info['total_episodes']), int(info['total_frames'])
        chunk, file = divmod(index, int(info['chunks_size']))
        length = int(src_info['total_frames'])
        task_map, tasks = _merge_tasks(self.output, shard)
        made: list[Path] = []
        try:
            made.append(_write_data(shard, self.output, chunk, file, index, offset, task_map))
            for key in _video_keys(src_info):
                made.append(_link_video(shard, self.output, key, chunk, file))
            made.append(_write_episode_meta(shard, self.output, chunk, file, index, offset,
                                            task_map, _video_keys(src_info)))
            meta = _write_recording_meta(shard, self.output, index)
            if meta is not None:
                made.append(meta)
            if tasks is not None:
                _write_parquet_atomic(tasks, self.output / 'meta' / 'tasks.parquet')
            info = dict(info)
            info['total_episodes'] = index + 1
            info['total_frames'] = offset + length
            info['total_tasks'] = int(tasks.num_rows) if tasks is not None \
                else int(info['total_tasks'])
            info['splits'] = {'train': f'0:{index + 1}'}
        except BaseException:
            for path in made:
                path.unlink(missing_ok=True)
            raise
        # The commit point: from this rename on the episode is part of the dataset.
        write_text_atomic(self.output / 'meta' / 'info.json', json.dumps(info, indent=4))
        self._merge_stats(shard, index, offset, task_map)
        logger.info('%s: episode %d appended (%d frames)', self.output, index, length)
        return index

    def _create_from(self, shard: Path) -> None:
        """``output`` as a copy of the first episode's shard (videos hard-linked)."""
        staging = Path(tempfile.mkdtemp(prefix=f'.{self.output.name}.create-',
                                        dir=self.output.parent))
        built = staging / 'dataset'
        try:
            shutil.copytree(shard, built, copy_function=_link_or_copy)
            moved = built / SHARD_RECORDING_META
            if moved.is_file():
                target = built / RECORDING_META_FMT.format(index=0)
                target.parent.mkdir(parents=True, exist_ok=True)
                moved.rename(target)
            replace_dir(built, self.output)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _merge_stats(self, shard: Path, index: int, offset: int,
                     task_map: dict[int, int]) -> None:
        from lerobot.datasets.compute_stats import aggregate_stats
        from lerobot.datasets.io_utils import load_stats
        from lerobot.datasets.utils import serialize_dict

        new = _shift_stats(load_stats(shard) or {}, index, offset, task_map)
        old = load_stats(self.output) or {}
        merged = aggregate_stats([s for s in (old, new) if s])
        write_text_atomic(self.output / 'meta' / 'stats.json',
                          json.dumps(serialize_dict(merged), indent=4))

    def _repair(self) -> int:
        """Remove the files of episodes ``meta/info.json`` does not count (an append cut
        short) and recompute the statistics when they lag; the episodes present."""
        present = self.episodes_in_output()
        if not present:
            if self.output.exists() and any(self.output.iterdir()):
                raise FileExistsError(f'{self.output} is not a dataset (no meta/info.json) but '
                                      f'{self.shards} holds saved episodes; move it away and '
                                      'start again to rebuild it from them')
            return 0
        info = json.loads((self.output / 'meta' / 'info.json').read_text())
        chunks = int(info['chunks_size'])
        for root in (self.output / 'data', self.output / 'meta' / 'episodes',
                     self.output / 'videos', self.output / 'meta' / 'recording'):
            for path in list(root.rglob('*') if root.is_dir() else ()):
                if path.is_file() and path.name.startswith('.'):
                    path.unlink()  # a temporary file of an interrupted write
                    continue
                match = _CHUNK_FILE.search(path.as_posix())
                if match and int(match[1]) * chunks + int(match[2]) >= present:
                    path.unlink()
                match = _RECORDING_META_FILE.search(path.as_posix())
                if match and int(match[1]) >= present:
                    path.unlink()
        stats = self.output / 'meta' / 'stats.json'
        counted = None
        if stats.is_file():
            data = json.loads(stats.read_text())
            counted = (data.get(self.layout.contract.state_feature) or {}).get('count')
        if counted != [int(info['total_frames'])]:
            self._recompute_stats(present)
        return present

    def _recompute_stats(self, present: int) -> None:
        from lerobot.datasets.compute_stats import aggregate_stats
        from lerobot.datasets.io_utils import load_stats
        from lerobot.datasets.utils import serialize_dict

        parts, offset = [], 0
        for index, shard in enumerate(self.saved()[:present]):
            parts.append(_shift_stats(load_stats(shard) or {}, index, offset,
                                      _task_map(self.output, shard)))
            offset += int(json.loads((shard / 'meta' / 'info.json').read_text())['total_frames'])
        if parts:
            write_text_atomic(self.output / 'meta' / 'stats.json',
                              json.dumps(serialize_dict(aggregate_stats(parts)), indent=4))


class EpisodeWriter:
    """One episode streamed into its shard while it is recorded.

    :meth:`add_frame` (the :class:`~act_ros.data.recording.FrameSink` of the recorder's
    :class:`~act_ros.data.recording.EpisodeBuffer`) never blocks: it queues the frame for
    a background thread that hands it to the dataset writer (streaming video encoder or
    PNG writers) and returns False when ``queue_frames`` frames are already waiting (the
    disk or the encoder is behind; the tick is counted as dropped). Memory is bounded by
    the queues, whatever the episode's length. :meth:`finish` saves the episode as a
    complete shard; :meth:`discard` drops it. A write error stops the episode:
    :attr:`error` holds it and later frames are refused. The writer thread, and the
    encoder threads it starts, run ``nice`` steps below the process (Linux: per thread),
    so the sampling keeps the CPU when encoding competes for it.
    """

    def __init__(self, layout: DatasetLayout, path: Path, queue_frames: int = 60,
                 video_codec: str = 'h264', nice: int = 0) -> None:
        from act_ros.data.writer import AtomicDatasetWriter

        self.path = path
        self.index = int(path.name[len(SHARD_PREFIX):])
        self.error: BaseException | None = None
        self._closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=max(2, int(queue_frames)))
        self.nice = int(nice)
        self._writer = AtomicDatasetWriter(layout, path, encoder_queue_frames=max(2, queue_frames),
                                           image_writer_threads=2, video_codec=video_codec)
        self._writer.__enter__()
        self._thread = threading.Thread(target=self._run, name=f'episode-writer-{self.index}',
                                        daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def frames_written(self) -> int:
        return self._writer.open_frames

    def add_frame(self, images: dict[str, np.ndarray], state: np.ndarray,
                  action: np.ndarray) -> bool:
        if self._closed or self.error is not None:
            return False
        try:
            self._queue.put_nowait((images, state, action))
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        if self.nice > 0 and hasattr(os, 'setpriority'):
            try:  # threads created from here on (the encoders) inherit it
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            except OSError:
                pass
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.error is not None:
                continue
            try:
                self._writer.add_frame(*item)
            except BaseException as exc:  # noqa: BLE001 - reported by finish() / error
                self.error = exc
                logger.error('episode %d: writing a frame failed: %s: %s', self.index,
                             type(exc).__name__, exc)

    def _stop(self, drain: bool) -> None:
        self._closed = True
        if drain:
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
        self._queue.put(None)
        self._thread.join()

    def finish(self, metadata: dict[str, Any] | None = None) -> Path:
        """Write the queued frames, save the episode and make its shard complete (with
        ``metadata`` as its ``meta/recording.json``)."""
        if metadata is not None:
            self._writer.extra_files[SHARD_RECORDING_META] = json.dumps(metadata, indent=2)
        self._stop(drain=False)
        if self.error is None and self._writer.open_frames == 0:
            self.error = ValueError('the episode has no frames')
        if self.error is not None:
            self._abort(self.error)
            raise self.error
        try:
            self._writer.save_open_episode()
        except BaseException as exc:
            self._abort(exc)
            raise
        self._writer.__exit__(None, None, None)
        return self.path

    def discard(self) -> int:
        """Drop the episode (nothing of it stays on disk); the frames it had."""
        frames = self._writer.open_frames + self._queue.qsize()
        self._stop(drain=True)
        self._abort(RuntimeError('discarded'))
        return frames

    def _abort(self, exc: BaseException) -> None:
        try:
            self._writer.discard_open_episode()
        except Exception:  # noqa: BLE001 - the staging directory goes anyway
            pass
        self._writer.__exit__(type(exc), exc, None)


def recording_metadata(dataset: str | Path, index: int) -> dict[str, Any] | None:
    """The recorder's metadata of episode ``index`` of a dataset written by an
    :class:`EpisodeStore` (None for an episode saved without any)."""
    path = Path(dataset) / RECORDING_META_FMT.format(index=index)
    return json.loads(path.read_text()) if path.is_file() else None


# -- appending one shard to the dataset -----------------------------------------------
def _write_recording_meta(shard: Path, output: Path, index: int) -> Path | None:
    """The shard's recording metadata as episode ``index``'s in ``output`` (None: it has
    none)."""
    src = shard / SHARD_RECORDING_META
    if not src.is_file():
        return None
    path = output / RECORDING_META_FMT.format(index=index)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, src.read_text())
    return path


def _info(root: Path) -> dict:
    """``meta/info.json`` of a dataset, as stored."""
    return json.loads((root / 'meta' / 'info.json').read_text())


def _link_or_copy(src: str, dst: str) -> str:
    """Hard link ``src`` to ``dst`` (same file system), else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _video_keys(info: dict) -> list[str]:
    return [k for k, ft in info['features'].items() if ft.get('dtype') == 'video']


def _check_same_features(info: dict, src: dict, output: Path, shard: Path) -> None:
    def shape(features: dict) -> dict:
        return {k: (ft['dtype'], tuple(ft['shape'])) for k, ft in features.items()}

    if shape(info['features']) != shape(src['features']) or info['fps'] != src['fps']:
        raise ValueError(f'{shard} does not fit {output}: the dataset stores '
                         f"{shape(info['features'])} at {info['fps']} fps, the episode "
                         f"{shape(src['features'])} at {src['fps']} fps")


def _chunk_path(root: Path, template: str, chunk: int, file: int, **keys: str) -> Path:
    return root / template.format(chunk_index=chunk, file_index=file, **keys)


def _write_parquet_atomic(table: Any, path: Path) -> Path:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _set(table: Any, name: str, values: Any) -> Any:
    import pyarrow as pa

    at = table.schema.get_field_index(name)
    if at < 0:
        return table
    field = table.schema.field(at)
    return table.set_column(at, field, pa.array(values, type=field.type))


def _task_map(output: Path, shard: Path) -> dict[int, int]:
    return _merge_tasks(output, shard)[0]


def _merge_tasks(output: Path, shard: Path) -> tuple[dict[int, int], Any]:
    """(shard task index -> dataset task index, the dataset's new tasks table or None when
    it already has every task)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    have = pq.read_table(output / 'meta' / 'tasks.parquet')
    new = pq.read_table(shard / 'meta' / 'tasks.parquet')
    name_col = 'task' if 'task' in have.column_names else '__index_level_0__'
    known = dict(zip(have.column(name_col).to_pylist(), have.column('task_index').to_pylist()))
    mapping, added = {}, []
    for task, idx in zip(new.column(name_col).to_pylist(), new.column('task_index').to_pylist()):
        if task not in known:
            known[task] = len(known)
            added.append(task)
        mapping[int(idx)] = int(known[task])
    if not added:
        return mapping, None
    rows = have.to_pylist() + [{name_col: t, 'task_index': known[t]} for t in added]
    return mapping, pa.Table.from_pylist(rows, schema=have.schema)


def _write_data(shard: Path, output: Path, chunk: int, file: int, index: int, offset: int,
                task_map: dict[int, int]) -> Path:
    import pyarrow.parquet as pq
    from lerobot.datasets.utils import DEFAULT_DATA_PATH

    table = pq.read_table(_chunk_path(shard, DEFAULT_DATA_PATH, 0, 0))
    n = table.num_rows
    table = _set(table, 'episode_index', np.full(n, index, np.int64))
    table = _set(table, 'index', np.arange(offset, offset + n, dtype=np.int64))
    tasks = np.asarray(table.column('task_index').to_pylist(), np.int64)
    table = _set(table, 'task_index', np.array([task_map[int(t)] for t in tasks], np.int64))
    return _write_parquet_atomic(table, _chunk_path(output, DEFAULT_DATA_PATH, chunk, file))


def _link_video(shard: Path, output: Path, key: str, chunk: int, file: int) -> Path:
    from lerobot.datasets.utils import DEFAULT_VIDEO_PATH

    src = _chunk_path(shard, DEFAULT_VIDEO_PATH, 0, 0, video_key=key)
    dst = _chunk_path(output, DEFAULT_VIDEO_PATH, chunk, file, video_key=key)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f'.{dst.name}.tmp')
    tmp.unlink(missing_ok=True)
    _link_or_copy(str(src), str(tmp))
    os.replace(tmp, dst)
    return dst


def _write_episode_meta(shard: Path, output: Path, chunk: int, file: int, index: int,
                        offset: int, task_map: dict[int, int], video_keys: list[str]) -> Path:
    import pyarrow.parquet as pq
    from lerobot.datasets.utils import DEFAULT_EPISODES_PATH

    table = pq.read_table(_chunk_path(shard, DEFAULT_EPISODES_PATH, 0, 0))
    if table.num_rows != 1:
        raise ValueError(f'{shard}: expected one episode row, found {table.num_rows}')
    row = table.to_pylist()[0]
    values: dict[str, Any] = {
        'episode_index': index, 'data/chunk_index': chunk, 'data/file_index': file,
        'dataset_from_index': row['dataset_from_index'] + offset,
        'dataset_to_index': row['dataset_to_index'] + offset,
        'meta/episodes/chunk_index': chunk, 'meta/episodes/file_index': file}
    for key in video_keys:
        values[f'videos/{key}/chunk_index'] = chunk
        values[f'videos/{key}/file_index'] = file
    for name, shift in (('episode_index', index), ('index', offset)):
        for stat in _SHIFTED_STATS:
            col = f'stats/{name}/{stat}'
            if col in row:
                values[col] = (np.asarray(row[col], np.float64) + shift).tolist()
    for stat in _SHIFTED_STATS:  # one task per recorded episode: its index, remapped
        col = f'stats/task_index/{stat}'
        if col in row and len(task_map) == 1:
            values[col] = [float(next(iter(task_map.values())))] * len(row[col])
    for name, value in values.items():
        if name in table.column_names:
            table = _set(table, name, [value])
    return _write_parquet_atomic(table, _chunk_path(output, DEFAULT_EPISODES_PATH, chunk, file))


def _shift_stats(stats: dict, index: int, offset: int, task_map: dict[int, int]) -> dict:
    """An episode's statistics as they read at its place in the dataset."""
    out = {k: dict(v) for k, v in stats.items()}
    for name, shift in (('episode_index', index), ('index', offset)):
        for stat in _SHIFTED_STATS:
            if name in out and stat in out[name]:
                out[name][stat] = np.asarray(out[name][stat], np.float64) + shift
    if 'task_index' in out and len(task_map) == 1:
        task = float(next(iter(task_map.values())))
        for stat in _SHIFTED_STATS:
            if stat in out['task_index']:
                out['task_index'][stat] = np.full_like(
                    np.asarray(out['task_index'][stat], np.float64), task)
    return out
