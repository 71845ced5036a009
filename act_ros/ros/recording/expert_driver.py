"""``expert_driver``: the scripted expert driving ``sim_bridge`` through its command topic.

A stand-in for a teleoperator in simulation, to try the recorder (``record_node``) and
the bag importer on demonstrations that arrive over ROS 2 exactly as a real arm's would.
It reads what the bridge publishes (joint states, end-effector, box and pad poses; with
equal header stamps per simulated step), runs :class:`~act_ros.sim.ScriptedExpert` on
them and publishes a ``JointTrajectory`` per observation whose header stamp is the
observation's (so a recorder in lock-step can pair them exactly).

``~/reset`` (``std_srvs/Trigger``) starts a new episode at the next observation; give
the bridge ``policy_reset_service:=/expert_driver/reset`` and it calls it before every
episode, as it does for ``act_node``.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from act_ros.core.contract import load_contract
from act_ros.core.control.inputs import InputStore
from act_ros.ros import conversions as conv
from act_ros.ros.node.interfaces import COMMAND_QOS

STREAMS = ('joint_states', 'ee_pose', 'box_pose', 'pad_pose')


def _stamp_s(msg: Any) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def _pose(msg: PoseStamped) -> np.ndarray:
    """(x, y, z, yaw) of a PoseStamped (yaw about +z)."""
    p, q = msg.pose.position, msg.pose.orientation
    yaw = math.atan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z))
    return np.array([p.x, p.y, p.z, yaw], dtype=np.float64)


class ExpertDriver(Node):
    """See the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__('expert_driver', **kwargs)
        from act_ros.sim import PortPickAlignEnv, ScriptedExpert, SimConfig

        self.declare_parameter('command_topic', 'joint_trajectory_controller/joint_trajectory')
        self.declare_parameter('sim_config_path', '')
        self.contract = load_contract()
        path = self.get_parameter('sim_config_path').value or None
        self.env = PortPickAlignEnv(SimConfig.from_yaml(path, render=False), self.contract)
        self.expert = ScriptedExpert(self.env)
        self.store = InputStore(STREAMS, max_age_s=1e9)
        self._lock = threading.Lock()
        self._reset_pending = True
        self.commands_sent = 0
        names = list(self.contract.joint_names)
        self.joint_names = names
        self._efforts: np.ndarray | None = None  # of the latest joint state (the gate's)
        self.create_subscription(JointState, 'joint_states', self._on_joint_state,
                                 qos_profile_sensor_data)
        for name in STREAMS[1:]:
            self.create_subscription(PoseStamped, name,
                                     lambda m, n=name: self._put(n, _pose(m), m),
                                     qos_profile_sensor_data)
        self.pub = self.create_publisher(JointTrajectory,
                                         self.get_parameter('command_topic').value, COMMAND_QOS)
        self.create_service(Trigger, '~/reset', self._on_reset)

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        with self._lock:
            self._reset_pending = True
        response.success, response.message = True, 'the next observation starts an episode'
        return response

    def _on_joint_state(self, msg: JointState) -> None:
        positions = conv.joint_positions(msg, self.joint_names)
        self._efforts = conv.joint_efforts(msg, self.joint_names)
        self._put('joint_states', positions, msg)

    def _put(self, stream: str, value: np.ndarray, msg: Any) -> None:
        stamp = _stamp_s(msg)
        self.store.put(stream, value, stamp, stamp)
        if not self.store.take_synchronized(1e-6):
            return
        snap = self.store.snapshot(stamp)
        from act_ros.sim.env import SimObservation

        pose = snap.value('ee_pose')
        obs = SimObservation(images={}, joint_positions=snap.value('joint_states'),
                             ee_position=pose[:3], box_pose=snap.value('box_pose'),
                             pad_pose=snap.value('pad_pose'), step_index=0, time_s=stamp,
                             joint_efforts=self._efforts)
        with self._lock:
            if self._reset_pending:
                self.expert.reset(obs)
                self._reset_pending = False
            if self.expert.tick >= self.env.config.episode_steps:
                return
            action = self.expert.act(obs)
        command = conv.to_joint_trajectory(action, self.joint_names, 1.0 / self.contract.fps)
        command.header.stamp = msg.header.stamp  # the observation it answers
        self.pub.publish(command)
        self.commands_sent += 1

    def destroy_node(self) -> None:
        self.env.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Console entry point (``python -m act_ros.ros.recording.expert_driver``)."""
    from act_ros.ros.spin import run_node

    return run_node(ExpertDriver, name='expert_driver', args=args)


if __name__ == '__main__':
    sys.exit(main())
