"""How a command logs: the package's own lines, and other libraries' only when they warn.

Every ``act-ros`` command that logs calls :func:`setup_logging` once. The root logger
stays at WARNING, so a library that reports its ordinary work at INFO (PyOpenGL's "No
OpenGL_accelerate module loaded", ONNX's graph passes, ...) says nothing on the happy path,
while its warnings and errors still show; the ``act_ros`` loggers report at ``level``.
"""

from __future__ import annotations

import logging

PACKAGE_LOGGER = 'act_ros'
FORMAT = '%(levelname)s %(name)s: %(message)s'


def setup_logging(level: int = logging.INFO) -> None:
    """Log the package's records from ``level`` on and everyone else's from WARNING on,
    as ``LEVEL name: message`` lines on stderr."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    logging.getLogger().setLevel(logging.WARNING)  # also when a library configured the root
    logging.getLogger(PACKAGE_LOGGER).setLevel(level)
