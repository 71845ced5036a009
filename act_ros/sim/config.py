"""Settings of the port-pick-align simulation (``config/sim.yaml``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from act_ros.core.paths import config_path, load_yaml_mapping

Range = tuple[float, float]


def _check_range(name: str, value: Range) -> None:
    if len(value) != 2 or not all(math.isfinite(v) for v in value) or value[0] > value[1]:
        raise ValueError(f'{name} must be [low, high] with low <= high, got {list(value)}')


# The simulated gripper's effort (the mean force of its finger actuators, N, as
# sim_bridge publishes it in JointState.effort) below which fingers commanded closed hold
# nothing: the release gate's evidence (release_gate.empty_effort) in the simulation's
# node, evaluator and expert. Measured: closed on the box each finger pushes 2.9 N; closed
# on nothing, under 0.5 N on the first tick and 0.00 N from the third on.
GRIPPER_EMPTY_EFFORT_N = 1.0

@dataclass(frozen=True)
class SimConfig:
    """Simulation settings; every field is documented in ``config/sim.yaml``.

    ``urdf_path`` and ``contract_path`` default to the package's robot model and I/O
    contract.
    """

    fps: int = 30
    episode_steps: int = 300
    physics_timestep_s: float = 0.002
    render: bool = True
    camera_height: int = 480
    camera_width: int = 640
    render_msaa_samples: int = 0
    home_joint_positions: tuple[float, ...] = (0.0, 0.13, -0.093, 1.534, 0.0, 1.0)
    home_noise_rad: float = 0.03
    box_size_m: float = 0.03
    box_mass_kg: float = 0.03
    box_friction: float = 0.8
    pad_size_m: float = 0.07
    pad_thickness_m: float = 0.004
    box_x_range_m: Range = (0.13, 0.225)
    box_y_range_m: Range = (-0.16, 0.16)
    box_yaw_range_deg: Range = (-180.0, 180.0)
    pad_x_range_m: Range = (0.13, 0.225)
    pad_y_range_m: Range = (-0.16, 0.16)
    pad_yaw_range_deg: Range = (-180.0, 180.0)
    reach_min_m: float = 0.13
    reach_max_m: float = 0.225
    min_separation_m: float = 0.09
    success_position_tol_m: float = 0.015
    success_yaw_tol_deg: float = 10.0
    box_still_speed_m_s: float = 0.02
    released_opening: float = 0.5
    urdf_path: str | None = None
    contract_path: str | None = None

    def __post_init__(self) -> None:
        for name in ('home_joint_positions', 'box_x_range_m', 'box_y_range_m',
                     'box_yaw_range_deg', 'pad_x_range_m', 'pad_y_range_m',
                     'pad_yaw_range_deg'):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        if self.fps < 1 or self.episode_steps < 1:
            raise ValueError(f'fps and episode_steps must be >= 1, got {self.fps} and '
                             f'{self.episode_steps}')
        if not 0.0 < self.physics_timestep_s <= 1.0 / self.fps:
            raise ValueError(f'physics_timestep_s must be in (0, 1/fps = {1.0 / self.fps:.4f}], '
                             f'got {self.physics_timestep_s}')
        if self.camera_height < 16 or self.camera_width < 16:
            raise ValueError(f'camera size must be at least 16x16, got '
                             f'{self.camera_height}x{self.camera_width}')
        if self.render_msaa_samples < 0:
            raise ValueError(f'render_msaa_samples must be >= 0, got {self.render_msaa_samples}')
        if len(self.home_joint_positions) != 6:
            raise ValueError('home_joint_positions must have 6 values (contract order), got '
                             f'{len(self.home_joint_positions)}')
        for name in ('box_size_m', 'box_mass_kg', 'box_friction', 'pad_size_m',
                     'pad_thickness_m', 'reach_max_m', 'min_separation_m',
                     'success_position_tol_m', 'success_yaw_tol_deg', 'box_still_speed_m_s'):
            if not getattr(self, name) > 0.0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if not 0.0 <= self.home_noise_rad <= 0.2:
            raise ValueError(f'home_noise_rad must be in [0, 0.2], got {self.home_noise_rad}')
        if not 0.0 < self.released_opening <= 1.0:
            raise ValueError(f'released_opening must be in (0, 1], got {self.released_opening}')
        for name in ('box_x_range_m', 'box_y_range_m', 'box_yaw_range_deg', 'pad_x_range_m',
                     'pad_y_range_m', 'pad_yaw_range_deg'):
            _check_range(name, getattr(self, name))
        if not 0.0 <= self.reach_min_m < self.reach_max_m:
            raise ValueError(f'need 0 <= reach_min_m < reach_max_m, got {self.reach_min_m} and '
                             f'{self.reach_max_m}')
        if self.min_separation_m < (self.box_size_m + self.pad_size_m) / 2 * math.sqrt(2):
            raise ValueError(f'min_separation_m {self.min_separation_m} lets box and pad overlap: '
                             'expected at least (box_size_m + pad_size_m) / 2 * sqrt(2) = '
                             f'{(self.box_size_m + self.pad_size_m) / 2 * math.sqrt(2):.3f}')

    @property
    def control_period_s(self) -> float:
        return 1.0 / self.fps

    @property
    def substeps(self) -> int:
        """Physics steps per control tick (the timestep is shrunk to divide the period)."""
        return max(1, math.ceil(self.control_period_s / self.physics_timestep_s - 1e-9))

    @property
    def timestep_s(self) -> float:
        """The physics timestep actually used: ``control_period_s / substeps``."""
        return self.control_period_s / self.substeps

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = '<memory>') -> SimConfig:
        """Build from a mapping (the ``sim:`` section or the section's content)."""
        body = data.get('sim', data) if isinstance(data, dict) else data
        if not isinstance(body, dict):
            raise ValueError(f'{source}: expected a mapping under "sim", got {type(body).__name__}')
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f'{source}: unknown sim settings {unknown} (known: {sorted(known)})')
        try:
            return cls(**body)
        except (TypeError, ValueError) as exc:
            raise ValueError(f'{source}: {exc}') from exc

    @classmethod
    def from_yaml(cls, path: str | Path | None = None, **overrides: Any) -> SimConfig:
        """Load ``config/sim.yaml`` (or ``path``); keyword overrides replace file values."""
        path = Path(path) if path is not None else config_path('sim.yaml')
        data = load_yaml_mapping(path, 'sim config')
        body = dict(data.get('sim', data))
        body.update(overrides)
        return cls.from_dict(body, source=str(path))
