"""Lock-step step rate of ``sim_bridge`` over ROS 2 (a benchmark: prints numbers).

    python -m act_ros.ros.sim_bridge.bench --image-size 96x128 480x640 --steps 150

For each image size: ``sim_bridge`` runs as its own process in lock-step; this process
plays an instant policy that subscribes to the cameras and joint states like ``act_node``
and answers every complete observation (same stamp on all three) with a hold command.
The rate is therefore the bridge's ceiling: physics + rendering both cameras + message
transport both ways, with zero inference time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from act_ros.core.arguments import HelpFormatter
from act_ros.core.contract import load_contract
from act_ros.core.processes import ProcessSet, signals_deferred
from act_ros.ros import conversions as conv
from act_ros.ros.evaluation.client import EvalClient
from act_ros.ros.evaluation.dds import PROFILE_VARIABLES, dds_environment, use_in_this_process
from act_ros.ros.evaluation.ros_eval import bridge_command, default_domain_id, parse_image_size
from act_ros.ros.sim_bridge.bridge import COMMAND_QOS, camera_topic
from act_ros.sim.scene import CAMERAS


class InstantPolicy:
    """Answers each synchronized observation at once with the measured joints."""

    def __init__(self, client: EvalClient, joint_names: list[str]) -> None:
        node = client.node
        self.joint_names = joint_names
        self.latest: dict[str, int] = {}
        self.answered: set[int] = set()
        self.joints: dict[int, list[float]] = {}
        self.subscriptions = []
        self.pub = node.create_publisher(Float64MultiArray, 'forward_position_controller/commands',
                                         COMMAND_QOS)
        self.subscriptions.append(node.create_subscription(
            JointState, 'joint_states', self._on_joints, qos_profile_sensor_data))
        for cam in CAMERAS:
            self.subscriptions.append(node.create_subscription(
                Image, camera_topic(cam), lambda msg, c=cam: self._on_stream(c, msg),
                qos_profile_sensor_data))

    def matched(self) -> bool:
        """Every stream has a publisher and the commands a subscriber (discovery done)."""
        return (self.pub.get_subscription_count() > 0
                and all(sub.get_publisher_count() > 0 for sub in self.subscriptions))

    def _on_joints(self, msg: JointState) -> None:
        self.joints[_stamp(msg)] = list(conv.joint_positions(msg, self.joint_names))
        self._on_stream('joints', msg)

    def _on_stream(self, stream: str, msg: object) -> None:
        if isinstance(msg, Image):
            conv.image_to_rgb(msg)  # the decoding act_node does
        stamp = _stamp(msg)
        self.latest[stream] = stamp
        complete = len(self.latest) == len(CAMERAS) + 1 and len(set(self.latest.values())) == 1
        if complete and stamp not in self.answered and stamp in self.joints:
            self.answered.add(stamp)
            self.pub.publish(Float64MultiArray(data=self.joints.pop(stamp)))


def _stamp(msg: object) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def measure(size: tuple[int, int], steps: int, domain: int, timeout_s: float,
            large_images: bool = True) -> dict[str, float]:
    """Steps per second of one lock-step episode of ``steps`` steps at ``size``.

    ``large_images``: use the Fast DDS profile of :mod:`act_ros.ros.evaluation.dds` (as the
    evaluation driver does); ``False`` shows the middleware defaults.
    """
    args = argparse.Namespace(seed=0, episode_steps=steps, lockstep_timeout=timeout_s)
    log_dir = Path(tempfile.mkdtemp(prefix='act_ros_bridge_bench_'))
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST')
    env.setdefault('MUJOCO_GL', 'egl')
    if large_images:
        env = dds_environment(env)
    procs = ProcessSet(log_dir, env)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    for name in PROFILE_VARIABLES:  # this process receives the images: same transport
        os.environ.pop(name, None)
    use_in_this_process(env)
    client = EvalClient(domain, check=procs.check)
    try:
        procs.start('sim_bridge', bridge_command(args, size, policy_reset=False))
        policy = InstantPolicy(client, list(load_contract().joint_names))
        client.spin_until(lambda: client.status is not None, 60.0, 'the bridge')
        # Discovery of the image and command topics, counted on both ends of this process;
        # a moment more for the bridge's ends to match (a best-effort image sent before
        # that is lost, and its step would count as a lock-step timeout).
        client.spin_until(policy.matched, 60.0, 'the bridge\'s topics to match')
        client.spin_for(0.5)
        start = time.monotonic()
        status = client.run_episode(0, timeout_s, 60.0)
        wall = time.monotonic() - start
    finally:
        with signals_deferred():
            procs.stop_all()
            client.close()
    # The bridge's log is kept where a failure above names it; after a measurement it goes.
    shutil.rmtree(log_dir, ignore_errors=True)
    timeouts = status['commands']['lockstep_timeouts']
    return {'steps_per_s': steps / wall, 'ms_per_step': wall / steps * 1000,
            'lockstep_timeouts': timeouts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m act_ros.ros.sim_bridge.bench',
                                     description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument('--image-size', nargs='+', default=['96x128', '480x640'])
    parser.add_argument('--steps', type=int, default=150)
    parser.add_argument('--domain-id', type=int, default=None)
    parser.add_argument('--lockstep-timeout', type=float, default=5.0,
                        help='seconds the bridge waits for a command before it steps '
                             'without one (counted as a timeout: a lost image)')
    parser.add_argument('--dds-defaults', action='store_true',
                        help='keep the Fast DDS defaults (full-size images are mostly lost)')
    args = parser.parse_args(argv)
    domain = args.domain_id if args.domain_id is not None else default_domain_id()
    for text in args.image_size:
        size = parse_image_size(text)
        m = measure(size, args.steps, domain, timeout_s=args.lockstep_timeout,
                    large_images=not args.dds_defaults)
        print(f'sim_bridge lock-step {size[0]}x{size[1]}: {m["steps_per_s"]:.1f} steps/s '
              f'({m["ms_per_step"]:.1f} ms/step, {args.steps} steps, '
              f'{m["lockstep_timeouts"]} timeouts)', flush=True)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
