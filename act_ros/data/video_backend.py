"""The video decoder LeRobot datasets are opened with: torchcodec where it loads, else PyAV.

Every place act_ros opens, creates or decodes a LeRobot dataset passes
``video_backend=video_backend()``. Left to itself, LeRobot (0.6) imports torchcodec for
each dataset it opens and, when the wheel is installed but cannot load its FFmpeg
libraries (the usual case without a system FFmpeg), logs the loader's traceback and
"'torchcodec' is installed but cannot be loaded ... Falling back to 'pyav'" as a
warning, although nothing is wrong: PyAV, which LeRobot depends on, decodes the same
videos. Choosing here, once per process, keeps that message off the normal path.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging

logger = logging.getLogger(__name__)

TORCHCODEC = 'torchcodec'
PYAV = 'pyav'


def _torchcodec_problem() -> str | None:
    """Why torchcodec cannot decode here (one line), or None when its decoders load."""
    if importlib.util.find_spec(TORCHCODEC) is None:
        return 'torchcodec is not installed'
    try:
        importlib.import_module('torchcodec.decoders')
    except (ImportError, OSError, RuntimeError) as exc:
        # torchcodec's message is a traceback per FFmpeg version it tried; keep line one.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ''
        return f'torchcodec does not load ({type(exc).__name__}: {first})'
    return None


@functools.cache
def video_backend() -> str:
    """``'torchcodec'`` when ``torchcodec.decoders`` imports (its FFmpeg libraries load),
    else ``'pyav'``; probed on the first call (tens of milliseconds), then cached."""
    problem = _torchcodec_problem()
    if problem is None:
        logger.debug('video decoding with %s', TORCHCODEC)
        return TORCHCODEC
    logger.debug('video decoding with %s: %s', PYAV, problem)
    return PYAV
