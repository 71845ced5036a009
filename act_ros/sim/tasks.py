"""The simulated tasks this package collects demonstrations in, trains on and evaluates.

- ``port_pick_align``: the package's own MuJoCo task (one 6-joint arm, top and wrist
  cameras, 30 Hz; :mod:`act_ros.sim.env`); success is ``align_rate``.
- ``aloha_transfer_cube`` / ``aloha_insertion``: the ACT paper's bimanual tasks from the
  package gym-aloha (two 7-joint arms, a top camera, 50 Hz; :mod:`act_ros.sim.aloha`);
  success is gym-aloha's own (reward 4).

A checkpoint records the task it was trained for (``training_info.json``, key ``task``), so
``act-ros evaluate`` runs the right environment without being told. Every evaluation
writes ``success_rate`` under ``modes.<mode>`` whatever the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TASK = 'port_pick_align'


@dataclass(frozen=True)
class SimTask:
    """One simulated task: its robot's contract, control rate and native camera size."""

    name: str
    contract: str  # path under the package's config/
    node_params: str  # act_node parameters of the task's robot, under config/ (limits, gate)
    fps: int
    image_size: tuple[int, int]  # what the simulation renders natively (height, width)
    # For gym-aloha tasks: gym-aloha's task name (act_ros.sim.aloha.env.ALOHA_TASKS).
    aloha_task: str | None = None
    description: str = ''

    @property
    def is_aloha(self) -> bool:
        return self.aloha_task is not None

    def contract_path(self) -> Path:
        """The task robot's contract file in the package."""
        from act_ros.core.paths import config_path

        return config_path(self.contract)

    def node_params_path(self) -> Path:
        """The task robot's act_node parameter file in the package."""
        from act_ros.core.paths import config_path

        return config_path(self.node_params)


def _aloha_task(aloha_task: str, description: str) -> SimTask:
    """A gym-aloha task: both run the bimanual robot of config/robots/aloha at 50 Hz with
    gym-aloha's 480x640 camera."""
    return SimTask(f'aloha_{aloha_task}', 'robots/aloha/contract.yaml', 'robots/aloha/act.yaml',
                   50, (480, 640), aloha_task=aloha_task, description=description)


SIM_TASKS: dict[str, SimTask] = {
    'port_pick_align': SimTask(
        'port_pick_align', 'contract.yaml', 'act.yaml', 30, (480, 640),
        description="the package's 6-joint arm picks a 3 cm box and places it aligned on a pad"),
    'aloha_transfer_cube': _aloha_task(
        'transfer_cube', 'gym-aloha AlohaTransferCube-v0: the right arm picks the cube and '
        'hands it to the left arm'),
    'aloha_insertion': _aloha_task(
        'insertion', 'gym-aloha AlohaInsertion-v0: each arm picks a part, the peg goes into '
        'the socket'),
}


def sim_task(name: str) -> SimTask:
    """The task called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return SIM_TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task '{name}', expected one of {sorted(SIM_TASKS)}") from None


def checkpoint_task(checkpoint_dir: str | Path) -> SimTask:
    """The task a checkpoint was trained for (its ``training_info.json``; checkpoints made
    before tasks were recorded are the package's own task)."""
    info = Path(checkpoint_dir) / 'training_info.json'
    name = DEFAULT_TASK
    if info.is_file():
        name = json.loads(info.read_text()).get('task') or DEFAULT_TASK
    return sim_task(name)
