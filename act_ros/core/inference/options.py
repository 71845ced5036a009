"""Inference options and the backend table, without importing PyTorch or any backend.

Split from :mod:`act_ros.core.inference.predictor` and :mod:`act_ros.core.inference.backends` so that a
process that only schedules chunks (``act_node`` with ``execution='process'``, whose
model runs in a child process) can validate its settings without paying for the import
of torch, LeRobot or OpenVINO. Both modules re-export what is defined here.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

# int8: the OpenVINO backend only, from a model quantized ahead of time with NNCF
# (act-ros export --int8, act_ros.core.inference.quantized); never picked by precision auto.
PRECISIONS = ('fp32', 'bf16', 'fp16', 'int8')
COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')

BACKENDS = ('torch', 'openvino', 'onnxruntime')
# backend 'auto' (the node's default): resolved by resolve_backend() to one of BACKENDS.
BACKEND_AUTO = 'auto'
BACKEND_CHOICES = (BACKEND_AUTO, *BACKENDS)
# What each backend can run; whether the CPU/GPU at hand can is checked when it starts.
BACKEND_PRECISIONS = {'torch': ('fp32', 'bf16', 'fp16'),
                      'openvino': ('fp32', 'bf16', 'fp16', 'int8'),
                      'onnxruntime': ('fp32',)}
# Backend -> (Python module it needs, pip extra that installs it with the ONNX exporter).
BACKEND_PACKAGES = {'openvino': ('openvino', 'openvino'),
                    'onnxruntime': ('onnxruntime', 'onnxruntime')}
CPU_DEVICES = ('auto', 'cpu')


def check_backend_options(backend: str, *, precision: str, compile_model: bool,
                          device: str | None = None) -> None:
    """Reject backend settings that cannot work together (``ValueError``, one line)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}', expected one of {BACKENDS}")
    if precision == 'int8' and backend != 'openvino':
        raise ValueError(f"precision 'int8' runs on backend openvino only (a model quantized by "
                         f"act-ros export --int8), not on backend '{backend}'")
    if backend == 'torch':
        return
    if compile_model:
        raise ValueError(f"compile_model applies to the torch backend only; backend '{backend}' "
                         'compiles the ONNX export itself: set compile_model false')
    if precision not in BACKEND_PRECISIONS[backend]:
        raise ValueError(f"backend '{backend}' supports precision {BACKEND_PRECISIONS[backend]}, "
                         f"got '{precision}' (bf16 on a CPU: backend openvino or torch)")
    if device is not None and str(device).strip().lower() not in CPU_DEVICES:
        raise ValueError(f"backend '{backend}' runs on the CPU; device '{device}' needs the "
                         "torch backend (use device 'cpu' or 'auto')")


def accelerator_present() -> bool:
    """Whether this machine has a GPU the torch backend would pick with device ``auto``,
    judged without importing torch (the node's parent process does not load it): an NVIDIA
    driver (``/proc/driver/nvidia/version``) or an Apple-silicon Mac (MPS)."""
    if sys.platform == 'darwin':
        return platform.machine() == 'arm64'
    return Path('/proc/driver/nvidia/version').is_file()


def resolve_backend(requested: str, *, device: str = 'auto', precision: str = 'auto',
                    compile_model: bool = False, installed: list[str] | None = None,
                    accelerator: bool | None = None) -> tuple[str, str]:
    """``(backend, why)`` for ``requested``: a named backend as it is; ``auto`` picks
    openvino on a CPU when it is installed (on 2-core CPUs it ran the default ACT 1.5-2.1x
    faster than LeRobot's eager PyTorch in fp32, docs/performance.md, and in bf16 where
    the CPU has it), and torch whenever a
    GPU would run the model, torch.compile is asked for, fp16 is asked for, or openvino
    is not installed. ``installed`` and ``accelerator`` default to this machine's."""
    if requested != BACKEND_AUTO:
        if requested not in BACKENDS:
            raise ValueError(f"unknown backend '{requested}', expected one of {BACKEND_CHOICES}")
        return requested, 'set by name'
    dev = str(device).strip().lower()
    if precision == 'int8':
        return 'openvino', 'auto: precision int8 runs on openvino only'
    if dev not in CPU_DEVICES:
        return 'torch', f'auto: device {device} runs the torch backend'
    if compile_model:
        return 'torch', 'auto: compile_model applies to the torch backend'
    if precision == 'fp16':
        return 'torch', 'auto: precision fp16 (CUDA/MPS) runs the torch backend'
    if dev == 'auto' and (accelerator_present() if accelerator is None else accelerator):
        return 'torch', 'auto: a GPU is present (device auto runs torch on it)'
    if 'openvino' not in (installed_backends() if installed is None else installed):
        return 'torch', ('auto: openvino is not installed (pip extra act_ros[openvino]); '
                         'torch on the CPU')
    return 'openvino', 'auto: CPU inference, openvino installed'


def installed_backends() -> list[str]:
    """``torch`` and every optional backend whose packages (runtime, exporter) are installed."""
    def present(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    exporter = present('onnx') and present('onnxscript')
    return ['torch'] + [name for name, (module, _) in BACKEND_PACKAGES.items()
                        if exporter and present(module)]


@dataclass(frozen=True)
class PredictorOptions:
    """How a :class:`~act_ros.core.inference.predictor.ChunkPredictor` runs the model."""

    precision: str = 'fp32'
    compile_model: bool = False
    compile_mode: str = 'default'
    freeze: bool = True
    backend: str = 'torch'  # torch | openvino | onnxruntime (act_ros.core.inference.backends)
    threads: int | None = None  # CPU threads of a non-torch backend; None: its default

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision '{self.precision}', expected one of {PRECISIONS}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"unknown compile_mode '{self.compile_mode}', expected one of "
                             f'{COMPILE_MODES}')
        check_backend_options(self.backend, precision=self.precision,
                              compile_model=self.compile_model)
