"""Data-parallel training under ``accelerate launch`` (DDP): the process group and what the
trainer exchanges between its processes.

A run is data-parallel when ``WORLD_SIZE`` > 1, as ``accelerate launch`` (or torchrun)
sets it for every process it starts. :func:`from_environment` then imports Accelerate
(only then: a single-process run never imports it), whose ``PartialState`` joins the
process group (NCCL between GPUs, gloo between CPU processes) and gives this process its
device (``cuda:LOCAL_RANK`` on a GPU machine). The trainer wraps what it trains in
``DistributedDataParallel`` (:meth:`DataParallel.wrap`), which averages the gradients.
Control messages (the stop flag, the number of valid action steps in each batch, Python
objects such as closed-loop results and RNG states) travel on a gloo group on the CPU, so
they never wait for a GPU.

A single process gets :class:`LocalProcess`, where every exchange is the identity: the
trainer's code path and results are those of a run without any of this.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)
LAUNCH_ENV = ('RANK', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')
INSTALL_HINT = "pip install 'act_ros[distributed]' (or pip install 'accelerate>=1.14,<2')"


def world_size_from_env() -> int:
    """``WORLD_SIZE`` of this process (1 when unset or not a number, as before)."""
    raw = os.environ.get('WORLD_SIZE', '1').strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def check_launch_env() -> int:
    """The number of processes of this run; a clear error when ``WORLD_SIZE`` > 1 but the
    variables a launcher sets with it are missing (the process was not started by one)."""
    world = world_size_from_env()
    if world > 1:
        missing = [name for name in LAUNCH_ENV if not os.environ.get(name)]
        if missing:
            raise ValueError(
                f'WORLD_SIZE is {world}, so act-ros train runs as one of {world} processes, '
                f'but {", ".join(missing)} {"is" if len(missing) == 1 else "are"} not set: '
                'start the processes with accelerate launch (or torchrun), which sets them '
                'all, e.g. accelerate launch --multi_gpu --num_processes 2 -m '
                'act_ros.training.train ... (docs/training.md: "Several GPUs or '
                'machines"); for one process unset WORLD_SIZE')
    return world


class LocalProcess:
    """The only process of a run: every exchange returns its input."""

    active = False
    world_size = 1
    rank = 0
    local_rank = 0
    is_main = True
    backend: str | None = None
    device: torch.device | None = None  # None: the trainer selects --device itself

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module whose forward computes the loss (here: ``module`` itself)."""
        return module

    def step_control(self, valid_steps: int, stop: bool) -> tuple[int, bool]:
        """Sum of ``valid_steps`` and whether any process asked to stop."""
        return valid_steps, stop

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the processes, in place; returns it."""
        return tensor

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of ``tensor`` over the processes, in place; returns it."""
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        """``obj`` of every process, in rank order (picklable objects)."""
        return [obj]

    def share(self, count: int) -> tuple[int, int]:
        """This process's contiguous block ``[start, end)`` of ``count`` items (episodes):
        the first ``count % world_size`` processes take one more."""
        return 0, count

    def barrier(self) -> None:
        """Wait until every process gets here."""

    def close(self) -> None:
        """Leave the process group (nothing to leave here)."""

    def describe(self) -> dict[str, Any]:
        return {'processes': 1}


class DataParallel(LocalProcess):
    """One of ``world_size`` processes started by ``accelerate launch`` / torchrun."""

    active = True

    def __init__(self, state: Any) -> None:
        import torch.distributed as dist

        self._state = state  # accelerate.PartialState: keeps the process group alive
        self.world_size = int(state.num_processes)
        self.rank = int(state.process_index)
        self.local_rank = int(state.local_process_index)
        self.is_main = bool(state.is_main_process)
        self.device = torch.device(state.device)
        if self.device.type == 'cpu':
            self.device = torch.device('cpu')  # 'cpu:0' and 'cpu' are the same device
        self.backend = str(dist.get_backend())
        kind = state.distributed_type
        self.distributed_type = str(getattr(kind, 'value', kind))  # MULTI_GPU, MULTI_CPU...
        # Host-side messages on gloo, so that they never synchronize with a GPU stream.
        self._control = None if self.backend == 'gloo' else dist.new_group(backend='gloo')

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` in ``DistributedDataParallel``: gradients averaged over the processes
        during backward. Buffers are not broadcast at each forward: nothing in ACT's
        training changes them (FrozenBatchNorm2d statistics are set before the first step)."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == 'cuda' else None
        return DistributedDataParallel(module, device_ids=ids, output_device=ids[0] if ids
                                       else None, broadcast_buffers=False)

    def step_control(self, valid_steps: int, stop: bool) -> tuple[int, bool]:
        import torch.distributed as dist

        message = torch.tensor([valid_steps, int(bool(stop))], dtype=torch.int64)
        dist.all_reduce(message, group=self._control)
        return int(message[0]), bool(message[1])

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(tensor)
        return tensor

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.sum_(tensor).div_(self.world_size)

    def gather_objects(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._control)
        return out

    def share(self, count: int) -> tuple[int, int]:
        base, extra = divmod(count, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (self.rank < extra)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self._control)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> dict[str, Any]:
        return {'processes': self.world_size, 'backend': self.backend,
                'distributed_type': self.distributed_type}


def from_environment(device: str = 'auto') -> LocalProcess:
    """This process's place in the run: :class:`LocalProcess` unless started as one of
    several processes (``WORLD_SIZE`` > 1), then :class:`DataParallel` on Accelerate.

    ``device`` is ``--device``: under several processes ``auto`` and ``cuda`` give each
    process its own GPU (``cuda:LOCAL_RANK``, CPU when there is none for ``auto``), ``cpu``
    keeps every process on the CPU (gloo); a fixed ``cuda:N`` or ``mps`` is refused.
    """
    world = check_launch_env()
    if world == 1:
        return LocalProcess()
    text = str(device).strip().lower()
    if text not in ('auto', 'cpu', 'cuda'):
        raise ValueError(f"--device {device!r} under {world} processes: each process takes its "
                         'own device (cuda:LOCAL_RANK on a GPU machine, else the CPU); pass '
                         '--device auto, cuda or cpu')
    try:
        from accelerate import PartialState
    except ImportError as exc:
        raise ValueError(f'act-ros train as one of {world} processes needs Accelerate, which '
                         f'is not installed: {INSTALL_HINT}') from exc
    # Accelerate treats CPU processes as data-parallel only when told to use the CPU.
    cpu = text == 'cpu' or (text == 'auto' and not torch.cuda.is_available())
    state = PartialState(cpu=cpu)
    if int(state.num_processes) != world:
        raise ValueError(f'Accelerate set up {state.num_processes} process(es) '
                         f'({state.distributed_type}) but WORLD_SIZE is {world}; with --device '
                         f'{device} it found no device for data-parallel training (pass '
                         '--device cpu for CPU processes)')
    process = DataParallel(state)
    if text == 'cuda' and process.device.type != 'cuda':
        process.close()
        raise ValueError(f"--device cuda was requested, but Accelerate gave process "
                         f'{process.rank} the device {process.device} (no CUDA GPU visible to '
                         "it); use --device auto or cpu")
    for name, value in (('ACCELERATE_MIXED_PRECISION', 'no'), ('ACCELERATE_DYNAMO_BACKEND', 'no')):
        given = os.environ.get(name, value).lower()
        if given != value and process.is_main:
            logger.warning('%s=%s (accelerate config) is not used: the trainer sets autocast '
                           'with --precision and compilation with --compile', name, given)
    if process.is_main:
        logger.info('data-parallel: %d processes, backend %s, device of process 0 %s',
                    process.world_size, process.backend, process.device)
    return process
