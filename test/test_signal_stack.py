"""A real SIGINT after OpenVINO backends were built and dropped is handled, not fatal.

OpenVINO's CPU plugin installs an alternate signal stack of its own on the thread that
first uses it and frees it when the plugin goes, whether or not it is still installed
(act_ros.core.signal_stack). Dropped out of order, or on another thread, that left the
main thread with a freed alternate stack, and the next signal Python handled there (the
trainer's SIGINT test in the suite's own process) killed the process with SIGSEGV and no
faulthandler output. The backends now keep the caller's stack; each case below runs in a
fresh interpreter (a crash must not take the test runner with it) and ends with a real
signal handled in its main thread.
"""

from __future__ import annotations

import subprocess
import sys

import extras
import pytest

from act_ros.core.signal_stack import current_signal_stack, kept_signal_stack

CHILD = r'''
import faulthandler, gc, signal, sys, threading
from pathlib import Path
faulthandler.enable()  # as pytest does: its alternate stack is the one to keep
from act_ros.core.inference.backends import create_backend
from act_ros.core.inference.checkpoint import create_checkpoint, load_checkpoint
from act_ros.core.signal_stack import current_signal_stack

ckpt = load_checkpoint(create_checkpoint(Path(sys.argv[1]) / 'tiny', preset='tiny',
                                         image_size=(48, 64), seed=0))
before = current_signal_stack()
first = create_backend('openvino', ckpt)
second = create_backend('openvino', ckpt)
del first  # out of order: the first plugin goes while the second one lives
gc.collect()
del second
gc.collect()
held = [create_backend('openvino', ckpt)]
dropper = threading.Thread(target=lambda: (held.clear(), gc.collect()))  # on another thread
dropper.start()
dropper.join()
after = current_signal_stack()
print('stack kept' if after == before else f'stack changed: {before} -> {after}', flush=True)
got = []
signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
signal.raise_signal(signal.SIGINT)
print('SIGINT handled' if got else 'SIGINT lost', flush=True)
'''


def test_kept_signal_stack_puts_back_what_the_block_replaced():
    import ctypes

    from act_ros.core import signal_stack

    if current_signal_stack() is None:
        pytest.skip('sigaltstack is read on Linux only')
    before = current_signal_stack()
    buffer = ctypes.create_string_buffer(65536)
    with kept_signal_stack():
        other = signal_stack.StackT(ctypes.cast(buffer, ctypes.c_void_p), 0, len(buffer))
        assert signal_stack._LIBC.sigaltstack(ctypes.byref(other), None) == 0
        assert current_signal_stack()[:2] == (ctypes.addressof(buffer), len(buffer))
    assert current_signal_stack() == before


@extras.needs_openvino
def test_sigint_after_openvino_backends_dropped_out_of_order_is_handled(tmp_path):
    proc = subprocess.run([sys.executable, '-X', 'faulthandler', '-c', CHILD, str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'exit {proc.returncode} (-11: SIGSEGV)\n{out[-3000:]}'
    assert 'stack kept' in proc.stdout and 'SIGINT handled' in proc.stdout, out[-3000:]
