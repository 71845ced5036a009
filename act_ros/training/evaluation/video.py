"""Episode videos for a person to look at: both cameras side by side, MP4 (PyAV) or GIF.

Frames are streamed to the file as the episode runs, so memory stays flat.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

CAMERA_ORDER = ('top', 'wrist')


def side_by_side(images: dict[str, np.ndarray], height: int = 240) -> np.ndarray:
    """Cameras (``top`` then ``wrist``, then any others) scaled to ``height``, joined left
    to right; even width and height (needed by yuv420p encoders)."""
    names = [n for n in CAMERA_ORDER if n in images] + sorted(set(images) - set(CAMERA_ORDER))
    if not names:
        raise ValueError('no camera images to put in the video (is rendering off?)')
    tiles = []
    for name in names:
        img = np.asarray(images[name])
        width = max(2, round(img.shape[1] * height / img.shape[0]))
        tiles.append(cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA))
    frame = np.concatenate(tiles, axis=1)
    return frame[: frame.shape[0] // 2 * 2, : frame.shape[1] // 2 * 2]


class VideoWriter:
    """Write RGB frames to ``path``: ``.mp4`` (H.264 via PyAV) or ``.gif`` (Pillow)."""

    def __init__(self, path: str | Path, *, fps: int = 30) -> None:
        self.path = Path(path)
        self.fps = fps
        suffix = self.path.suffix.lower()
        if suffix not in ('.mp4', '.gif'):
            raise ValueError(f'video path must end in .mp4 or .gif, got {self.path}')
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._gif_frames: list = []
        self._container = None
        self._stream = None
        self._is_gif = suffix == '.gif'

    def add(self, frame: np.ndarray) -> None:
        """Append one HxWx3 uint8 RGB frame (all frames must have the same size)."""
        if self._is_gif:
            from PIL import Image
            # GIFs are large: keep every second frame at half the rate.
            if len(self._gif_frames) == 0 or getattr(self, '_gif_skip', False):
                self._gif_frames.append(Image.fromarray(frame))
            self._gif_skip = not getattr(self, '_gif_skip', False)
            return
        import av

        if self._container is None:
            self._container = av.open(str(self.path), mode='w')
            self._stream = self._container.add_stream('libx264', rate=self.fps)
            self._stream.width, self._stream.height = frame.shape[1], frame.shape[0]
            self._stream.pix_fmt = 'yuv420p'
            self._stream.options = {'crf': '23', 'preset': 'veryfast'}
        video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format='rgb24')
        for packet in self._stream.encode(video_frame):
            self._container.mux(packet)

    def close(self) -> None:
        """Finish the file."""
        if self._is_gif:
            if self._gif_frames:
                first, *rest = self._gif_frames
                first.save(self.path, save_all=True, append_images=rest, loop=0,
                           duration=int(2000 / self.fps))
            self._gif_frames = []
            return
        if self._container is not None:
            for packet in self._stream.encode():
                self._container.mux(packet)
            self._container.close()
            self._container = None

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
