"""Episode outcome of the port-pick-align task and the aggregate metrics (docs/architecture.md section 7)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


def wrap_angle(angle_rad: float) -> float:
    """Angle wrapped to ``[-pi, pi)``."""
    return (float(angle_rad) + math.pi) % (2.0 * math.pi) - math.pi


def symmetric_yaw_error_deg(box_yaw_rad: float, pad_yaw_rad: float,
                            symmetry_rad: float = math.pi / 2) -> float:
    """Absolute yaw difference in degrees, modulo the box's rotational symmetry (90 deg).

    The result lies in ``[0, 45]`` for a cube: a box turned by 90 degrees looks the same.
    """
    diff = (box_yaw_rad - pad_yaw_rad + symmetry_rad / 2) % symmetry_rad - symmetry_rad / 2
    return abs(math.degrees(diff))


# Where an unsuccessful episode went wrong, in task order (EpisodeResult.failure_phase).
FAILURE_PHASES = {
    'grasp': 'the box was never lifted (approach or grasp failed)',
    'release': 'the box was still held at the end (never let go; see the gate counts)',
    'carry': 'the box was lifted but ended off the pad (dropped or placed beside it)',
    'position': 'the box rests on the pad, but its centre is beyond the position tolerance',
    'yaw': 'the box rests on the pad within the position tolerance, but turned too far',
    'settle': 'placed and aligned, but still moving or touched by a finger at the end',
}
LIFT_HEIGHT_M = 0.02  # box bottom this far above the table at some point: it was lifted
# A lifted box that tilted this far from lying on a face turned in the fingers: a tumble
# (an off-centre grasp held too weakly lets the cube swing about the finger axis).
TUMBLE_TILT_DEG = 20.0


def failure_phase(*, success: bool, max_box_height_m: float, released: bool, box_on_pad: bool,
                  position_ok: bool, yaw_ok: bool) -> str | None:
    """The first task stage an episode failed at (a key of ``FAILURE_PHASES``), or None."""
    if success:
        return None
    if max_box_height_m < LIFT_HEIGHT_M:
        return 'grasp'
    if not released and not box_on_pad:
        return 'release'
    if not box_on_pad:
        return 'carry'
    if not position_ok:
        return 'position'
    if not yaw_ok:
        return 'yaw'
    return 'settle'


@dataclass(frozen=True)
class EpisodeResult:
    """How one episode ended; ``success`` is the "aligned" criterion of the task.

    ``success`` needs all of: ``box_on_pad`` (centre over the pad, bottom on its top face,
    resting flat on any of its faces: a cube is the same cube on each), ``box_still``
    (speed below the threshold), ``released`` (gripper open and no finger touching the
    box), ``position_error_m`` (box centre to pad centre, XY) and ``yaw_error_deg``
    (modulo 90 degrees) within their tolerances.
    """

    success: bool
    position_error_m: float
    yaw_error_deg: float
    released: bool
    box_on_pad: bool
    box_still: bool
    max_box_height_m: float
    steps: int
    seed: int | None = None
    failure_phase: str | None = None  # a key of FAILURE_PHASES; None for a success
    # Largest tilt from any face-down orientation (degrees) while the box was lifted
    # (bottom above LIFT_HEIGHT_M): above TUMBLE_TILT_DEG it turned in the fingers.
    max_lifted_tilt_deg: float = 0.0
    # Measured joints at the end (contract order, gripper normalized): where the policy's
    # commands took the arm, which an evaluation over ROS 2 must reproduce in process.
    final_joints: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_results(results: Sequence[EpisodeResult]) -> dict[str, float | int]:
    """Aggregate metrics over episodes: ``align_rate`` (fraction successful),
    ``mean_position_error`` (m), ``mean_yaw_error`` (deg), ``count``, ``failures``:
    how many episodes failed at each stage of ``FAILURE_PHASES`` (in task order), and
    ``tumbles``: episodes in which the lifted box tilted past ``TUMBLE_TILT_DEG``.

    The means run over all episodes, failed ones included.
    """
    results = list(results)
    if not results:
        raise ValueError('summarize_results needs at least one EpisodeResult, got none')
    return {
        'align_rate': float(np.mean([r.success for r in results])),
        'mean_position_error': float(np.mean([r.position_error_m for r in results])),
        'mean_yaw_error': float(np.mean([r.yaw_error_deg for r in results])),
        'count': len(results),
        'failures': {phase: sum(r.failure_phase == phase for r in results)
                     for phase in FAILURE_PHASES},
        'tumbles': sum(r.max_lifted_tilt_deg > TUMBLE_TILT_DEG for r in results),
    }
