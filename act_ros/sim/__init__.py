"""MuJoCo port-pick-align task: scene, environment, scripted expert and metrics.

Nothing here imports rclpy; ``act_ros.ros.sim_bridge.bridge`` puts the environment on ROS topics.
Importing this package picks a headless OpenGL backend for MuJoCo's renderer before
MuJoCo is loaded, so every entry point that renders (collect, train, evaluate,
sim_bridge) works in a plain shell without a display: ``MUJOCO_GL=egl`` (and
``PYOPENGL_PLATFORM=egl``) when neither is set and there is no ``DISPLAY`` or
``WAYLAND_DISPLAY``. A value the user set is kept.
"""

import os as _os


def select_headless_gl() -> str | None:
    """Set ``MUJOCO_GL=egl`` where there is no display and the user chose nothing; returns
    the backend in effect (``None``: MuJoCo's default, a display is present)."""
    if 'MUJOCO_GL' not in _os.environ and not (_os.environ.get('DISPLAY')
                                               or _os.environ.get('WAYLAND_DISPLAY')):
        _os.environ['MUJOCO_GL'] = 'egl'
    if _os.environ.get('MUJOCO_GL') == 'egl':
        _os.environ.setdefault('PYOPENGL_PLATFORM', 'egl')
    return _os.environ.get('MUJOCO_GL')


select_headless_gl()

from act_ros.sim.config import SimConfig  # noqa: E402
from act_ros.sim.env import EpisodeLayout, PortPickAlignEnv, SimObservation  # noqa: E402
from act_ros.sim.expert import ExpertConfig, ScriptedExpert, run_episode  # noqa: E402
from act_ros.sim.metrics import EpisodeResult, summarize_results  # noqa: E402

__all__ = ['EpisodeLayout', 'EpisodeResult', 'ExpertConfig', 'PortPickAlignEnv', 'ScriptedExpert',
           'SimConfig', 'SimObservation', 'run_episode', 'select_headless_gl',
           'summarize_results']
