"""Files and directories that are replaced whole: a reader sees the old one or the new one.

- :func:`write_text_atomic` / :func:`write_json_atomic`: write into a temporary sibling,
  flush it to disk, then rename it over the destination.
- :func:`replace_dir`: put a finished staging directory at ``path``. Where the kernel
  offers it (Linux ``renameat2`` with ``RENAME_EXCHANGE``), the two directories are
  swapped in one step, so ``path`` is never missing, not even for an instant (a
  checkpoint's ``last/`` a resume reads, a model folder a node loads); elsewhere the old
  one is moved aside first and the new one moved in right after.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = None


def _renameat2():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        except OSError:
            _libc = False
    return getattr(_libc, 'renameat2', None) if _libc else None


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; ``False`` where the system cannot (then nothing
    changed)."""
    fn = _renameat2()
    if fn is None:
        return False
    result = fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL, EOPNOTSUPP: not supported here
        return False
    raise OSError(err, f'renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}')


def replace_dir(staging: str | Path, path: str | Path) -> None:
    """Move the complete directory ``staging`` to ``path``, replacing what is there."""
    staging, path = Path(staging), Path(path)
    if path.exists() and exchange(staging, path):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the previous directory
        return
    old = None
    if path.exists():
        old = path.parent / f'.{path.name}.old-{os.getpid()}'
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    try:
        os.replace(staging, path)
    except OSError:
        if old is not None and not path.exists():
            os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` so that no reader ever sees a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f'.{path.name}.tmp-{os.getpid()}'
    try:
        with open(tmp, 'w') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, 'tolist'):
        return value.tolist()
    raise TypeError(f'cannot write {type(value).__name__} to JSON')


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """JSON (no NaN: strict readers refuse it) written with :func:`write_text_atomic`."""
    return write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False,
                                              default=_jsonable) + '\n')
