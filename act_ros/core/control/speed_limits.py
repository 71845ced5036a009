"""Joint speed limits in physical units, and the largest step per control tick they allow.

The safety chain (:mod:`act_ros.core.control.safety`) limits how far a command may move each joint
in one tick. That step is not a setting: it follows from a speed and the control period,
``step = speed * period``, so a change of control rate never changes the speed the arm is
asked for. Speeds are per second: radians per second for an arm joint, a gripper's own
units per second (normalized grippers: their whole travel is 1).

Where each joint's speed comes from, first match wins:

1. ``max_joint_velocity`` (one value for every joint, or one per joint), when set;
2. the deprecated per-tick ``max_joint_step``, converted with the control period
   (``speed = step / period``), with a warning naming ``max_joint_velocity``; setting
   both is refused;
3. the robot model: the URDF's ``<limit velocity>`` of the joint of that name. A gripper's
   is scaled from the URDF joint's travel to the contract's range (the package's gripper:
   0.025 m of finger travel is the normalized range 0 to 1);
4. a conservative default: :data:`DEFAULT_ARM_SPEED` rad/s for an arm joint, its whole
   range in :data:`DEFAULT_GRIPPER_TRAVEL_S` seconds for a gripper.

A configured speed above the URDF's is refused (one line naming the joints), as
ros2_control treats the URDF's limits as the hardware's. Nothing here imports rclpy.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Arm joint speed (rad/s) where neither a parameter nor the URDF gives one.
DEFAULT_ARM_SPEED = 1.0
#: A gripper without a given speed crosses its whole range in this many seconds.
DEFAULT_GRIPPER_TRAVEL_S = 1.0
VELOCITY_PARAM = 'max_joint_velocity'
STEP_PARAM = 'max_joint_step'


@dataclass(frozen=True)
class UrdfJointLimit:
    """A URDF joint's ``<limit>``: velocity (its units per second) and position range."""

    velocity: float
    lower: float
    upper: float


def urdf_velocity_limits(path: str | Path) -> dict[str, UrdfJointLimit]:
    """Joint name -> its ``<limit>`` for every joint of the URDF at ``path`` that gives a
    positive ``velocity`` (mimic joints follow another joint and are left out)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'robot model (URDF) not found: {path}')
    try:
        root = ET.fromstring(path.read_text())
    except ET.ParseError as exc:
        raise ValueError(f'{path}: not a readable URDF ({exc})') from None
    out = {}
    for joint in root.iter('joint'):
        limit = joint.find('limit')
        if limit is None or joint.find('mimic') is not None or not joint.get('name'):
            continue
        try:
            velocity = float(limit.get('velocity', 'nan'))
            lower, upper = float(limit.get('lower', '0')), float(limit.get('upper', '0'))
        except ValueError:
            raise ValueError(f"{path}: joint '{joint.get('name')}' has a <limit> that is not "
                             f'numbers ({dict(limit.attrib)})') from None
        if math.isfinite(velocity) and velocity > 0:
            out[joint.get('name')] = UrdfJointLimit(velocity, lower, upper)
    return out


@dataclass(frozen=True)
class SpeedLimits:
    """Speed limit of every joint (contract order, per second) and where it came from.

    ``sources``: per joint, ``'max_joint_velocity'``, ``'max_joint_step'``, ``'urdf'`` or
    ``'default'``; ``urdf``: the URDF's limit in the contract's units (``None`` where the
    URDF has none); ``urdf_path``: the URDF, where it gave any joint a limit;
    ``deprecation``: the warning to show when the per-tick
    ``max_joint_step`` was used (empty otherwise).
    """

    joint_names: tuple[str, ...]
    speed: np.ndarray
    sources: tuple[str, ...]
    urdf: tuple[float | None, ...]
    urdf_path: str = ''
    deprecation: str = ''

    def per_tick(self, period_s: float) -> np.ndarray:
        """The largest step per tick of ``period_s`` seconds: ``speed * period_s``."""
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f'control period must be positive, got {period_s}')
        return self.speed * float(period_s)

    def line(self, period_s: float) -> str:
        """One line for the log: each joint's speed, where it came from, its step per tick
        (joints alike are listed together)."""
        groups: dict[str, list[str]] = {}
        for name, speed, source, urdf, step in zip(self.joint_names, self.speed, self.sources,
                                                   self.urdf, self.per_tick(period_s)):
            where = {'urdf': 'URDF', 'default': 'default'}.get(source, source)
            if urdf is not None and source != 'urdf':
                where += f', URDF {urdf:.4g}'
            groups.setdefault(f'{speed:.4g} ({where}; {step:.4g} per tick)', []).append(name)
        model = f'; URDF {self.urdf_path}' if self.urdf_path else ''
        return (f'speed limits per second at {1.0 / period_s:g} Hz: '
                + ', '.join(f'{" ".join(names)} {what}' for what, names in groups.items())
                + model)


    def as_values(self, period_s: float) -> dict[str, Any]:
        """Key/values for /diagnostics: per joint its speed per second, where it came from
        and the step per tick it allows at ``period_s``."""
        values: dict[str, Any] = {}
        for name, speed, source, step in zip(self.joint_names, self.speed, self.sources,
                                             self.per_tick(period_s)):
            values[f'speed_limit.{name}'] = float(speed)
            values[f'speed_limit.{name}.source'] = source
            values[f'speed_limit.{name}.per_tick'] = float(step)
        return values


def resolve_speed_limits(joint_names: Sequence[str], lower: Sequence[float],
                         upper: Sequence[float], *, grippers: Sequence[int] = (),
                         velocity: Sequence[float] | None = None,
                         step_per_tick: Sequence[float] | None = None, period_s: float,
                         urdf_path: str | Path | None = None) -> SpeedLimits:
    """Each joint's speed limit (see the module docstring); ``ValueError`` with one line for
    a bad or refused configuration.

    ``lower``/``upper``: the contract's position range per joint (the units of a gripper);
    ``grippers``: indices of the gripper joints; ``velocity``/``step_per_tick``: the values
    of ``max_joint_velocity`` and ``max_joint_step`` (``None`` or empty: not set);
    ``period_s``: the control period; ``urdf_path``: the robot model (``None``: none).
    """
    names = tuple(joint_names)
    n = len(names)
    lower = np.asarray(lower, dtype=np.float64).reshape(-1)
    upper = np.asarray(upper, dtype=np.float64).reshape(-1)
    if lower.size != n or upper.size != n:
        raise ValueError(f'expected {n} position limits, got {lower.size} and {upper.size}')
    gripper_set = {int(i) for i in grippers}
    if not (math.isfinite(period_s) and period_s > 0):
        raise ValueError(f'control period must be positive, got {period_s}')
    velocity = tuple(velocity or ())
    step_per_tick = tuple(step_per_tick or ())
    if velocity and step_per_tick:
        raise ValueError(f'{STEP_PARAM} is deprecated and replaced by {VELOCITY_PARAM}: set '
                         f'only {VELOCITY_PARAM} (per second), not both (got {VELOCITY_PARAM} '
                         f'{list(velocity)} and {STEP_PARAM} {list(step_per_tick)})')

    urdf_limits = urdf_velocity_limits(urdf_path) if urdf_path is not None else {}
    urdf: list[float | None] = []
    for i, name in enumerate(names):
        limit = urdf_limits.get(name)
        if limit is None:
            urdf.append(None)
        elif i in gripper_set and limit.upper > limit.lower:
            # The URDF's travel is the contract's range: scale the speed with it.
            urdf.append(limit.velocity * (upper[i] - lower[i]) / (limit.upper - limit.lower))
        else:
            urdf.append(limit.velocity)

    deprecation = ''
    if velocity or step_per_tick:
        param = VELOCITY_PARAM if velocity else STEP_PARAM
        given = velocity or step_per_tick
        unit = '' if velocity else ' per tick'
        if len(given) not in (1, n) or not all(math.isfinite(x) and x > 0 for x in given):
            raise ValueError(f'{param}: expected 1 or {n} positive values{unit} (contract '
                             f'order {list(names)}), got {list(given)}')
        values = np.broadcast_to(np.asarray(given, dtype=np.float64), (n,)).copy()
        speed = values if velocity else values / period_s
        sources = (param,) * n
        if step_per_tick:
            deprecation = (f'{STEP_PARAM} is deprecated (a step per tick changes the allowed '
                           f'speed with control_rate_hz): use {VELOCITY_PARAM}: '
                           f'{_yaml_list(speed)} (per second; the same speeds at '
                           f'{1.0 / period_s:g} Hz)')
        over = [f'{names[i]} {speed[i]:.4g} > {urdf[i]:.4g}' for i in range(n)
                if urdf[i] is not None and speed[i] > urdf[i] * (1 + 1e-9)]
        if over:
            given_as = (f'{param}' if velocity else
                        f'{param} {_yaml_list(values)} per tick at {1.0 / period_s:g} Hz')
            raise ValueError(f"{given_as} is above the robot model's <limit velocity> "
                             f'({urdf_path}), per second: ' + ', '.join(over)
                             + '; set at most the URDF\'s speeds')
    else:
        speed = np.empty(n)
        sources_list = []
        for i in range(n):
            if urdf[i] is not None:
                speed[i], source = urdf[i], 'urdf'
            elif i in gripper_set:
                speed[i], source = (upper[i] - lower[i]) / DEFAULT_GRIPPER_TRAVEL_S, 'default'
            else:
                speed[i], source = DEFAULT_ARM_SPEED, 'default'
            sources_list.append(source)
        sources = tuple(sources_list)
    return SpeedLimits(joint_names=names, speed=speed, sources=sources, urdf=tuple(urdf),
                       urdf_path=str(urdf_path) if any(u is not None for u in urdf) else '',
                       deprecation=deprecation)


def _yaml_list(values: np.ndarray) -> str:
    values = np.asarray(values, dtype=np.float64)
    if np.allclose(values, values[0]):
        values = values[:1]
    return '[' + ', '.join(f'{v:.6g}' for v in values) + ']'
