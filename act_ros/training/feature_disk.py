"""Frozen-backbone feature maps kept on disk and reused while their inputs are unchanged.

Building the layer4 cache (:mod:`act_ros.training.feature_cache`) is one backbone forward
pass per training frame and camera: about 22 minutes for 54 000 frames on 2 cores. A
``--resume`` after the freeze, or the next DAgger iteration (the same frozen backbone on
the previous dataset plus new episodes) would compute the same maps again. Here each map
computed once is appended to a directory and read back the next time:

``DIR/<key>/``, one directory per *backbone key*: a digest of everything the maps depend
on besides the pixels (the state of the backbone stages up to the cut, FrozenBatchNorm
statistics included; the camera normalization the preprocessor applies; the cut; the
autocast precision and the device kind the maps are computed with; the maps' dtype; the
cameras and image shape; torch's version). ``meta.json`` names these components and the
row layout. ``maps.bin`` holds one row per frame (every camera's map, in ``meta.json``'s
order, raw bytes), ``digests.bin`` one record per row: the BLAKE2b digest of the frame's
pixels as the dataset store holds them (uint8, every camera, before normalization), then
the digest of the row's map bytes. A frame is found by its pixels, not its index, so a
dataset whose frames are renumbered or re-encoded hits as long as the pixels are equal.

Crash safety: a batch's maps are appended and flushed to disk before its records, so a
process killed mid-write leaves at most a partial row or record at the end; on load the
rows past the shorter file are dropped (both files truncated to whole rows). A row's
maps are checked against their digest when read. A cache whose ``meta.json`` is missing,
unreadable or for other inputs, or whose rows fail their digest, is deleted and rebuilt
with a warning, never used. One process at a time holds a key's directory (``lock``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from act_ros.core.atomic import write_json_atomic
from act_ros.training.feature_cache import STAGES, FeatureCache, run_stages, stages_up_to

logger = logging.getLogger(__name__)

FORMAT = 1
DIGEST_SIZE = 16  # bytes of a frame's (and a row's) BLAKE2b digest
RECORD_SIZE = 2 * DIGEST_SIZE  # digests.bin: the frame's pixels, then the row's maps
META, MAPS, DIGESTS, LOCK = 'meta.json', 'maps.bin', 'digests.bin', 'lock'
READ_ROWS = 1024  # rows read (and checked) at a time


class CacheCorrupt(Exception):
    """The files of a key's directory do not agree with each other or with their inputs."""


def _hasher(size: int = DIGEST_SIZE) -> Any:
    return hashlib.blake2b(digest_size=size)


def module_state_digest(modules: Sequence[tuple[str, nn.Module]]) -> str:
    """Digest of the modules' parameters and buffers (names, dtypes, shapes and bytes)."""
    h = _hasher(32)
    for prefix, module in modules:
        for name, tensor in module.state_dict().items():
            t = tensor.detach().to('cpu').contiguous()
            h.update(f'{prefix}.{name}:{t.dtype}:{tuple(t.shape)};'.encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def camera_normalization(preprocessor: Any, keys: Sequence[str]) -> dict[str, Any]:
    """What LeRobot's preprocessor does to the camera images before the backbone: its steps
    by name, the float dtype it casts to, and the normalizer's mode, epsilon and statistics
    of the image features. Raises ``ValueError`` when it has no normalizer."""
    from lerobot.configs.types import FeatureType

    steps = list(getattr(preprocessor, 'steps', ()))
    result: dict[str, Any] = {'steps': [type(step).__name__ for step in steps]}
    normalizers = []
    for step in steps:
        if hasattr(step, 'float_dtype'):
            result['float_dtype'] = str(step.float_dtype)
        norm_map = getattr(step, 'norm_map', None)
        stats = getattr(step, '_tensor_stats', None) or getattr(step, 'stats', None)
        if norm_map is None or stats is None:
            continue
        mode = norm_map.get(FeatureType.VISUAL)
        normalizers.append({
            'mode': str(getattr(mode, 'value', mode)), 'eps': float(getattr(step, 'eps', 0.0)),
            'stats': {key: {name: torch.as_tensor(value).float().reshape(-1).tolist()
                            for name, value in sorted((stats.get(key) or {}).items())}
                      for key in keys}})
    if not normalizers:
        raise ValueError('the preprocessor has no normalizer step: the camera normalization '
                         'the maps depend on is unknown')
    result['normalizers'] = normalizers
    return result


def device_kind(device: torch.device | str) -> str:
    """The device's type and kind of kernels (``cpu:AVX2``, ``cuda:NVIDIA H200``): maps
    computed elsewhere may differ in the last bits."""
    device = torch.device(device)
    if device.type == 'cpu':
        return f'cpu:{torch.backends.cpu.get_cpu_capability()}'
    if device.type == 'cuda':
        return f'cuda:{torch.cuda.get_device_name(device)}'
    return device.type


def backbone_components(backbone: nn.Module, cut: str, *, normalization: dict[str, Any],
                        precision: str, dtype: torch.dtype, device: torch.device | str,
                        cameras: Sequence[str], image_shape: Sequence[int]) -> dict[str, Any]:
    """Everything besides the pixels that the maps of the stages up to ``cut`` depend on
    (``meta.json``'s ``components``; their digest names the directory)."""
    names = STAGES[:STAGES.index(cut) + 1]
    stages = list(zip(names, stages_up_to(backbone, cut), strict=True))
    components = {'format': FORMAT, 'cut': cut, 'backbone_state': module_state_digest(stages),
                  'normalization': normalization, 'precision': precision,
                  'map_dtype': str(dtype), 'device': device_kind(device),
                  'cameras': list(cameras), 'image_shape': [int(v) for v in image_shape],
                  'torch': torch.__version__}
    return json.loads(json.dumps(components))  # as meta.json reads back (lists, not tuples)


def cache_key(components: dict[str, Any]) -> str:
    text = json.dumps(components, sort_keys=True, separators=(',', ':'))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def frame_digests(images: dict[str, torch.Tensor], keys: Sequence[str],
                  frames: np.ndarray) -> np.ndarray:
    """(len(frames), DIGEST_SIZE) uint8: each frame's BLAKE2b digest over the pixels of
    every camera in ``keys`` (the store's uint8 (N, 3, H, W) images, before any
    normalization, or :class:`~act_ros.training.data.DecodedFrames` indexed the same way)."""
    out = np.empty((len(frames), DIGEST_SIZE), dtype=np.uint8)
    for i, frame in enumerate(np.asarray(frames, dtype=np.int64).tolist()):
        h = _hasher()
        for key in keys:
            h.update(np.ascontiguousarray(images[key][frame].numpy()))
        out[i] = np.frombuffer(h.digest(), dtype=np.uint8)
    return out


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix('torch.'), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f'unknown map dtype {name!r}')
    return dtype


class DiskFeatureCache:
    """The maps of one backbone key on disk (see the module docstring).

    Use as a context manager: entering takes the key's lock and loads the index (rebuilding
    an inconsistent cache), leaving closes the files and releases the lock.
    """

    def __init__(self, root: str | Path, components: dict[str, Any]) -> None:
        self.components = json.loads(json.dumps(components))
        self.key = cache_key(self.components)
        self.dir = Path(root) / self.key
        self.dtype = _dtype(self.components['map_dtype'])
        self.layout: list[tuple[str, tuple[int, ...]]] | None = None  # camera, map shape
        self.rows = 0
        self.index: dict[bytes, int] = {}
        self._checks = np.zeros((0, DIGEST_SIZE), dtype=np.uint8)  # each row's map digest
        self._lock: int | None = None
        self._maps: Any = None  # append handles, opened at the first append
        self._digests: Any = None

    # -- files ------------------------------------------------------------------------------
    @property
    def row_bytes(self) -> int:
        assert self.layout is not None
        return sum(int(np.prod(shape)) for _, shape in self.layout) * self.dtype.itemsize

    def _path(self, name: str) -> Path:
        return self.dir / name

    def __enter__(self) -> DiskFeatureCache:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path(LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info('feature cache %s: waiting for another process that uses it',
                            self.dir)
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._lock = fd
        try:
            self._load()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in (self._maps, self._digests):
            if handle is not None:
                handle.close()
        self._maps = self._digests = None
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            os.close(self._lock)
            self._lock = None

    def _load(self) -> None:
        meta_path, maps_path, digests_path = (self._path(n) for n in (META, MAPS, DIGESTS))
        sizes = [p.stat().st_size if p.exists() else 0 for p in (maps_path, digests_path)]
        if not meta_path.exists():
            self.reset(f'{MAPS} or {DIGESTS} without {META}' if any(sizes) else None)
            return
        try:
            meta = json.loads(meta_path.read_text())
            self.layout = self._check_meta(meta)
        except (OSError, ValueError, KeyError, TypeError, CacheCorrupt) as exc:
            self.reset(f'{META} is unreadable or not for these inputs ({exc})')
            return
        whole_maps, whole_records = sizes[0] // self.row_bytes, sizes[1] // RECORD_SIZE
        rows = min(whole_maps, whole_records)
        if whole_maps < whole_records:  # records are written after their maps: not a crash
            logger.warning('feature cache %s: %d records but the maps of %d rows only; the '
                           'records past them are dropped', self.dir, whole_records, whole_maps)
        elif sizes != [rows * self.row_bytes, rows * RECORD_SIZE]:
            logger.info('feature cache %s: %d complete rows; the partial row or record after '
                        'them (an interrupted write) is dropped', self.dir, rows)
        if sizes != [rows * self.row_bytes, rows * RECORD_SIZE]:
            for path, size in ((digests_path, rows * RECORD_SIZE),
                               (maps_path, rows * self.row_bytes)):
                if path.exists():
                    os.truncate(path, size)
        records = np.fromfile(digests_path, dtype=np.uint8, count=rows * RECORD_SIZE) \
            if rows else np.zeros(0, dtype=np.uint8)
        if records.size != rows * RECORD_SIZE:
            self.reset(f'{DIGESTS} could not be read whole')
            return
        records = records.reshape(rows, 2, DIGEST_SIZE)
        self.rows = rows
        self._checks = records[:, 1].copy()
        self.index = {}
        for row, digest in enumerate(records[:, 0]):
            self.index.setdefault(digest.tobytes(), row)

    def _check_meta(self, meta: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
        if meta.get('format') != FORMAT or meta.get('key') != self.key \
                or meta.get('components') != self.components:
            raise CacheCorrupt(f'{META} names other inputs than this key')
        layout = [(str(entry['camera']), tuple(int(v) for v in entry['shape']))
                  for entry in meta['layout']]
        if [camera for camera, _ in layout] != self.components['cameras'] \
                or any(not shape or min(shape) < 1 for _, shape in layout):
            raise CacheCorrupt(f'{META}: bad layout {meta["layout"]}')
        if meta.get('row_bytes') != sum(int(np.prod(s)) for _, s in layout) * self.dtype.itemsize:
            raise CacheCorrupt(f'{META}: row_bytes does not match the layout')
        return layout

    def reset(self, reason: str | None) -> None:
        """Delete the cached rows (records first, so that an interruption leaves no record
        without its maps) and the metadata; ``reason``: logged as a warning."""
        if reason:
            logger.warning('feature cache %s: %s; rebuilding it', self.dir, reason)
        for handle in (self._maps, self._digests):
            if handle is not None:
                handle.close()
        self._maps = self._digests = None
        for name in (DIGESTS, MAPS, META):
            self._path(name).unlink(missing_ok=True)
        self.layout, self.rows, self.index = None, 0, {}
        self._checks = np.zeros((0, DIGEST_SIZE), dtype=np.uint8)

    # -- rows -------------------------------------------------------------------------------
    def find(self, digests: np.ndarray) -> np.ndarray:
        """The row of each frame digest (-1: not cached)."""
        return np.array([self.index.get(d.tobytes(), -1) for d in digests], dtype=np.int64)

    def read(self, rows: np.ndarray, out: dict[str, torch.Tensor], positions: np.ndarray) -> None:
        """``out[camera][positions[i]] = maps of row rows[i]``, each row checked against its
        digest first (``CacheCorrupt`` when one differs)."""
        assert self.layout is not None
        mapped = np.memmap(self._path(MAPS), dtype=np.uint8, mode='r',
                           shape=(self.rows, self.row_bytes))
        order = np.argsort(rows, kind='stable')  # in file order
        rows, positions = rows[order], positions[order]
        try:
            for first in range(0, rows.size, READ_ROWS):
                chunk = rows[first:first + READ_ROWS]
                block = np.asarray(mapped[chunk])
                for row, data in zip(chunk.tolist(), block, strict=True):
                    h = _hasher()
                    h.update(data)
                    if h.digest() != self._checks[row].tobytes():
                        raise CacheCorrupt(f'row {row} of {MAPS} does not match its digest')
                where = torch.from_numpy(positions[first:first + READ_ROWS])
                offset = 0
                for camera, shape in self.layout:
                    size = int(np.prod(shape)) * self.dtype.itemsize
                    part = torch.from_numpy(np.ascontiguousarray(block[:, offset:offset + size]))
                    out[camera][where] = part.view(self.dtype).reshape(len(chunk), *shape)
                    offset += size
        finally:
            del mapped

    def _create(self, maps: dict[str, torch.Tensor]) -> None:
        self.layout = [(camera, tuple(int(v) for v in maps[camera].shape[1:]))
                       for camera in self.components['cameras']]
        for name in (DIGESTS, MAPS):  # no rows before the metadata that describes them
            self._path(name).unlink(missing_ok=True)
        write_json_atomic(self._path(META), {
            'format': FORMAT, 'key': self.key, 'components': self.components,
            'layout': [{'camera': camera, 'shape': list(shape)} for camera, shape in self.layout],
            'map_dtype': str(self.dtype), 'row_bytes': self.row_bytes,
            'files': {MAPS: "one row per frame: each camera's map in layout order, raw bytes "
                            '(native byte order)',
                      DIGESTS: f'one {RECORD_SIZE}-byte record per row: BLAKE2b-'
                               f"{DIGEST_SIZE * 8} of the frame's uint8 pixels (cameras in "
                               "order), then BLAKE2b-{DIGEST_SIZE * 8} of the row's map bytes"},
            'byte_order': sys.byteorder})

    def append(self, digests: np.ndarray, maps: dict[str, torch.Tensor]) -> None:
        """Append one row per frame digest: the maps first, flushed to disk, then the
        records (a process killed in between leaves maps without records: dropped on
        load)."""
        if self.layout is None:
            self._create(maps)
        assert self.layout is not None
        count = len(digests)
        parts = []
        for camera, shape in self.layout:
            tensor = maps[camera]
            if tuple(tensor.shape) != (count, *shape) or tensor.dtype != self.dtype:
                raise ValueError(f'{camera}: maps {tuple(tensor.shape)} {tensor.dtype}, the cache '
                                 f'holds {(count, *shape)} {self.dtype}')
            parts.append(tensor.detach().to('cpu').contiguous().view(torch.uint8)
                         .reshape(count, -1).numpy())
        block = np.ascontiguousarray(np.concatenate(parts, axis=1))
        checks = np.empty((count, DIGEST_SIZE), dtype=np.uint8)
        for i, data in enumerate(block):
            h = _hasher()
            h.update(data)
            checks[i] = np.frombuffer(h.digest(), dtype=np.uint8)
        records = np.concatenate([np.asarray(digests, dtype=np.uint8).reshape(count, -1),
                                  checks], axis=1)
        if self._maps is None:
            self._maps = open(self._path(MAPS), 'ab')
            self._digests = open(self._path(DIGESTS), 'ab')
        self._maps.write(block.tobytes())
        self._maps.flush()
        os.fsync(self._maps.fileno())
        self._digests.write(records.tobytes())
        self._digests.flush()
        os.fsync(self._digests.fileno())
        for i, digest in enumerate(records[:, :DIGEST_SIZE]):
            self.index.setdefault(digest.tobytes(), self.rows + i)
        self._checks = np.concatenate([self._checks, checks])
        self.rows += count


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob('*') if p.is_file())


@torch.no_grad()
def build_feature_cache_on_disk(disk: DiskFeatureCache, digests: np.ndarray,
                                backbone: nn.Module, frames: np.ndarray, num_frames: int,
                                load_images: Callable[[np.ndarray], dict[str, torch.Tensor]],
                                keys: Sequence[str], *, batch_size: int = 64,
                                device: torch.device | str = 'cpu', progress: bool = False
                                ) -> FeatureCache:
    """:func:`~act_ros.training.feature_cache.build_feature_cache` for the layer4 cut from
    images, with ``disk``: frames whose pixel digest (``digests[i]`` for ``frames[i]``) is
    cached are read from it, the others computed (in batches of ``batch_size``, as the
    memory-only build does, so the same frames give the same bits) and appended. Frames
    of equal pixels are computed once. A disk that fails to take a write is left alone
    for the rest of the build (warned): the maps are still returned."""
    from tqdm import tqdm

    start = time.perf_counter()
    cut, dtype = disk.components['cut'], disk.dtype
    frames = np.asarray(frames, dtype=np.int64)
    digests = np.asarray(digests, dtype=np.uint8).reshape(len(frames), DIGEST_SIZE)
    stages = stages_up_to(backbone, cut)
    was_training = backbone.training
    backbone.eval()
    maps: dict[str, torch.Tensor] = {}

    def allocate(shapes: dict[str, tuple[int, ...]]) -> None:
        for key in keys:
            if key not in maps:
                maps[key] = torch.empty((len(frames), *shapes[key]), dtype=dtype)

    try:
        with disk:
            rows = disk.find(digests)
            hits = np.flatnonzero(rows >= 0)
            if hits.size:
                assert disk.layout is not None
                allocate(dict(disk.layout))
                try:
                    disk.read(rows[hits], maps, hits)
                except (CacheCorrupt, OSError, ValueError) as exc:
                    disk.reset(str(exc))
                    hits = np.zeros(0, dtype=np.int64)
                    rows[:] = -1
            first_of: dict[bytes, int] = {}
            unique, copies = [], []
            for position in np.flatnonzero(rows < 0).tolist():
                digest = digests[position].tobytes()
                if digest in first_of:
                    copies.append((position, first_of[digest]))
                else:
                    first_of[digest] = position
                    unique.append(position)
            unique_positions = np.asarray(unique, dtype=np.int64)
            writable = True
            for first in tqdm(range(0, unique_positions.size, batch_size),
                              desc=f'feature cache ({cut})', unit='batch',
                              disable=not progress, leave=False):
                chunk = unique_positions[first:first + batch_size]
                out = run_stages(stages, load_images(frames[chunk]), keys, device, dtype)
                allocate({key: tuple(value.shape[1:]) for key, value in out.items()})
                where = torch.from_numpy(chunk)
                for key in keys:
                    maps[key][where] = out[key]
                if writable:
                    try:
                        disk.append(digests[chunk], out)
                    except OSError as exc:
                        writable = False
                        logger.warning('feature cache %s: could not append (%s); the rest of '
                                       'this build stays in memory only', disk.dir, exc)
            for position, source in copies:
                for key in keys:
                    maps[key][position] = maps[key][source]
    finally:
        backbone.train(was_training)
    cache = FeatureCache(maps, frames, num_frames, time.perf_counter() - start, cut=cut,
                         computed=len(unique), location=disk.dir)
    logger.info('feature cache (%s): %d frames x %d cameras, maps %s, %.0f MB: %d read from %s, '
                '%d computed, in %.0f s', cut, len(frames), len(keys),
                tuple(next(iter(maps.values())).shape[1:]) if maps else (), cache.nbytes / 1e6,
                cache.reused, disk.dir, cache.computed, cache.seconds)
    return cache
