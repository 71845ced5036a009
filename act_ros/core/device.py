"""Device selection: ``auto`` picks MPS, then CUDA, then CPU; an explicit device must exist."""

from __future__ import annotations

import torch

from act_ros.core.errors import DeviceUnavailableError

DEVICE_CHOICES = ('auto', 'cpu', 'cuda', 'mps')


def _mps_available() -> bool:
    backend = getattr(torch.backends, 'mps', None)
    return bool(backend is not None and backend.is_available())


def select_device(requested: str = 'auto') -> torch.device:
    """Resolve ``requested`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``) to a device.

    An explicitly requested accelerator that is missing raises
    :class:`DeviceUnavailableError`; there is never a silent CPU fallback.
    """
    text = str(requested).strip().lower()
    if text == 'auto':
        if _mps_available():
            return torch.device('mps')
        if torch.cuda.is_available():
            return torch.device('cuda')
        return torch.device('cpu')
    kind, _, index = text.partition(':')
    if kind not in DEVICE_CHOICES or (index and not index.isdigit()):
        raise ValueError(f"unknown device '{requested}': expected one of auto, cpu, cuda, "
                         'cuda:N, mps')
    if kind == 'cpu':
        if index:
            raise ValueError(f"unknown device '{requested}': use 'cpu'")
        return torch.device('cpu')
    if kind == 'cuda':
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device '{requested}' was requested but CUDA is not available "
                f'(torch {torch.__version__}, built for CUDA {torch.version.cuda}); '
                "use device 'auto' or 'cpu'")
        if index and int(index) >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"device '{requested}' was requested but only "
                                         f'{torch.cuda.device_count()} CUDA device(s) exist')
        return torch.device(text)
    if not _mps_available():
        raise DeviceUnavailableError(f"device '{requested}' was requested but MPS is not "
                                     "available on this machine; use device 'auto' or 'cpu'")
    return torch.device('mps')
