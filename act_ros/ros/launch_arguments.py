"""Which parameters the launch files pass to their nodes, and in which order.

``ros2 launch`` hands a node its parameter sources as a list, and for a name set in
several of them the last one wins. Every launch file of this package builds that list
with :func:`parameter_sources`, a pure function of the launch arguments (tested without
``launch``, which is not installable from the Python package index):

1. ``defaults``: what a launch file needs when nothing else says so (``sim.launch.py``:
   lock-step, simulated time); the user's file overrides them;
2. the parameter files (``params_file``; ``act_params_file``, ``bridge_params_file``);
3. the launch arguments the user **gave**, converted to the parameter's type: they override
   the file. An argument left at its default (the empty string) passes nothing, so a
   launch argument the user did not give never overrides the file;
4. ``wiring``: what a launch file must set for its nodes to work together, last
   (``sim.launch.py``: act_node triggered and executed as the bridge's mode needs, the pad
   pose from the bridge, the bridge resetting the policy, both started at once).

:func:`file_parameters` reads the values a parameter file gives a node (``sim.launch.py``
needs the bridge's ``mode`` to pair act_node with it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from act_ros.sim.config import GRIPPER_EMPTY_EFFORT_N

#: The value of a launch argument the user did not give.
NOT_GIVEN = ''
SIM_MODES = ('lockstep', 'realtime')


@dataclass(frozen=True)
class LaunchArgument:
    """A launch argument that sets one node parameter when given."""

    name: str  # the launch argument (name:=value)
    parameter: str  # the node parameter it sets
    type_: type = str  # str, bool, int or float

    def convert(self, text: str) -> Any:
        """The parameter value for the argument's text; one line on a bad value."""
        if self.type_ is str:
            return text
        if self.type_ is bool:
            value = {'true': True, 'false': False}.get(text.strip().lower())
            if value is None:
                raise ValueError(f"launch argument {self.name}:={text!r}: expected true or false")
            return value
        try:
            return self.type_(text)
        except ValueError:
            raise ValueError(f'launch argument {self.name}:={text!r}: expected '
                             f'{"an integer" if self.type_ is int else "a number"}') from None


A = LaunchArgument
#: launch/act.launch.py -> act_node.
ACT_NODE_ARGUMENTS: tuple[LaunchArgument, ...] = (
    A('model_path', 'model_path'),
    A('device', 'device'),
    A('autostart', 'autostart', bool),
    A('use_sim_time', 'use_sim_time', bool),
    A('joint_states_topic', 'joint_states_topic'),
    A('top_image_topic', 'cameras.top.topic'),
    A('wrist_image_topic', 'cameras.wrist.topic'),
)
#: launch/record.launch.py -> record_node.
RECORD_NODE_ARGUMENTS: tuple[LaunchArgument, ...] = (
    A('output', 'output'),
    A('action_source', 'action_source'),
    A('action_topic', 'action_topic'),
    A('max_episode_s', 'max_episode_s', float),
    A('joint_states_topic', 'joint_states_topic'),
    A('top_image_topic', 'cameras.top.topic'),
    A('wrist_image_topic', 'cameras.wrist.topic'),
    A('top_image_transport', 'cameras.top.transport'),
    A('wrist_image_transport', 'cameras.wrist.transport'),
)
#: launch/sim.launch.py -> sim_bridge.
SIM_BRIDGE_ARGUMENTS: tuple[LaunchArgument, ...] = (
    A('mode', 'mode'),
    A('seed', 'seed', int),
    A('episodes', 'episodes', int),
    A('image_height', 'image_height', int),
    A('image_width', 'image_width', int),
    A('episode_steps', 'episode_steps', int),
    A('lockstep_timeout_s', 'lockstep_timeout_s', float),
)
#: launch/sim.launch.py -> act_node.
SIM_ACT_NODE_ARGUMENTS: tuple[LaunchArgument, ...] = (
    A('model_path', 'model_path'),
    A('device', 'device'),
    A('policy_mode', 'mode'),
    A('use_sim_time', 'use_sim_time', bool),
)


def given(values: Mapping[str, str], name: str) -> bool:
    """Whether the user gave launch argument ``name`` (a non-empty value)."""
    return str(values.get(name, NOT_GIVEN)) != NOT_GIVEN


def given_parameters(values: Mapping[str, str],
                     arguments: Sequence[LaunchArgument]) -> dict[str, Any]:
    """parameter -> value for each of ``arguments`` the user gave, in the parameter's type."""
    return {arg.parameter: arg.convert(str(values[arg.name]))
            for arg in arguments if given(values, arg.name)}


def parameter_sources(files: Sequence[str], values: Mapping[str, str],
                      arguments: Sequence[LaunchArgument], *,
                      defaults: Mapping[str, Any] | None = None,
                      wiring: Mapping[str, Any] | None = None) -> list[Any]:
    """A node's ``parameters=`` list, lowest precedence first: ``defaults``, ``files``, the
    launch arguments given, ``wiring`` (see the module docstring); empty parts left out."""
    sources: list[Any] = []
    if defaults:
        sources.append(dict(defaults))
    sources.extend(str(path) for path in files if str(path))
    overrides = given_parameters(values, arguments)
    if overrides:
        sources.append(overrides)
    if wiring:
        sources.append(dict(wiring))
    return sources


def _pattern(key: str) -> re.Pattern[str]:
    """A parameter file's node key (``act_node``, ``/arm/act_node``, ``/**/act_node``,
    ``/**``, with ``*`` wildcards) as a pattern over fully qualified node names."""
    key = key if key.startswith('/') else '/' + key
    parts = []
    for token in key.split('/')[1:]:
        if token == '**':
            parts.append('(?:/[^/]+)*')
        else:
            parts.append('/' + '[^/]*'.join(re.escape(p) for p in token.split('*')))
    return re.compile(''.join(parts))


def _flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f'{prefix}{key}.'))
        else:
            out[f'{prefix}{key}'] = value
    return out


def file_parameters(path: str, node: str) -> dict[str, Any]:
    """The parameters a ROS 2 parameter file gives the node named ``node`` (fully qualified,
    ``/sim_bridge`` or ``/arm/sim_bridge``): every section whose key matches it, in file
    order (a later section wins, as in rcl)."""
    from act_ros.core.paths import load_yaml_mapping

    data = load_yaml_mapping(path, 'parameters')
    out: dict[str, Any] = {}
    for key, section in data.items():
        params = section.get('ros__parameters') if isinstance(section, Mapping) else None
        if isinstance(params, Mapping) and _pattern(str(key)).fullmatch(node):
            out.update(_flatten(params))
    return out


def node_name(namespace: str, name: str) -> str:
    """The fully qualified name of node ``name`` in ``namespace``."""
    namespace = '/' + namespace.strip('/') if namespace.strip('/') else ''
    return f'{namespace}/{name}'


def sim_mode(values: Mapping[str, str], bridge_files: Sequence[str], namespace: str = '') -> str:
    """The bridge's mode in ``sim.launch.py``: the ``mode`` argument if given, else what the
    bridge's parameter file says, else ``lockstep`` (the launch file's default)."""
    if given(values, 'mode'):
        mode = str(values['mode'])
    else:
        mode = 'lockstep'
        for path in bridge_files:
            if str(path):
                mode = str(file_parameters(str(path), node_name(namespace, 'sim_bridge'))
                           .get('mode', mode))
    if mode not in SIM_MODES:
        raise ValueError(f"sim_bridge mode {mode!r}: expected one of {list(SIM_MODES)}")
    return mode


def sim_parameters(values: Mapping[str, str], *, act_files: Sequence[str],
                   bridge_files: Sequence[str], namespace: str = ''
                   ) -> tuple[list[Any], list[Any]]:
    """``(sim_bridge, act_node)`` parameter lists of ``sim.launch.py``.

    Defaults (overridden by the files): the bridge in lock-step, act_node on simulated
    time with the simulated gripper's effort as its gate's evidence of an empty close
    (``release_gate.empty_effort``). Wiring (always): the bridge starts its episodes and
    resets act_node before each; act_node starts at once, reads the pad from the bridge's
    ``pad_pose`` and, paired with the bridge's mode (:func:`sim_mode`), ticks once per
    observation and computes in the tick for lock-step (``trigger: observation``,
    ``execution: sync``), or on its timer for real time (``trigger: timer``; its execution as the files say).
    """
    mode = sim_mode(values, bridge_files, namespace)
    bridge = parameter_sources(bridge_files, values, SIM_BRIDGE_ARGUMENTS,
                               defaults={'mode': 'lockstep'},
                               wiring={'mode': mode, 'autostart': True,
                                       'policy_reset_service': 'act_node/reset'})
    pairing: dict[str, Any] = ({'trigger': 'observation', 'execution': 'sync'}
                               if mode == 'lockstep' else {'trigger': 'timer'})
    act = parameter_sources(act_files, values, SIM_ACT_NODE_ARGUMENTS,
                            defaults={'use_sim_time': True,
                                      # The bridge publishes the gripper's effort.
                                      'release_gate.empty_effort': GRIPPER_EMPTY_EFFORT_N},
                            wiring={**pairing, 'pad_source': 'topic', 'pad_pose_topic': 'pad_pose',
                                    'autostart': True})
    return bridge, act
