"""The parameters of ``act_node``: declared in one place, validated into one settings object.

Every parameter is a :class:`ParamSpec` in :func:`parameter_specs` with its description,
range or choices and whether it is read-only (the structural ones: topics, message types,
joint names). A node's ``--help``, its parameters file (``config/act.yaml``) and its table
on ``docs/parameters.md`` are made from these declarations (:class:`ParameterFile`; the
file and the table are written by ``act-ros report``, whose check fails when they differ).

Declaration never raises on a bad value from the command line or a parameters file: the
offending parameter keeps its default and the problem is recorded, so that the node
still comes up and the *configure* transition fails with one clear line
(:func:`read_settings`), as a managed node should.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import (
    InvalidParameterTypeException,
    InvalidParameterValueException,
    ParameterUninitializedException,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from act_ros.core.contract import Contract
from act_ros.core.control.loop import SafetySettings
from act_ros.core.control.release_gate import ReleaseGateConfig
from act_ros.core.control.safety import SafetyLimits
from act_ros.core.control.speed_limits import (
    DEFAULT_ARM_SPEED,
    DEFAULT_GRIPPER_TRAVEL_S,
    SpeedLimits,
    resolve_speed_limits,
)
from act_ros.core.inference.chunking import DEFAULT_BLEND_WINDOW, blend_window_ticks
from act_ros.core.inference.options import BACKEND_CHOICES, COMPILE_MODES, PRECISIONS
from act_ros.core.inference.precision import AUTO, DEFAULT_TOLERANCE
from act_ros.core.inference.runtime import LIVE_EXECUTIONS, MODES, RuntimeConfig
from act_ros.core.object_state import OBJECTS

COMMAND_TYPES = ('JointTrajectory', 'Float64MultiArray')
COMMAND_TRAJECTORIES = ('point', 'chunk')
EXECUTORS = ('auto', 'multi_threaded', 'single_threaded')
DEFAULT_COMMAND_TOPICS = {
    'JointTrajectory': 'joint_trajectory_controller/joint_trajectory',
    'Float64MultiArray': 'forward_position_controller/commands',
}
DEVICE_PATTERN = re.compile(r'^(auto|cpu|mps|cuda(:\d+)?)$')


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: name, default, description and constraints."""

    name: str
    default: Any
    description: str
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    read_only: bool = False
    # Needed when ``default`` may be None; the parameters file leaves such a one commented out.
    type_: Parameter.Type | None = None
    section: str = ''  # starts a section of the parameters file

    def constraints(self) -> str:
        """``one of a, b; read-only``, ``0.0 to 10.0``: what ``--help``, the file and the table
        show."""
        low, high = (format_parameter_value(x) for x in (self.low, self.high))
        text = ('one of ' + ', '.join(format_parameter_value(c) for c in self.choices)
                if self.choices else f'{low} to {high}'
                if self.low is not None and not isinstance(self.default, bool) else '')
        return '; '.join(t for t in (text, 'read-only' if self.read_only else '') if t)

    def descriptor(self) -> ParameterDescriptor:
        desc = ParameterDescriptor(name=self.name, description=self.description,
                                   read_only=self.read_only)
        if self.choices:
            desc.additional_constraints = 'one of: ' + ', '.join(self.choices)
        if self.low is not None and self.high is not None:
            if isinstance(self.default, bool):
                pass
            elif isinstance(self.default, int):
                desc.integer_range = [IntegerRange(from_value=int(self.low),
                                                   to_value=int(self.high), step=1)]
            elif isinstance(self.default, float):
                desc.floating_point_range = [FloatingPointRange(
                    from_value=float(self.low), to_value=float(self.high), step=0.0)]
        return desc


CONTRACT_PATH = ParamSpec(
    'contract_path', '', 'I/O contract YAML; empty means the package config/contract.yaml. A '
    "relative path that is not a file in the working directory is looked up in the package's "
    'config/ (robots/aloha/contract.yaml, robots/so101/contract.yaml: the example arms).',
    read_only=True)


def camera_topic_param(camera: str) -> str:
    return f'cameras.{camera}.topic'


def object_pose_topic_param(obj: str) -> str:
    """Parameter naming an object's ``geometry_msgs/PoseStamped`` topic."""
    return f'object_pose_topics.{obj}'


OBJECT_POSE_DESCRIPTIONS = {
    'box': 'geometry_msgs/PoseStamped of the box to pick (its centre)',
    'pad': 'geometry_msgs/PoseStamped of the pad to place it on (centre of its top face)',
}


def parameter_specs(contract: Contract | None) -> list[ParamSpec]:
    """All parameters of the node; joint and camera defaults come from the contract."""
    P = ParamSpec
    joints = list(contract.joint_names) if contract else None
    lower = [float(v) for v in contract.joint_lower] if contract else None
    upper = [float(v) for v in contract.joint_upper] if contract else None
    specs = [
        P('model_path', '', 'Checkpoint directory (LeRobot pretrained_model: config.json, '
          'model.safetensors, processor files), or a Hugging Face Hub id '
          'org/name[@revision][/subfolder] resolved through the huggingface_hub cache '
          '(offline with HF_HUB_OFFLINE=1; docs/hub_ids.md). A relative path is looked up in '
          "the working directory, then in the package's models/ folder; a name is a Hub id "
          'only when it cannot be a local path. Required.',
          section='Policy and runtime'),
        CONTRACT_PATH,
        P('device', 'auto', 'Inference device: auto (MPS, then CUDA, then CPU), cpu, cuda, '
          'cuda:N or mps. An explicit device that is missing fails configure.'),
        P('compile_model', False, 'Compile the model with torch.compile at configure.'),
        P('compile_mode', 'default', 'torch.compile mode.',
          choices=COMPILE_MODES),
        P('precision', 'auto', 'Inference precision: auto (bf16 with backend openvino on a CPU '
          'with native bfloat16, AVX512-BF16 or AMX, kept only when its actions on the check '
          'observations stay within precision_tolerance of fp32; fp32 everywhere else), fp32, '
          'fp16 (CUDA/MPS), bf16 (native bfloat16 only) or int8 (backend openvino, the model '
          'act-ros export --int8 quantized with NNCF on a calibration dataset; auto never '
          'picks it). int8, and bf16 or fp16 set by name, are checked against fp32 and '
          'refused over precision_tolerance (see precision_tolerance for the observations).',
          choices=(AUTO, *PRECISIONS)),
        P('precision_tolerance', DEFAULT_TOLERANCE, 'precision auto: largest difference of any '
          'normalized action (units of its standard deviation in the training data) between '
          'a reduced precision and fp32 on the check observations (the real ones saved beside '
          'the checkpoint, precision_check_observations.npz; else the live inputs seen '
          'before activation, checked at activation; else synthetic ones, with a warning) '
          'for it to be kept; over it, auto falls back to fp32 with a warning and a '
          'precision set by name (int8, bf16 on openvino) fails configure (at activation '
          'for a live check). The measured '
          'difference is logged and on /diagnostics (precision.check_max_diff).',
          low=0.0, high=10.0),
        P('backend', 'auto', 'Inference backend: auto (openvino on a CPU when it is installed, '
          'torch when a GPU is present, compile_model or fp16 is set, or openvino is missing; '
          'the choice and its reason are logged and on /diagnostics as backend and '
          'backend_why), torch (any device); openvino or onnxruntime (CPU only, from an ONNX '
          'export next to the checkpoint, made at configure when missing or stale; pip extras '
          'act_ros[openvino] / act_ros[onnxruntime]). onnxruntime is fp32 only; compile_model '
          'applies to torch only.',
          choices=BACKEND_CHOICES),
        P('torch_threads', 0, 'PyTorch CPU threads for inference; 0 keeps the PyTorch default.',
          low=0, high=256),
        P('warmup', True, 'Run the model once at configure so the first tick is not slow.'),
        P('inference_timeout_s', 30.0, 'execution process: a chunk not back within this time '
          'means a hung inference process, which is killed and restarted (as one that died).',
          low=0.1, high=3600.0),
        P('model_only_calls', 0, 'Model-only calls timed at configure, after the real-time '
          'verdict, as the model alone per chunk beside the latency split on /diagnostics '
          '(latency_split.model_only_ms); 0 takes the model parts of the verdict\'s two '
          'timed calls (no extra call). Benchmarks set more for a steadier figure.',
          low=0, high=1000),
        P('inference_nice', 0, 'execution process: niceness of the inference process (0-19). '
          'Higher lets the node\'s own threads (tick, message handling, publishing) take the '
          'CPU first when both want it, at some cost in model time on a small CPU.',
          low=0, high=19),
        P('mode', 'blend', 'chunk: play n_action_steps of each chunk, then the next; ensemble: '
          'temporal ensembling of every chunk covering the tick (a model call per tick); '
          'blend: play each chunk until the next arrives, keep the actions already sent and '
          'crossfade the rest of the old chunk into the new one over blend_window from its '
          'arrival (docs/seams.md).', choices=MODES),
        P('blend_window', DEFAULT_BLEND_WINDOW, "mode blend: the crossfade, in ticks ('6') or "
          "seconds ('0.2s', rounded to ticks at control_rate_hz); 0 switches at once. Each "
          'chunk plays at most its length less the window before the next is due.'),
        P('seams.window_s', 60.0, 'Seconds of commands behind the seam figures on '
          '/diagnostics (seams.*) and ~/seams; 0: everything since configure (evaluations).',
          low=0.0, high=86400.0),
        P('execution', 'process', 'async: chunks are computed in the background while the '
          'queue plays out (never blocks the tick); process: async with the model in a '
          'child process, so message handling never competes with inference for the '
          'Python interpreter lock (best on small CPUs); sync: the tick waits for the model '
          '(LeRobot select_action semantics, for lock-step evaluation).',
          choices=LIVE_EXECUTIONS),
        P('n_action_steps', 0, "Actions played from each chunk (chunk and blend modes); 0: the "
          "checkpoint's own n_action_steps (its config.json), as LeRobot's select_action "
          'plays it.', low=0, high=1000),
        P('ensemble_coeff', 0.01, 'Temporal ensembling weight exp(-k*i), i = 0 for the oldest.',
          low=0.0, high=10.0),
        P('control_rate_hz', 0.0, "Control rate (timer trigger); one command per period. 0: "
          "the contract's fps (the rate the policy's data was recorded at).",
          low=0.0, high=1000.0,
          section='Control loop'),
        P('trigger', 'timer', 'timer: tick at control_rate_hz; observation: one tick per '
          'synchronized set of new messages (lock-step simulation).',
          choices=('timer', 'observation'), read_only=True),
        P('sync_tolerance_s', 0.005, 'observation trigger: header stamps within this many '
          'seconds of each other form one observation.', low=0.0, high=1.0),
        P('max_obs_age_s', 0.2, 'Inputs older than this (receive time, node clock) are stale: '
          'no commands until fresh data returns.', low=0.001, high=10.0),
        P('autostart', True, 'Configure and activate on start-up (no lifecycle manager). '
          'Under a lifecycle manager set false; also for a model without '
          'precision_check_observations.npz, so that its reduced-precision check runs on '
          'live inputs seen before activation (docs/deployment.md).'),
        P('executor', 'auto', 'Executor of the console script: multi_threaded (a pool of 4 '
          'threads, act_ros.ros.spin.PoolExecutor: inputs and the tick run in parallel, as '
          'execution sync needs), single_threaded (least CPU per '
          'message; enough when the model runs elsewhere), or auto: multi_threaded for sync '
          'execution, else single_threaded. Embedding applications choose their own.',
          choices=EXECUTORS, read_only=True),
        P('diagnostics_period_s', 1.0, 'Period of the diagnostics message on /diagnostics.',
          low=0.05, high=60.0),
        P('visualization.enabled', True, 'Publish ~/planned_path (nav_msgs/Path: end-effector '
          'poses of the chunk being played, by forward kinematics) and ~/markers '
          '(visualization_msgs/MarkerArray: release region around the pad coloured by the gate '
          'state, end effector, planned gripper requests, a text with the gate state and the '
          'input ages). Built at visualization.rate_hz off the control tick; false: no such '
          'publishers at all.',
          section='What the policy plans, for RViz or Foxglove'),
        P('visualization.rate_hz', 5.0, 'Rate at which the markers are published and a new '
          'chunk becomes a new path.', low=0.1, high=30.0),
        P('visualization.frame_id', 'base_link', 'Frame of the path and the markers: the robot '
          'base frame of the joint model (the URDF root), in which the pad position is given.'),
        P('pose_frame_id', '', 'Frame every pose input must be in (header.frame_id of '
          'object_pose_topics.*, pad_pose_topic and ee_pose_topic): poses are used as they '
          'are, never transformed, so a pose in another frame is rejected like a malformed '
          'message (no command while it is the newest on its topic; /diagnostics names the '
          'topic, the frame received and the frame expected). Empty: visualization.frame_id, '
          'the robot base frame.', read_only=True),
        P('joint_states_topic', 'joint_states', 'sensor_msgs/JointState input.', read_only=True,
          section='Topics and message types'),
        P('image_transport', 'raw', 'raw: sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, mono8) '
          'on each camera topic; compressed: sensor_msgs/CompressedImage (JPEG, PNG) on '
          '<camera topic>/compressed.',
          choices=('raw', 'compressed'), read_only=True),
        P('command_type', 'JointTrajectory', 'Command message type.', choices=COMMAND_TYPES,
          read_only=True),
        P('command_trajectory', 'point', 'command_type JointTrajectory: point sends the '
          "tick's command as one point; chunk sends the rest of the plan as one multi-point "
          'trajectory every tick (positions and velocities of the chunk, every point through '
          'the safety chain, time_from_start one period apart, header.stamp the tick), so the '
          'controller interpolates at its own rate; a tick without a command then sends an '
          'empty trajectory (the controller holds).', choices=COMMAND_TRAJECTORIES,
          read_only=True),
        P('command_stream_rate_hz', 0.0, 'command_type Float64MultiArray: 0 sends one command '
          'per tick; above control_rate_hz, commands at this rate interpolated from the '
          "tick's command toward the next planned one (both through the safety chain).",
          low=0.0, high=2000.0, read_only=True),
        P('command_topic', '', 'Command topic; empty means the controller default for the type '
          '(joint_trajectory_controller/joint_trajectory or forward_position_controller/commands).',
          read_only=True),
        P('joint_names', joints, 'Robot joint names in contract order (JointState is matched '
          'by these names; commands carry them). Default: the contract names.',
          read_only=True, type_=Parameter.Type.STRING_ARRAY,
          section='Joints and safety limits'),
        P('joint_lower', lower, "Lower position limits per joint (the contract's units: rad "
          'and a normalized gripper for the package arm). Default: the contract.',
          type_=Parameter.Type.DOUBLE_ARRAY),
        P('joint_upper', upper, 'Upper position limits per joint. Default: the contract.',
          type_=Parameter.Type.DOUBLE_ARRAY),
        P('max_joint_velocity', None, 'Joint speed limits per second (rad/s; a gripper in its '
          'units per second, its whole range for a normalized one): an arm joint moves at most '
          'speed / control_rate_hz per tick from its measured position, the gripper from its '
          'previous command. One value for all joints or one per joint. Not set: the URDF\'s '
          '<limit velocity> of each joint (urdf_path, else the contract\'s urdf; a '
          'gripper\'s scaled from its URDF travel to the contract range), else '
          f'{DEFAULT_ARM_SPEED:g} rad/s for an arm joint and its '
          f'whole range in {DEFAULT_GRIPPER_TRAVEL_S:g} s for a gripper. Above the URDF\'s: '
          'configure fails.', type_=Parameter.Type.DOUBLE_ARRAY),
        P('max_joint_step', None, 'Deprecated, use max_joint_velocity: the largest change per '
          'tick, converted to a speed with control_rate_hz (with a warning). Setting both '
          'fails configure.', type_=Parameter.Type.DOUBLE_ARRAY),
        P('release_gate.enabled', True, "Gate each gripper of the contract (one gate each): "
          'open only near the pad once holding. Thresholds and commands below are openings '
          "(0 closed, 1 open), converted to each gripper's units by the contract's closed and "
          'open positions.',
          section='Release gate'),
        P('release_gate.release_radius_m', 0.10, 'End effector to pad distance under which a '
          'release may pass.', low=0.001, high=10.0),
        P('release_gate.release_threshold', 0.90, 'Gripper command at or above which a command '
          'is an open (release) request.', low=0.01, high=1.0),
        P('release_gate.hold_threshold', 0.90, 'Gripper command below which the gripper counts '
          'as commanded closed.', low=0.01, high=1.0),
        P('release_gate.hold_ticks', 3, 'Consecutive closed ticks that enter HOLDING.',
          low=1, high=1000),
        P('release_gate.closed_command', 0.0, 'Gripper command sent while HOLDING.',
          low=0.0, high=1.0),
        P('release_gate.empty_effort', None, "Evidence of an empty gripper: the gripper joint's "
          "|effort| (JointState.effort, in the joint's effort units) below which fingers "
          'commanded closed hold nothing (the object was lost): HOLDING returns to FREE. Set it '
          'between the effort of fingers closed on nothing and on the thinnest object. Not set, '
          'or a JointState without efforts: empty_opening decides.',
          type_=Parameter.Type.DOUBLE),
        P('release_gate.empty_opening', None, 'Opt-in evidence of an empty gripper where no '
          'effort is known: the opening (0 closed, 1 open) of the thinnest object the arm picks; '
          'a closed gripper measured below it holds nothing. Not set (and no effort): a closed '
          'gripper always counts as holding, since its opening cannot tell a thin object (a '
          'card, a cable) from nothing; HOLDING then ends only by a release near the pad.',
          type_=Parameter.Type.DOUBLE),
        P('release_gate.empty_ticks', 5, 'Consecutive ticks of an empty gripper before HOLDING '
          'returns to FREE (longer than the fingers take to close).', low=1, high=1000),
        P('pad_source', 'parameter', 'Pad position from pad_position_m or from pad_pose_topic.',
          choices=('parameter', 'topic'), read_only=True),
        P('pad_position_m', [0.25, 0.0, 0.0], 'Pad position (x, y, z) in the robot base frame.'),
        P('pad_pose_topic', 'pad_pose', 'geometry_msgs/PoseStamped of the pad in pose_frame_id '
          '(pad_source topic).', read_only=True),
        P('ee_source', 'fk', 'End-effector position from forward kinematics of the measured '
          'joints (fk) or from ee_pose_topic (topic).', choices=('fk', 'topic'), read_only=True),
        P('ee_pose_topic', 'ee_pose', 'geometry_msgs/PoseStamped of the end effector in '
          'pose_frame_id, like the pad (ee_source topic); older than max_obs_age_s counts as '
          'unknown.', read_only=True),
        P('urdf_path', '', "Robot URDF for forward kinematics (the release gate's end "
          'effectors with ee_source fk, the planned path) and the default speed limits '
          "(max_joint_velocity); empty means the urdf the contract names (the package's "
          'contract: urdf/so101_class.urdf). Without one, or when it lacks the contract\'s '
          'joints or frames, the kinematic features turn themselves off with one warning '
          'saying why; configure goes on.'),
        P('ee_frame', '', 'URDF frame whose origin is the end-effector position (fk); empty '
          "means each gripper's ee_frame in the contract. Names one end effector: an arm with "
          'one gripper, or none (the planned path).'),
    ]
    for i, cam in enumerate(contract.cameras if contract else ()):
        specs.append(P(camera_topic_param(cam.name), f'camera/{cam.name}/image_raw',
                       f"Image topic of the '{cam.name}' camera ({cam.feature}); subscribed "
                       'when the checkpoint takes this camera.', read_only=True,
                       section='' if i else 'Camera and object pose topics'))
    for obj in OBJECTS:
        specs.append(P(object_pose_topic_param(obj), f'{obj}_pose',
                       f'{OBJECT_POSE_DESCRIPTIONS.get(obj, obj)} in the robot base frame '
                       '(pose_frame_id; not transformed). Subscribed only when '
                       'the checkpoint takes observation.environment_state; then a required '
                       'input like the cameras (older than max_obs_age_s: no command).',
                       read_only=True))
    return specs


def format_parameter_value(value: Any) -> str:
    """A parameter value as it is written after ``-p NAME:=`` (YAML: ``true``, ``[0.1]``)."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, str):
        return repr(value) if not value or value != value.strip() or ' ' in value else value
    if isinstance(value, (list, tuple)):
        return '[' + ', '.join(format_parameter_value(v) for v in value) + ']'
    return str(value)


@dataclass(frozen=True)
class ParameterFile:
    """A node's parameters as its ``--help``, its parameters file and its table on
    ``docs/parameters.md`` show them, all three made from the same declarations."""

    executable: str
    summary: str
    specs: Callable[[], list[ParamSpec]]  # the declarations, with the package contract
    path: str  # the parameters file, from the package root (config/act.yaml)
    source: str  # the module that declares them
    notes: str = ''

    def help(self) -> str:
        """``EXECUTABLE --help``: what the node does and every parameter with its default,
        constraints and description."""
        lines = [f'usage: {self.executable} [-h] [--ros-args [-p NAME:=VALUE ...] '
                 '[--params-file FILE] [-r FROM:=TO ...]]', '', *textwrap.wrap(self.summary, 88)]
        if self.notes:
            lines += ['', *textwrap.wrap(self.notes, 88)]
        lines += ['', 'parameters (-p NAME:=VALUE, or --params-file FILE; every one with '
                  f'comments in {self.path}):']
        for spec in self.specs():
            kind = spec.type_.name.lower() if spec.default is None and spec.type_ else ''
            constraints = spec.constraints()
            lines.append(f'  {spec.name} (default {_default(spec)}{", " + kind if kind else ""}'
                         f'{"; " + constraints if constraints else ""})')
            lines += textwrap.wrap(spec.description, 88, initial_indent=' ' * 6,
                                   subsequent_indent=' ' * 6)
        return '\n'.join(lines)

    def yaml(self) -> str:
        """The parameters file: every parameter with its description and constraints as a
        comment, then its default; one whose default may be unset (``type_``) commented out."""
        out = [*_comment('', f'Parameters of {self.executable}: {self.summary} {self.notes}'), '#',
               *_comment('', f'Written by `act-ros report` from the declarations in '
                         f'{self.source} (edit those, then run it). Read-only parameters shape '
                         'the node: set them here or on the command line, not at run time. The '
                         f'key "/**/{self.executable}" matches the node in any namespace.'),
               f'/**/{self.executable}:', '  ros__parameters:']
        mappings: list[str] = []
        for spec in self.specs():
            *path, name = spec.name.split('.')
            same = next((i for i, (a, b) in enumerate(zip(mappings, path)) if a != b),
                        min(len(mappings), len(path)))
            mappings = path
            if spec.section:
                out += ['', f'    # --- {spec.section} '.ljust(92, '-')]
            out += [f"    {'  ' * i}{key}:" for i, key in enumerate(path) if i >= same]
            pad = '    ' + '  ' * len(path)
            constraints = spec.constraints()
            out += _comment(pad, spec.description + (f' ({constraints})' if constraints else ''))
            value = (format_parameter_value(spec.default) if spec.default is not None
                     else f'  # not set ({spec.type_.name.lower()})')
            out.append(f"{pad}{'# ' if spec.type_ else ''}{name}: {value}".rstrip())
        return '\n'.join(out) + '\n'

    def table(self) -> str:
        """The markdown table of every parameter: name, default, constraints, read-only,
        description."""
        rows = ['| parameter | default | range or choices | read-only | description |',
                '|---|---|---|---|---|']
        for spec in self.specs():
            constraints = spec.constraints().removesuffix('read-only').rstrip('; ')
            default = 'not set' if spec.default is None else f'`{_default(spec)}`'
            cells = [f'`{spec.name}`', default, constraints,
                     'yes' if spec.read_only else '', re.sub(r'([<*])', r'\\\1', spec.description)]
            rows.append('| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |')
        return '\n'.join(rows) + '\n'


def _default(spec: ParamSpec) -> str:
    return 'not set' if spec.default is None else format_parameter_value(spec.default)


def _comment(pad: str, text: str) -> list[str]:
    return textwrap.wrap(text, 92, initial_indent=pad + '# ', subsequent_indent=pad + '# ',
                         break_on_hyphens=False)


def declare_parameters(node: Node, specs: Sequence[ParamSpec]) -> list[str]:
    """Declare ``specs`` on ``node``; return one message per override that was refused.

    An override of the wrong type or out of range leaves the default in place; an integer
    given for a floating-point parameter is accepted as a float.
    """
    errors = []
    overrides = node._parameter_overrides
    for spec in specs:
        if node.has_parameter(spec.name):
            continue
        value = spec.default if spec.default is not None else spec.type_
        try:
            node.declare_parameter(spec.name, value, spec.descriptor())
            continue
        except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
            given = overrides[spec.name].value if spec.name in overrides else None
            problem = _override_problem(spec, given, exc)
        if problem is None:  # int given for a float: retry with the converted value
            node.declare_parameter(spec.name, _as_float(given), spec.descriptor(),
                                   ignore_override=True)
        else:
            node.declare_parameter(spec.name, value, spec.descriptor(), ignore_override=True)
            errors.append(problem)
    return errors


def _as_float(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return float(value)


def _override_problem(spec: ParamSpec, given: Any, exc: Exception) -> str | None:
    """Describe a refused override, or ``None`` when it is an int for a float (converted)."""
    is_float = isinstance(spec.default, float) or spec.type_ in (
        Parameter.Type.DOUBLE, Parameter.Type.DOUBLE_ARRAY) or (
        isinstance(spec.default, list) and spec.default and isinstance(spec.default[0], float))
    numbers = given if isinstance(given, (list, tuple)) else [given]
    if is_float and numbers and all(isinstance(v, int) and not isinstance(v, bool)
                                    for v in numbers):
        converted = _as_float(given)
        if spec.low is None or spec.low <= converted <= spec.high:
            return None
        return f'{spec.name}: {given!r} is out of range [{spec.low}, {spec.high}]'
    if isinstance(exc, InvalidParameterValueException) and spec.low is not None:
        return f'{spec.name}: {given!r} is out of range [{spec.low}, {spec.high}]'
    expected = type(spec.default).__name__ if spec.default is not None else spec.type_.name
    return f'{spec.name}: {given!r} has the wrong type (expected {expected})'


def get_value(node: Node, name: str) -> Any:
    """Return a parameter's value, ``None`` when it was declared without a value."""
    try:
        return node.get_parameter(name).value
    except ParameterUninitializedException:
        return None


@dataclass(frozen=True)
class NodeSettings:
    """Validated node configuration (everything :func:`read_settings` checked)."""

    # The policy runtime's settings (model_path to inference_nice), checked by RuntimeConfig.
    runtime: RuntimeConfig
    control_rate_hz: float
    trigger: str
    sync_tolerance_s: float
    max_obs_age_s: float
    diagnostics_period_s: float
    joint_states_topic: str
    image_transport: str
    camera_topics: dict[str, str]
    command_type: str
    command_topic: str
    joint_names: tuple[str, ...]
    joint_lower: tuple[float, ...]
    joint_upper: tuple[float, ...]
    # Per joint, per second, and where each came from (act_ros.core.control.speed_limits).
    speed_limits: SpeedLimits
    gate: dict[str, Any] = field(default_factory=dict)
    pad_source: str = 'parameter'
    pad_position_m: tuple[float, ...] = (0.0, 0.0, 0.0)
    pad_pose_topic: str = 'pad_pose'
    ee_source: str = 'fk'
    ee_pose_topic: str = 'ee_pose'
    urdf_path: str = ''
    ee_frame: str = ''
    model_only_calls: int = 0
    visualization_enabled: bool = True
    visualization_rate_hz: float = 5.0
    visualization_frame_id: str = 'base_link'
    # The frame every pose input must be in (pose_frame_id, or visualization.frame_id).
    pose_frame_id: str = 'base_link'
    # Object -> PoseStamped topic (act_ros.core.object_state.OBJECTS), for a checkpoint that
    # takes observation.environment_state.
    object_pose_topics: dict[str, str] = field(
        default_factory=lambda: {obj: f'{obj}_pose' for obj in OBJECTS})
    seam_window_s: float = 60.0  # 0: since configure
    command_trajectory: str = 'point'
    command_stream_rate_hz: float = 0.0

    @property
    def seam_window_ticks(self) -> int | None:
        """Ticks of the seam meter's window (``None``: since configure)."""
        if self.seam_window_s <= 0:
            return None
        return max(8, int(round(self.seam_window_s * self.control_rate_hz)))

    @property
    def period_s(self) -> float:
        return 1.0 / self.control_rate_hz

    @property
    def safety(self) -> SafetySettings:
        """The control step's limits (the largest step per tick at this control period),
        release gate, end-effector and pad sources
        (:func:`~act_ros.core.control.loop.build_control_loop`)."""
        return SafetySettings(
            limits=SafetyLimits(lower=np.array(self.joint_lower), upper=np.array(self.joint_upper),
                                max_step=self.speed_limits.per_tick(self.period_s)),
            gate=ReleaseGateConfig(**self.gate), urdf_path=self.urdf_path,
            ee_frame=self.ee_frame, max_obs_age_s=self.max_obs_age_s, ee_source=self.ee_source,
            pad_position_m=None if self.pad_source == 'topic' else self.pad_position_m)


def read_settings(node: Node, specs: Sequence[ParamSpec], contract: Contract) -> NodeSettings:
    """Read and validate every parameter; raise ``ValueError`` with one line on a problem."""
    v = {spec.name: get_value(node, spec.name) for spec in specs}
    for spec in specs:
        if spec.choices and v[spec.name] not in spec.choices:
            raise ValueError(f"{spec.name}: '{v[spec.name]}' is not one of {list(spec.choices)}")
    if not v['model_path']:
        raise ValueError('model_path is not set: pass -p model_path:=<checkpoint directory '
                         'or Hub id org/name[@revision]>')
    if not DEVICE_PATTERN.match(v['device']):
        raise ValueError(f"device: unknown device '{v['device']}' "
                         '(expected auto, cpu, cuda, cuda:N or mps)')
    n = contract.num_joints
    names = tuple(v['joint_names'] or ())
    if len(names) != n or len(set(names)) != n or not all(names):
        raise ValueError(f'joint_names: expected {n} distinct names (contract order '
                         f'{list(contract.joint_names)}), got {list(names)}')
    lower, upper = tuple(v['joint_lower'] or ()), tuple(v['joint_upper'] or ())
    for key, values in (('joint_lower', lower), ('joint_upper', upper)):
        if len(values) != n or not all(math.isfinite(x) for x in values):
            raise ValueError(f'{key}: expected {n} finite values, got {list(values)}')
    bad = [names[i] for i in range(n) if not lower[i] < upper[i]]
    if bad:
        raise ValueError(f'joint_lower must be below joint_upper; not so for {bad}')
    if v['ee_frame'] and len(contract.grippers) > 1:
        raise ValueError(f"ee_frame: '{v['ee_frame']}' names one end effector; the contract has "
                         f'{len(contract.grippers)} grippers {list(contract.gripper_joints)} '
                         '(leave ee_frame empty and give each gripper its ee_frame in the '
                         'contract)')
    pad = tuple(float(x) for x in v['pad_position_m'])
    if len(pad) != 3 or not all(math.isfinite(x) for x in pad):
        raise ValueError(f'pad_position_m: expected 3 finite values (x, y, z), got {list(pad)}')
    command_topic = v['command_topic'] or DEFAULT_COMMAND_TOPICS[v['command_type']]
    topics = {cam.name: v[camera_topic_param(cam.name)] for cam in contract.cameras}
    if v['image_transport'] == 'compressed':
        topics = {name: topic.rstrip('/') + '/compressed' for name, topic in topics.items()}
    pose_topics = {obj: v[object_pose_topic_param(obj)] for obj in OBJECTS}
    for key, topic in [('joint_states_topic', v['joint_states_topic']),
                       ('command_topic', command_topic), *topics.items(),
                       *((object_pose_topic_param(o), t) for o, t in pose_topics.items())]:
        if not topic:
            raise ValueError(f'{key}: topic name is empty')
    gate = {key.split('.', 1)[1]: v[key] for key in v if key.startswith('release_gate.')}
    # 0 (the default) takes the contract's rate; any other value below 1 Hz is a mistake.
    rate = v['control_rate_hz'] or float(contract.fps)
    if rate < 1.0:
        raise ValueError(f'control_rate_hz: expected 0 (the contract fps, {contract.fps}) or '
                         f"1 to 1000 Hz, got {v['control_rate_hz']:g}")
    blend_ticks = blend_window_ticks(v['blend_window'], rate)
    speed_limits = resolve_speed_limits(
        names, contract.lower, contract.upper, grippers=contract.gripper_indices,
        velocity=v['max_joint_velocity'], step_per_tick=v['max_joint_step'],
        period_s=1.0 / rate, urdf_path=v['urdf_path'] or contract.urdf_path)
    if v['command_trajectory'] == 'chunk' and v['command_type'] != 'JointTrajectory':
        raise ValueError('command_trajectory: chunk sends a multi-point JointTrajectory; '
                         f"command_type is {v['command_type']} (use command_stream_rate_hz "
                         'for an interpolated Float64MultiArray stream)')
    stream = v['command_stream_rate_hz']
    if stream > 0 and v['command_type'] != 'Float64MultiArray':
        raise ValueError('command_stream_rate_hz applies to command_type Float64MultiArray; '
                         f"command_type is {v['command_type']} (use command_trajectory: chunk)")
    if 0 < stream <= rate:
        raise ValueError(f'command_stream_rate_hz ({stream:g}) must be above control_rate_hz '
                         f'({rate:g}), or 0 for one command per tick')
    if not v['visualization.frame_id']:
        raise ValueError('visualization.frame_id: frame name is empty')
    runtime = RuntimeConfig(
        model_path=v['model_path'], device=v['device'], mode=v['mode'],
        execution=v['execution'], n_action_steps=v['n_action_steps'] or None,
        ensemble_coeff=v['ensemble_coeff'], blend_ticks=blend_ticks,
        compile_model=v['compile_model'], compile_mode=v['compile_mode'],
        precision=v['precision'], precision_tolerance=v['precision_tolerance'],
        backend=v['backend'], contract=contract, warmup=v['warmup'],
        torch_threads=v['torch_threads'] or None, inference_timeout_s=v['inference_timeout_s'],
        inference_nice=v['inference_nice'], precision_check_live=True)
    return NodeSettings(
        runtime=runtime, control_rate_hz=rate,
        trigger=v['trigger'], sync_tolerance_s=v['sync_tolerance_s'],
        max_obs_age_s=v['max_obs_age_s'], diagnostics_period_s=v['diagnostics_period_s'],
        joint_states_topic=v['joint_states_topic'], image_transport=v['image_transport'],
        camera_topics=topics, command_type=v['command_type'], command_topic=command_topic,
        joint_names=names, joint_lower=lower, joint_upper=upper, speed_limits=speed_limits,
        gate=gate, pad_source=v['pad_source'], pad_position_m=pad,
        pad_pose_topic=v['pad_pose_topic'], ee_source=v['ee_source'],
        ee_pose_topic=v['ee_pose_topic'], urdf_path=v['urdf_path'], ee_frame=v['ee_frame'],
        model_only_calls=v['model_only_calls'],
        object_pose_topics=pose_topics,
        visualization_enabled=v['visualization.enabled'],
        visualization_rate_hz=v['visualization.rate_hz'],
        visualization_frame_id=v['visualization.frame_id'],
        pose_frame_id=v['pose_frame_id'] or v['visualization.frame_id'],
        seam_window_s=v['seams.window_s'], command_trajectory=v['command_trajectory'],
        command_stream_rate_hz=stream)
