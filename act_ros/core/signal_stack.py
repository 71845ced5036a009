"""The calling thread's alternate signal stack, kept across calls that replace it.

OpenVINO's CPU plugin installs an alternate signal stack of its own (an ``mmap`` of about
11 KB) on the thread that first uses it (``create_plugin_engine``: one plugin per
``ov.Core``), and when the plugin is destroyed it puts back the stack it found only if its
own is still installed on the destroying thread, then frees its own. A plugin destroyed
out of order (a second ``Core`` created before the first one is gone) or on another
thread (Python's garbage collector runs in whatever thread allocates) leaves the thread
that created it with an alternate stack that no longer exists. Python installs its signal
handlers with ``SA_ONSTACK``: the next signal that thread handles (Ctrl-C in the main
thread) cannot be delivered, and the kernel kills the process with SIGSEGV before
faulthandler can print anything. That ended test runs at the trainer's SIGINT test, the
first real signal after the OpenVINO tests in the same process
(``test/test_signal_stack.py`` reproduces it in a child process).

:func:`kept_signal_stack` puts the caller's stack back after such a call, so a library's
stack is never left installed on this package's threads: the plugin then sees, at its
destruction, that its stack is not installed and frees it without touching anyone's.
Linux only (the layout of ``stack_t`` below); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Iterator

SS_DISABLE = 2


class StackT(ctypes.Structure):
    """``stack_t`` on Linux."""

    _fields_ = [('ss_sp', ctypes.c_void_p), ('ss_flags', ctypes.c_int),
                ('ss_size', ctypes.c_size_t)]


def _load_libc():  # noqa: ANN202 - a ctypes library or None
    if not sys.platform.startswith('linux'):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
    except OSError:
        return None
    libc.sigaltstack.argtypes = (ctypes.POINTER(StackT), ctypes.POINTER(StackT))
    libc.sigaltstack.restype = ctypes.c_int
    return libc


_LIBC = _load_libc()


def current_signal_stack() -> tuple[int, int, int] | None:
    """This thread's alternate signal stack as ``(address, size, flags)`` (flags
    ``SS_DISABLE``: none); ``None`` where it cannot be read."""
    if _LIBC is None:
        return None
    stack = StackT()
    if _LIBC.sigaltstack(None, ctypes.byref(stack)) != 0:
        return None
    return int(stack.ss_sp or 0), int(stack.ss_size), int(stack.ss_flags)


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """Run the block, then give this thread back the alternate signal stack it had before
    (if the block replaced it)."""
    before = current_signal_stack()
    try:
        yield
    finally:
        if before is not None and current_signal_stack() != before:
            address, size, flags = before
            stack = StackT(address or None, flags & SS_DISABLE, size)
            _LIBC.sigaltstack(ctypes.byref(stack), None)
