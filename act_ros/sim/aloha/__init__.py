"""The ACT paper's bimanual simulation (package ``gym-aloha``) as a task of this package.

Two ViperX 6-DoF arms with grippers (14 joints), a 480x640 top camera, 50 Hz, MuJoCo
through dm_control. :mod:`act_ros.sim.aloha.env` runs gym-aloha's own task classes and
scene files (its reward and success unchanged) and renders only the cameras asked for;
:mod:`act_ros.sim.aloha.expert` is the scripted expert made the paper's way (plan in the
end-effector variant of the task, replay the joint trajectory in the joint-space task).

gym-aloha 0.1.5 declares ``mujoco<3.9`` but runs on the MuJoCo of this package with
dm-control 1.0.50 (the first dm-control for MuJoCo 3.17); ``make setup`` installs it
without its pins (``pip install --no-deps gym-aloha``), see docs/aloha.md.
"""

from act_ros.sim import select_headless_gl

select_headless_gl()

from act_ros.sim.aloha.env import (  # noqa: E402
    ALOHA_TASKS,
    AlohaEnv,
    AlohaEpisodeResult,
    AlohaObservation,
    AlohaTaskSpec,
    summarize_aloha_results,
)

__all__ = ['ALOHA_TASKS', 'AlohaEnv', 'AlohaEpisodeResult', 'AlohaObservation',
           'AlohaTaskSpec', 'summarize_aloha_results']
