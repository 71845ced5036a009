"""Parameters of ``sim_bridge``: declared in one place, validated into one settings object.

``config/sim_bridge.yaml`` is generated from this table (``act-ros report``). The
declaration helpers are the policy node's (:mod:`act_ros.ros.node.parameters`), so both
nodes describe and check their parameters the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from rclpy.node import Node

from act_ros.ros.node.parameters import ParamSpec, get_value
from act_ros.ros.sim_bridge.loop import MODES

P = ParamSpec
BRIDGE_PARAMETERS: list[ParamSpec] = [
    P('task', 'port_pick_align', "The simulated task: the package's own arm "
      '(port_pick_align) or gym-aloha\'s bimanual transfer cube (aloha_transfer_cube: 14 '
      'joints, a top camera at 480x640 unless image_height/width say otherwise, 50 Hz, no '
      'poses published, an episode ends at success as LeRobot\'s evaluation ends it; '
      'sim_config_path and contract_path do not apply).',
      choices=('port_pick_align', 'aloha_transfer_cube'), read_only=True),
    P('mode', 'realtime', 'realtime: one control step per 1/fps s of wall clock, holding the '
      'last command; lockstep: one step per command received (reproducible evaluation).',
      choices=MODES, read_only=True),
    P('sim_config_path', '', 'Simulation settings (YAML, sim: section); empty means the '
      'package config/sim.yaml.', read_only=True),
    P('contract_path', '', 'I/O contract (joint names, limits); empty means the one named by '
      'the sim config (default: the package config/contract.yaml).', read_only=True),
    P('image_height', 0, 'Camera image height in pixels; 0 keeps the sim config value.',
      low=0, high=4096, read_only=True),
    P('image_width', 0, 'Camera image width in pixels; 0 keeps the sim config value.',
      low=0, high=4096, read_only=True),
    P('episode_steps', 0, 'Control steps per episode; 0 keeps the sim config value (300).',
      low=0, high=1_000_000, read_only=True),
    P('seed', 0, 'Seed of the next episode (box, pad and start pose); each episode started '
      'after it uses the previous seed + 1. -1: a random seed per episode. Set it, then '
      'call ~/reset, for a chosen episode.', low=-1, high=2**31 - 2),
    P('autostart', True, 'Start the first episode at start-up and the next ones when an '
      'episode ends (up to episodes); false: every episode waits for ~/reset.',
      read_only=True),
    P('episodes', 0, 'With autostart: episodes run back to back (0 = no end).',
      low=0, high=1_000_000, read_only=True),
    P('lockstep_timeout_s', 2.0, 'lockstep: without a command for this long the step runs '
      'with the last target held, and is counted in the episode status.',
      low=0.001, high=3600.0),
    P('policy_reset_service', '', 'std_srvs/Trigger service called before each episode '
      '(e.g. act_node/reset: empties the action queue and re-arms the release gate); '
      'empty: none.', read_only=True),
    P('policy_reset_timeout_s', 10.0, 'How long to wait for the policy reset service to '
      'appear and answer before an episode start fails; in lockstep also how long to wait '
      'for the policy to be connected (command publisher and observation subscribers).',
      low=0.1, high=600.0),
    P('policy_inputs', '', 'lockstep: the topics the policy subscribes, comma-separated '
      '(e.g. joint_states,box_pose,pad_pose for a policy without cameras that takes the '
      'object poses): an episode starts once each has a subscriber, so the first observation '
      'is not lost to discovery. Empty: joint_states and every camera.', read_only=True),
    P('frame_id', 'base_link', 'Frame of the published poses (the robot base; the world '
      'origin of the simulation).', read_only=True),
    P('status_period_s', 1.0, 'Period of the episode status heartbeat (also published on '
      'every step).', low=0.05, high=60.0, read_only=True),
]


@dataclass(frozen=True)
class BridgeSettings:
    """Validated parameters of ``sim_bridge``."""

    task: str
    mode: str
    sim_config_path: str
    contract_path: str
    image_height: int
    image_width: int
    episode_steps: int
    seed: int
    autostart: bool
    episodes: int
    lockstep_timeout_s: float
    policy_reset_service: str
    policy_reset_timeout_s: float
    policy_inputs: str
    frame_id: str
    status_period_s: float

    def sim_overrides(self) -> dict[str, object]:
        """Keyword overrides for :meth:`act_ros.sim.SimConfig.from_yaml`."""
        overrides: dict[str, object] = {'render': True}
        if self.image_height:
            overrides['camera_height'] = self.image_height
        if self.image_width:
            overrides['camera_width'] = self.image_width
        if self.episode_steps:
            overrides['episode_steps'] = self.episode_steps
        if self.contract_path:
            overrides['contract_path'] = self.contract_path
        return overrides

    @property
    def policy_input_topics(self) -> tuple[str, ...]:
        """``policy_inputs`` as topic names (empty: the default set)."""
        return tuple(self.policy_inputs.split(',')) if self.policy_inputs else ()


def read_bridge_settings(node: Node) -> BridgeSettings:
    """Read and validate the declared parameters; ``ValueError`` with one line on a problem."""
    values = {spec.name: get_value(node, spec.name) for spec in BRIDGE_PARAMETERS}
    for spec in BRIDGE_PARAMETERS:
        if spec.choices and values[spec.name] not in spec.choices:
            raise ValueError(f"{spec.name}: '{values[spec.name]}' is not one of "
                             f'{list(spec.choices)}')
    if bool(values['image_height']) != bool(values['image_width']):
        raise ValueError('image_height and image_width: give both or neither, got '
                         f"{values['image_height']}x{values['image_width']}")
    if not values['frame_id']:
        raise ValueError('frame_id is empty')
    values['policy_inputs'] = ','.join(
        name.strip() for name in values['policy_inputs'].split(',') if name.strip())
    return BridgeSettings(**values)
