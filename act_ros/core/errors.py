"""Exceptions raised by act_ros; each message says what was expected and what was found."""


class ActRosError(Exception):
    """Base class of act_ros errors."""


class CheckpointError(ActRosError):
    """A checkpoint directory is missing, incomplete, corrupt or does not fit the contract."""


class ContractMismatchError(CheckpointError):
    """The checkpoint's features do not match the I/O contract."""


class DeviceUnavailableError(ActRosError):
    """An explicitly requested device or backend is not available (never a silent fallback)."""


class ObservationError(ActRosError, ValueError):
    """An observation does not have the expected keys, shapes or values."""


class QuantizedModelError(ActRosError):
    """precision int8 was requested but no valid quantized model exists (missing, made from
    another export, or its files changed): the message says how to make it."""


class PrecisionRefusedError(ActRosError, ValueError):
    """A reduced precision set by name (int8, bf16) whose actions differ from fp32's by
    more than ``precision_tolerance`` on the check observations: refused at start-up."""
