"""Camera frames handed to the inference child through shared memory.

Two 480x640 RGB frames are 1.8 MB per chunk request. Pickled through the socket pair they
cost a copy into a bytes object, the socket transfer and a copy out, each holding the
parent's interpreter lock while the node's executor wants it (``split_transfer_ms`` 9-11
ms per chunk on a 2-core CPU in docs/benchmarks/node/in480_c30_precision.json). Here the
parent copies each frame once into an anonymous shared file (Linux ``memfd_create``) that
the child maps too, and sends only where each frame lies: ``('frames', size, ((name,
offset, shape, dtype), ...))``.

One request is in flight at a time (the parent's request lock), so one region serves: the
parent writes it before a request and not again until the reply has come back, and the
child reads it only while it serves that request (its views are read-only and not kept).
The file grows when a larger set of frames comes (the child maps it again at its new
size). Where ``memfd_create`` is missing (macOS), :meth:`SharedFrames.create` returns
``None`` and frames go through the socket as before.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

import numpy as np

ALIGN = 64  # each frame starts on a cache line
TAG = 'frames'


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def is_reference(value: object) -> bool:
    """Whether ``value`` (the images field of a request) is a :meth:`SharedFrames.pack`
    reference rather than the images themselves."""
    return isinstance(value, tuple) and len(value) == 3 and value[0] == TAG


class SharedFrames:
    """The shared region of one parent-child pair; see the module docstring."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None
        self._size = 0

    @classmethod
    def create(cls) -> SharedFrames | None:
        """A new, empty region (parent side), or ``None`` where the platform has none."""
        if not hasattr(os, 'memfd_create'):
            return None
        try:
            fd = os.memfd_create('act_ros_frames', os.MFD_CLOEXEC)
        except OSError:
            return None
        return cls(fd)

    @classmethod
    def attach(cls, fd: int) -> SharedFrames:
        """The parent's region in the child (``fd`` inherited at start)."""
        return cls(fd)

    @staticmethod
    def packable(images: Mapping[str, object]) -> bool:
        """Frames that can travel as raw bytes: numeric numpy arrays (anything else goes
        through the socket, and the child reports what is wrong with it)."""
        return all(isinstance(v, np.ndarray) and v.dtype.kind in 'biuf' for v in images.values())

    def pack(self, images: Mapping[str, np.ndarray]) -> tuple:
        """Copy ``images`` into the region; returns the reference the child unpacks."""
        layout, offset = [], 0
        for name, image in images.items():
            layout.append((name, offset, tuple(image.shape), image.dtype.str))
            offset += _aligned(image.nbytes)
        self._ensure(offset, grow=True)
        for (_, start, shape, dtype), image in zip(layout, images.values(), strict=True):
            np.copyto(np.ndarray(shape, dtype=dtype, buffer=self._map, offset=start), image,
                      casting='no')
        return (TAG, offset, tuple(layout))

    def unpack(self, reference: tuple) -> dict[str, np.ndarray]:
        """Read-only views of the frames a :meth:`pack` reference names (child side)."""
        _, size, layout = reference
        self._ensure(size, grow=False)
        frames = {}
        for name, start, shape, dtype in layout:
            view = np.ndarray(shape, dtype=dtype, buffer=self._map, offset=start)
            view.flags.writeable = False
            frames[name] = view
        return frames

    def _ensure(self, size: int, *, grow: bool) -> None:
        if self._map is not None and size <= self._size:
            return
        if grow:  # the parent: at least double, so a varying frame set rarely remaps
            os.ftruncate(self.fd, max(size, 2 * self._size))
        length = os.fstat(self.fd).st_size
        if length < size:
            raise ValueError(f'shared frame region holds {length} bytes, a request names {size}')
        # The old mapping is dropped, not closed: views of the last request may still
        # exist (it is unmapped when the last of them goes).
        self._map = mmap.mmap(self.fd, length)
        self._size = length

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still exported: the mapping goes with the process
                pass
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
