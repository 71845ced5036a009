"""Mid-episode perturbations: can a controller recover from a push, a drop, a knock?

Three kinds, each fired once per episode at a random moment of a given phase of the
scripted expert (which runs beside the controller under test and says what the task is
doing, also when it does not act):

The moment is ``delay_ticks`` (0-15) into the phase, or the first tick after it when the
phase is shorter.

- ``push_box``: while the arm approaches or descends to the box, the box is shifted
  2-4 cm across the table (at rest, never into the arm).
- ``open_gripper``: while the box is carried, the gripper is forced open for a few ticks
  whatever it is commanded: the box falls.
- ``displace_arm``: while approaching or carrying, the arm is pushed off its path: its
  joints are driven to offsets of 0.15-0.3 rad for a few ticks.

``act_ros.sim.expert_eval --perturb`` measures the scripted expert's recovery with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from act_ros.sim.env import PortPickAlignEnv, SimObservation
from act_ros.sim.metrics import EpisodeResult

PERTURBATIONS = ('push_box', 'open_gripper', 'displace_arm')
TRIGGER_PHASES = {
    'push_box': ('approach', 'descend'),
    'open_gripper': ('carry',),
    'displace_arm': ('approach', 'carry'),
}
FORCED_TICKS = {'push_box': 1, 'open_gripper': 10, 'displace_arm': 8}


@dataclass(frozen=True)
class Perturbation:
    """One perturbation: what, when (``delay_ticks`` into ``phase``) and how much."""

    kind: str
    phase: str
    delay_ticks: int
    push_m: float = 0.0
    direction_rad: float = 0.0
    joint_offsets_rad: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in PERTURBATIONS:
            raise ValueError(f"unknown perturbation '{self.kind}', expected one of {PERTURBATIONS}")
        if self.phase not in TRIGGER_PHASES[self.kind]:
            raise ValueError(f"'{self.kind}' fires in {TRIGGER_PHASES[self.kind]}, got "
                             f"'{self.phase}'")
        if self.delay_ticks < 0:
            raise ValueError(f'delay_ticks must be >= 0, got {self.delay_ticks}')

    def to_dict(self) -> dict:
        return asdict(self)


def sample_perturbation(kind: str, rng: np.random.Generator) -> Perturbation:
    """A random perturbation of ``kind`` (magnitudes as in the module docstring)."""
    phases = TRIGGER_PHASES[kind]
    phase = phases[int(rng.integers(len(phases)))]
    delay = int(rng.integers(0, 16))
    if kind == 'push_box':
        return Perturbation(kind, phase, delay, push_m=float(rng.uniform(0.02, 0.04)),
                            direction_rad=float(rng.uniform(-math.pi, math.pi)))
    if kind == 'open_gripper':
        return Perturbation(kind, phase, delay)
    offsets = rng.uniform(0.15, 0.3, 5) * rng.choice([-1.0, 1.0], 5)
    offsets[rng.permutation(5)[:2]] = 0.0   # three of the five arm joints pushed
    return Perturbation(kind, phase, delay, joint_offsets_rad=tuple(float(v) for v in offsets))


@dataclass(frozen=True)
class PerturbedResult:
    """An episode's result with what was done to it (``fired_tick`` None: never fired)."""

    result: EpisodeResult
    perturbation: Perturbation
    fired_tick: int | None
    push_m: float = 0.0


class PerturbationDriver:
    """Applies one :class:`Perturbation` during an episode.

    Call :meth:`apply` each tick with the phase the expert reports and the action about to
    be sent; it returns the action to send instead (or the same one) and moves the box
    when the push fires.
    """

    def __init__(self, env: PortPickAlignEnv, perturbation: Perturbation,
                 rng: np.random.Generator) -> None:
        self.env = env
        self.perturbation = perturbation
        self.rng = rng
        self.ticks_in_phase = 0
        self.fired_tick: int | None = None
        self.push_m = 0.0
        self._forced_left = 0
        self._forced_arm: np.ndarray | None = None

    def apply(self, phase: str, obs: SimObservation, action: np.ndarray) -> np.ndarray:
        p = self.perturbation
        env = self.env
        if self.fired_tick is None:
            if phase == p.phase and self._ready(obs):
                self.ticks_in_phase += 1
                if self.ticks_in_phase > p.delay_ticks:
                    self._fire(obs)
            elif self.ticks_in_phase > 0 and self._ready(obs):
                self._fire(obs)   # the phase ended before the delay: fire on leaving it
        if self._forced_left > 0:
            self._forced_left -= 1
            action = np.array(action, dtype=np.float64)
            if p.kind == 'open_gripper':
                action[env.gripper_index] = 1.0
            elif p.kind == 'displace_arm' and self._forced_arm is not None:
                action[env.arm_index] = self._forced_arm
        return action

    def _ready(self, obs: SimObservation) -> bool:
        if self.perturbation.kind == 'open_gripper':   # the box is really in the air
            return obs.box_pose[2] - self.env.config.box_size_m / 2 > 0.02
        return True

    def _fire(self, obs: SimObservation) -> None:
        p = self.perturbation
        env = self.env
        self.fired_tick = env.step_index
        if p.kind == 'push_box':
            self.push_m = self._push(obs, p)
            return
        self._forced_left = FORCED_TICKS[p.kind]
        if p.kind == 'displace_arm':
            q = np.asarray(obs.joint_positions, dtype=np.float64)[env.arm_index]
            lower = env.contract.lower[env.arm_index]
            upper = env.contract.upper[env.arm_index]
            self._forced_arm = np.clip(q + np.asarray(p.joint_offsets_rad), lower, upper)

    def _push(self, obs: SimObservation, p: Perturbation) -> float:
        """Shift the box by ``push_m`` along the drawn direction, or the nearest direction
        that keeps it within reach and off the arm and the pad."""
        env, cfg = self.env, self.env.config
        box, pad = obs.box_pose, obs.pad_pose
        for turn in np.linspace(0.0, 2 * math.pi, 24, endpoint=False):
            angle = p.direction_rad + turn
            offset = p.push_m * np.array([math.cos(angle), math.sin(angle)])
            new = box[:2] + offset
            reach = float(np.hypot(*new))
            if not cfg.reach_min_m <= reach <= cfg.reach_max_m:
                continue
            if np.linalg.norm(new - pad[:2]) < (cfg.box_size_m + cfg.pad_size_m) / 2 * math.sqrt(2):
                continue
            if env.move_box(offset):
                return p.push_m
        return 0.0


def run_perturbed_episode(env: PortPickAlignEnv, expert, seed: int, perturbation: Perturbation,
                          act: Callable[[SimObservation], np.ndarray] | None = None
                          ) -> PerturbedResult:
    """One episode of ``act`` (default: the expert itself) with ``perturbation`` applied.

    The expert runs every tick to report the phase (and to act, when ``act`` is None).
    """
    rng = np.random.default_rng([seed, 0x9E27])
    obs = env.reset(seed=seed)
    expert.reset(obs)
    driver = PerturbationDriver(env, perturbation, rng)
    while not env.done:
        action = expert.act(obs)
        if act is not None:
            action = act(obs)
        obs = env.step(driver.apply(expert.phase, obs, action))
    return PerturbedResult(env.evaluate(), perturbation, driver.fired_tick, driver.push_m)
