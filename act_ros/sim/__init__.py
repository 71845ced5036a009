"""MuJoCo port-pick-align task: scene, environment, scripted expert and metrics.

Nothing here imports rclpy; ``act_ros.ros.sim_bridge`` puts the environment on ROS topics.
"""

from act_ros.sim.config import SimConfig
from act_ros.sim.env import EpisodeLayout, PortPickAlignEnv, SimObservation
from act_ros.sim.expert import ExpertConfig, ScriptedExpert, run_episode
from act_ros.sim.metrics import EpisodeResult, summarize_results

__all__ = ['EpisodeLayout', 'EpisodeResult', 'ExpertConfig', 'PortPickAlignEnv', 'ScriptedExpert',
           'SimConfig', 'SimObservation', 'run_episode', 'summarize_results']
