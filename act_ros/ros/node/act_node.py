"""``act_node``: the ROS 2 lifecycle node that runs an ACT policy on a robot arm.

A thin adapter over :mod:`act_ros.core`:

- configure: read and validate the parameters (:mod:`act_ros.ros.node.parameters`), load and
  warm up the checkpoint through :class:`~act_ros.core.inference.runtime.PolicyRuntime` (a Hub id
  ``org/name[@revision]`` from the ``huggingface_hub`` cache, :mod:`act_ros.core.inference.hub`; the
  configured line and ``/diagnostics`` name its commit), create the
  subscriptions, publishers and the ``~/reset`` service, measure the model's latency and
  log the real-time verdict. With ``execution: process`` the inference child is started
  first and loads the model while the node creates its interfaces (this process never
  imports torch for it). Any problem fails the transition with one log line.
- activate: reset the runtime and the release gate, start the control tick.
- deactivate: stop the tick at once; nothing is published while not active.

What the policy plans (``visualization.enabled``, default on): ``~/planned_path`` and
``~/markers`` for RViz, built at a low rate off the control tick
(:mod:`act_ros.ros.node.visualization`).

Threads: input callbacks (their own callback group) only convert and store the latest
message; the control tick runs in another group, and in ``async`` execution the model
runs on the runtime's worker thread (``process``: in a child process), so neither ever
blocks message handling. :func:`main` spins it on the executor named by the ``executor``
parameter (by default single-threaded, multi-threaded for ``sync`` execution).

Start-up is timed from the start of the process (:mod:`act_ros.core.startup`): at the
first command the node logs one line with the time to it and its phases (import, node,
child start, model import, checkpoint load, backend build, warm-up, latency measurement,
activation, first chunk), also on ``/diagnostics`` as ``startup.*``.

Usage: ``act_node --ros-args --params-file config/act.yaml -p model_path:=<checkpoint>``
(a directory or a Hub id).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import Executor, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from std_srvs.srv import Trigger

from act_ros.core.contract import Contract, load_contract
from act_ros.core.control.inputs import InputStore
from act_ros.core.control.loop import (
    CHUNKS_LATE,
    WAITING_FOR_CHUNK,
    ControlCounters,
    ControlLoop,
    build_control_loop,
    environment_state_from_object_poses,
)
from act_ros.core.errors import ActRosError, PrecisionRefusedError
from act_ros.core.inference.precision import SAVED_CHECK_OBSERVATIONS
from act_ros.core.object_state import OBJECTS
from act_ros.core.observation import Observation
from act_ros.core.startup import StartupTimeline
from act_ros.ros import conversions as conv
from act_ros.ros.node.command_stream import CommandSender
from act_ros.ros.node.interfaces import Interfaces, create_interfaces
from act_ros.ros.node.parameters import (
    CONTRACT_PATH,
    EXECUTORS,
    NodeSettings,
    ParameterFile,
    ParamSpec,
    declare_parameters,
    parameter_specs,
    read_settings,
)
from act_ros.ros.node.status import NodeStatus
from act_ros.ros.spin import PoolExecutor

LOG_THROTTLE_S = 2.0
# While a precision check waits for live observations: how often one is sampled.
CHECK_SAMPLE_PERIOD_S = 0.25


class ActNode(LifecycleNode):
    """Lifecycle node: camera images + joint states in, safe joint position commands out."""

    def __init__(self, node_name: str = 'act_node', **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        self.contract, contract_error = _try_load_contract(self)
        self.specs = parameter_specs(self.contract)
        self._parameter_errors = declare_parameters(self, self.specs)
        if contract_error:
            self._parameter_errors.insert(0, contract_error)
        self.input_group = MutuallyExclusiveCallbackGroup()
        self.control_group = MutuallyExclusiveCallbackGroup()
        self.status_group = MutuallyExclusiveCallbackGroup()
        self.visualization_group = MutuallyExclusiveCallbackGroup()
        self.stream_group = MutuallyExclusiveCallbackGroup()
        self.lock = threading.RLock()
        self._active = False
        self.settings: NodeSettings | None = None
        self.inputs: InputStore | None = None
        self.loop: ControlLoop | None = None
        self.verdict = None  # act_ros.core.inference.feasibility.Verdict, measured at configure
        self.io: Interfaces | None = None
        self.sender: CommandSender | None = None
        self.counters = ControlCounters()
        self.status = NodeStatus(self)
        self.last_configure_error = ''
        self._error_pub: Any = None  # /diagnostics for a failed configure (created on one)
        # The one warning of the last configure about features off for want of a robot
        # model of this arm (the release gate, the planned path); empty when none.
        self.robot_model_warning = ''
        # From the process start to the first command (frozen once it is published).
        self.startup = StartupTimeline()
        self.startup.mark('imported', _IMPORTED_AT)
        self.startup.mark('node_created')
        self._streams_seen: set[str] = set()  # until every input has arrived once
        # A precision check left pending at configure (no saved observations beside the
        # checkpoint): live observations sampled while inactive, checked at activation.
        self._check_samples: deque[Observation] = deque(maxlen=SAVED_CHECK_OBSERVATIONS)
        self._check_timer: Any = None

    @property
    def autostart(self) -> bool:
        return bool(self.get_parameter('autostart').value)

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def lifecycle_state(self) -> str:
        """Label of the current lifecycle state ('unconfigured', 'inactive', 'active', ...)."""
        return self._state_machine.current_state[1]

    # ---------------------------------------------------------------- lifecycle

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:
            try:
                self._configure()
            except (ValueError, ActRosError, OSError, ImportError) as exc:
                return self._configure_failed(str(exc), getattr(exc, 'values', None))
            except Exception as exc:  # noqa: BLE001 - rclpy would swallow it without a word
                return self._configure_failed(f'{type(exc).__name__}: {exc}')
            if not self.startup.complete:
                self.startup.mark('configured')
        s = self.settings
        if s.trigger == 'timer' and abs(s.control_rate_hz - self.contract.fps) > 1e-6:
            self.get_logger().warning(
                f'control_rate_hz {s.control_rate_hz:g} differs from the contract fps '
                f'{self.contract.fps}: the policy was trained for {self.contract.fps} Hz')
        runtime = self.loop.runtime
        inputs = ', '.join(runtime.cameras) or 'no camera'
        if runtime.environment_state_dim:
            inputs += ', object poses on ' + ', '.join(
                self.resolve_topic_name(s.object_pose_topics[obj]) for obj in OBJECTS)
        gate_poses = [self.resolve_topic_name(topic) for topic, used in (
            (s.pad_pose_topic, s.pad_source == 'topic'), (s.ee_pose_topic, s.ee_source == 'topic'))
            if used]
        if gate_poses:
            inputs += ', gate poses on ' + ', '.join(gate_poses)
        if runtime.environment_state_dim or gate_poses:
            inputs += f" (poses in frame '{s.pose_frame_id}' only)"
        r = s.runtime
        mode = r.mode + (f' ({r.blend_ticks}-tick crossfade)' if r.mode == 'blend' else '')
        command = s.command_type
        if self.sender.trajectory:
            command += ' (the rest of the chunk, every tick)'
        elif self.sender.streaming:
            command += f' (interpolated at {s.command_stream_rate_hz:g} Hz)'
        self.get_logger().info(
            f'configured: model {runtime.source.describe()} on {runtime.device}, mode {mode}/'
            f'{r.execution}{self._played(runtime)}, {s.trigger} trigger at '
            f'{s.control_rate_hz:g} Hz, '
            f'{command} on {self.resolve_topic_name(s.command_topic)}; inputs: joints, '
            f'{inputs}')
        return super().on_configure(state)

    @staticmethod
    def _played(runtime: Any) -> str:
        """What is played of each chunk, and whose setting that is, for the configured line."""
        if runtime.config.mode == 'ensemble':
            return f' ({runtime.chunk_size}-action chunks)'
        whose = 'set' if runtime.config.n_action_steps else "the checkpoint's n_action_steps"
        return f' ({runtime.stride} of each {runtime.chunk_size}-action chunk played, {whose})'

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:
            refused = self._settle_precision()
            if refused:
                return refused
            self.loop.reset()
            self.status.reset_rates()
            self._active = True
            if not self.startup.complete:
                self.startup.mark('activated')
            if self.io.control_timer is not None:
                self.io.control_timer.reset()
        self.get_logger().info('active: commanding')
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:  # waits for a tick in progress, so none follows this transition
            if self.sender is not None:
                self.sender.hold()  # a controller playing a plan stops where the arm is
            self._active = False
            if self.io.control_timer is not None:
                self.io.control_timer.cancel()  # cancelled, not destroyed: safe while spinning
        self.get_logger().info('inactive: commands stopped')
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:
            self._teardown()
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:
            self._active = False
            self._teardown()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:
            self._active = False
            self._teardown()
        return TransitionCallbackReturn.SUCCESS

    def start(self) -> bool:
        """Configure and activate (the ``autostart`` path); ``False`` if either fails."""
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            return False
        return self.trigger_activate() == TransitionCallbackReturn.SUCCESS

    def destroy_node(self) -> None:
        with self.lock:
            self._active = False
            self._teardown()
        super().destroy_node()

    def _configure(self) -> None:
        if not self.startup.complete:  # a configure tried again times its own start-up
            self.startup.forget_from('configure_started')
            self.startup.mark('configure_started')
            self._streams_seen = set()
        if self._parameter_errors:
            raise ValueError('; '.join(self._parameter_errors))
        settings = read_settings(self, self.specs, self.contract)
        if settings.speed_limits.deprecation:
            self.get_logger().warning(settings.speed_limits.deprecation)
        self.get_logger().info(settings.speed_limits.line(settings.period_s))
        self.counters = ControlCounters()
        self.settings = settings
        # execution 'process': this starts the inference child and returns; the model
        # loads there while the interfaces are created (and discovery with the robot runs).
        gate_off: list[str] = []
        self.loop = build_control_loop(
            settings.runtime, self.contract, settings.safety,
            environment_state=environment_state_from_object_poses(), period_s=settings.period_s,
            joint_names=settings.joint_names, seam_window_ticks=settings.seam_window_ticks,
            counters=self.counters, gate_off=gate_off.append, wait=False)
        if self.loop.gates:  # what tells the gate that closed fingers hold nothing
            self.get_logger().info(self.loop.gates[0].gate.config.evidence())
        runtime = self.loop.runtime
        # The checkpoint's inputs (read from its JSON): its cameras, and the object poses
        # when it takes observation.environment_state.
        self.inputs = InputStore(self.loop.required_inputs, settings.max_obs_age_s)
        setup_start = time.monotonic()
        self.io = create_interfaces(self, settings, self.contract, cameras=runtime.cameras,
                                    object_poses=bool(runtime.environment_state_dim))
        self.sender = CommandSender(settings, self.io.command_pub.publish, self.now_s)
        self.robot_model_warning = _robot_model_warning(
            gate_off[0] if gate_off else '',
            self.io.visualizer.fk_error if self.io.visualizer is not None else '')
        if self.robot_model_warning:
            self.get_logger().warning(self.robot_model_warning)
        if settings.runtime.execution == 'process':
            self.startup.add_overlapped('node_setup', time.monotonic() - setup_start)
        runtime.wait_ready()
        self.get_logger().info(f'backend: {runtime.config.backend} ({runtime.config.backend_why})')
        check = runtime.precision_check
        if check is not None and check.warning:  # fell back to fp32, or int8 over the tolerance
            self.get_logger().warning(check.line())
        elif check is not None:
            self.get_logger().info(check.line())
        if check is not None and check.pending:
            self._check_timer = self.create_timer(CHECK_SAMPLE_PERIOD_S, self._sample_for_check,
                                                  callback_group=self.status_group)
        self.verdict = None
        if settings.trigger == 'timer':
            # Measured here, on this machine: can this configuration hold its rate?
            self.verdict = self.loop.runtime.feasibility(settings.control_rate_hz)
            if self.verdict.feasible:
                self.get_logger().info(f'real time: {self.verdict.line()}')
            else:
                self.get_logger().warning(f'real time: {self.verdict.line()}')
        if settings.model_only_calls:
            seconds = runtime.measure_model_only(settings.model_only_calls)
            self.get_logger().info(f'model alone: {1e3 * float(np.median(seconds)):.0f} ms '
                                   f'median of {len(seconds)} calls')
        if not self.startup.complete:
            self.startup.merge(runtime.startup_events)
            self.startup.notes['backend_cache'] = runtime.stats.backend_cache
            if settings.runtime.execution == 'process':
                self.startup.notes['inference_child'] = (
                    'lean (ONNX export, no torch)' if runtime.lean_child else 'torch + LeRobot')

    def _sample_for_check(self) -> None:
        """While inactive with a pending precision check: keep the newest distinct live
        observations (a timer of its own, cancelled at activation)."""
        with self.lock:
            if self._active or self.loop is None or self.inputs is None:
                return
            snap = self.inputs.snapshot(self.now_s())
            if not snap.ok:
                return
            obs, _, _ = self.loop.observation(snap)
            samples = self._check_samples
            if obs is not None and (not samples or samples[-1].stamp_s != obs.stamp_s):
                samples.append(obs)

    def _settle_precision(self) -> TransitionCallbackReturn | None:
        """(lock held, at activation) Run a precision check left pending at configure on
        the live observations seen since (synthetic ones, with a warning, when none came);
        ``FAILURE`` when a precision set by name drifts on them."""
        runtime = self.loop.runtime
        if runtime.precision_check is None or not runtime.precision_check.pending:
            return None
        if self._check_timer is not None:
            self._check_timer.cancel()
        self._sample_for_check()
        samples, self._check_samples = list(self._check_samples), deque(
            maxlen=SAVED_CHECK_OBSERVATIONS)
        try:
            check = runtime.settle_precision(samples)
        except PrecisionRefusedError as exc:
            reason = str(exc)
            self.get_logger().error(f'activate refused: {reason}')
            self._publish_error('activate refused', reason, getattr(exc, 'values', {}))
            return TransitionCallbackReturn.FAILURE
        if check.warning:  # no live observation came: synthetic ones, or auto fell back
            self.get_logger().warning(check.line())
        else:
            self.get_logger().info(check.line())
        return None

    def _configure_failed(self, reason: str,
                          values: dict[str, Any] | None = None) -> TransitionCallbackReturn:
        self.last_configure_error = reason
        self.get_logger().error(f'configure failed: {reason}')
        self._teardown()
        self._publish_error('configure failed', reason, values or {})
        return TransitionCallbackReturn.FAILURE

    def _publish_error(self, what: str, reason: str, values: dict[str, Any]) -> None:
        """One ERROR message on /diagnostics saying why configure failed or activation was
        refused (with its figures: a refused precision's check), for monitors that do not
        read the log. The node publishes nothing else there until it is active."""
        from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

        from act_ros.ros.diagnostics import diagnostic_array
        from act_ros.ros.node.interfaces import DIAGNOSTICS_QOS, DIAGNOSTICS_TOPIC

        if self._error_pub is None:
            self._error_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC,
                                                    DIAGNOSTICS_QOS)
        self._error_pub.publish(diagnostic_array(
            name=f'{self.get_name()}: policy', hardware_id=self.get_fully_qualified_name(),
            level=DiagnosticStatus.ERROR, message=f'{what}: {reason}',
            values={'configure_error' if what.startswith('configure') else 'activate_error':
                    reason, **values},
            stamp=self.get_clock().now().to_msg()))

    def _teardown(self) -> None:
        self.sender = None
        if self._check_timer is not None:
            self.destroy_timer(self._check_timer)
            self._check_timer = None
        self._check_samples.clear()
        if self.io is not None:
            self.io.destroy(self)
            self.io = None
        if self.loop is not None:
            self.loop.runtime.close()
            self.loop = None
        if self.inputs is not None:
            self.inputs.clear()

    # ----------------------------------------------------------- input callbacks

    def now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def store(self, stream: str, msg: Any, convert: Any) -> None:
        """Convert ``msg`` and store it as the latest of ``stream``; reject it on error."""
        inputs = self.inputs
        if inputs is None:
            return
        try:
            value = convert(msg)
        except conv.MalformedMessageError as exc:
            line = inputs.reject(stream, str(exc))
            self.get_logger().error(f'rejected message: {line}',
                                    throttle_duration_sec=LOG_THROTTLE_S)
            return
        stamp = msg.header.stamp
        inputs.put(stream, value, self.now_s(), stamp.sec + stamp.nanosec * 1e-9)
        if not self.startup.complete and stream not in self._streams_seen:
            self._streams_seen.add(stream)
            if self._streams_seen.issuperset(inputs.required):
                # Not a phase (it may come before activation): when discovery had done.
                self.startup.notes['inputs_complete_at_s'] = round(
                    time.monotonic() - self.startup.origin, 3)
        if self.settings.trigger == 'observation' and self.io is not None \
                and inputs.take_synchronized(self.settings.sync_tolerance_s, consume=False):
            self.io.observation_ready.trigger()  # the tick takes the set (see tick())

    # --------------------------------------------------------------- control tick

    def tick(self) -> None:
        """One control period: read the latest inputs, act, publish a safe command.

        With the observation trigger, exactly one tick per synchronized set of inputs: an
        executor may run a guard condition's callback more than once for one trigger (seen
        in lock-step: a second command for the same observation advanced the chunk by one
        action), so each call takes the new synchronized set or does nothing.
        """
        with self.lock:
            if not self._active or self.loop is None:
                return
            if self.settings.trigger == 'observation' and not self.inputs.take_synchronized(
                    self.settings.sync_tolerance_s):
                self.counters.spurious_triggers += 1
                return
            snap = self.inputs.snapshot(self.now_s())
            was_stale = self.loop.stale
            result = self.loop.tick(snap)
            if result.command is None:
                self.sender.hold()
                if not snap.ok:  # each input named with its topic and QoS
                    problems = snap.describe_problems(self.io.input_sources)
                    self.get_logger().warning(f'no command, inputs unusable: {problems}',
                                              throttle_duration_sec=LOG_THROTTLE_S)
                elif result.reason.startswith(CHUNKS_LATE):  # the verdict at configure said
                    self.get_logger().warning(f'no command: {result.reason}',
                                              throttle_duration_sec=LOG_THROTTLE_S)
                elif result.reason != WAITING_FOR_CHUNK:
                    self.get_logger().error(f'no command: {result.reason}',
                                            throttle_duration_sec=LOG_THROTTLE_S)
                return
            if was_stale:
                self.get_logger().info('inputs fresh again: runtime reset, commanding')
            self._publish(result.command)
            self.status.on_command(result.obs_stamp_s)
            if not self.startup.complete:
                self._first_command()

    def _first_command(self) -> None:
        """Close the start-up timeline at the first published command and log it."""
        self.startup.merge(self.loop.runtime.startup_events)  # first request, first chunk
        self.startup.mark('first_command')
        self.get_logger().info(f'start-up: {self.startup.line()}')

    def _publish(self, command: np.ndarray) -> None:
        self.sender.send(self.loop, command)
        self.counters.commands_published += 1

    def stream_tick(self) -> None:
        """command_stream_rate_hz: the interpolated samples between ticks."""
        if self._active and self.sender is not None:
            self.sender.stream_tick()

    def handle_seams(self, request: Trigger.Request,
                     response: Trigger.Response) -> Trigger.Response:
        """``~/seams``: the seam figures of the commands sent (``seams.window_s``), as JSON
        (:meth:`act_ros.core.control.seams.SeamSamples.summary`)."""
        with self.lock:
            if self.loop is None or self.loop.seams is None:
                response.success, response.message = False, 'not configured'
                return response
            summary = self.loop.seams.summary()
        response.success, response.message = True, json.dumps(summary)
        return response

    def handle_reset(self, request: Trigger.Request,
                     response: Trigger.Response) -> Trigger.Response:
        """``~/reset``: new episode (queue, ensembler, gate)."""
        with self.lock:
            if self.loop is None:
                response.success, response.message = False, 'not configured'
                return response
            self.loop.reset()
        response.success, response.message = True, 'episode reset: queue, ensembler and gate'
        self.get_logger().info(response.message)
        return response


def _robot_model_warning(gate_why: str, path_why: str) -> str:
    """One line for every feature that turned itself off for want of a robot model of the
    arm (the release gate, the planned path), with why; empty when none did."""
    off = [(name, why) for name, why in (('release gate', gate_why),
                                         ('planned path', path_why)) if why]
    if not off:
        return ''
    if len({why for _, why in off}) == 1:
        return f"{' and '.join(name for name, _ in off)} off: {off[0][1]}"
    return '; '.join(f'{name} off: {why}' for name, why in off)


def _try_load_contract(node: LifecycleNode) -> tuple[Contract | None, str]:
    """Load the contract named by ``contract_path`` (declared here, read-only)."""
    errors = declare_parameters(node, [CONTRACT_PATH])
    path = node.get_parameter('contract_path').value or None
    try:
        return load_contract(path), '; '.join(errors)
    except (OSError, ValueError, KeyError) as exc:
        return None, f'contract_path: {exc}'


def executor_kind(kind: str, execution: str) -> str:
    """Resolve the ``executor`` parameter: ``auto`` is multi-threaded only for ``sync``
    execution (the tick runs the model, inputs must keep arriving meanwhile)."""
    if kind == 'auto':
        return 'multi_threaded' if execution == 'sync' else 'single_threaded'
    return kind


def make_executor(kind: str, context: Any = None) -> Executor:
    """A ``multi_threaded`` or ``single_threaded`` executor."""
    if kind == 'multi_threaded':
        return PoolExecutor(4, context=context)
    if kind == 'single_threaded':
        return SingleThreadedExecutor(context=context)
    raise ValueError(f"executor must be one of {EXECUTORS}, got '{kind}'")


def main(args: list[str] | None = None) -> int:
    """Console script ``act_node``: run the node until interrupted."""
    from act_ros.ros.spin import run_node

    def executor(node: ActNode) -> Executor:
        kind = executor_kind(node.get_parameter('executor').value,
                             node.get_parameter('execution').value)
        node.get_logger().info(f'spinning on a {kind} executor')
        return make_executor(kind)

    def start(node: ActNode, _executor: Executor) -> int | None:
        if node.autostart and not node.start():
            node.get_logger().fatal('autostart failed; exiting (see the error above)')
            return 1
        return None

    # No executor shutdown: destroy_node stops the runtime, which a running tick may wait on.
    return run_node(ActNode, name='act_node', args=args, executor=executor, start=start,
                    shutdown_timeout_s=None, help_text=PARAMETERS.help)


def parameter_declarations() -> list[ParamSpec]:
    """The node's parameters as ``--help`` lists them: joint and camera defaults from the
    package contract."""
    return parameter_specs(load_contract())


PARAMETERS = ParameterFile(
    'act_node', 'The ROS 2 lifecycle node that runs an ACT policy on a robot arm: camera '
    'images and joint states in, joint position commands out.', parameter_declarations,
    'config/act.yaml', 'act_ros/ros/node/parameters.py',
    notes='Example: act_node --ros-args --params-file config/act.yaml -p '
    'model_path:=<checkpoint directory or Hub id>. Joint and camera defaults come from '
    'the contract (contract_path). Units are in the names (_m, _s, _hz). Parameters that '
    'are not read-only are read at configure (cleanup + configure applies a change).')


# The node module and everything it needs are imported: the end of the 'import' phase.
_IMPORTED_AT = time.monotonic()

if __name__ == '__main__':
    sys.exit(main())
