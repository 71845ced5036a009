"""The evaluation driver's own ROS 2 node: lifecycle state, seeded resets, episode status.

Spun by hand in the calling thread (no executor thread), so the driver process has no
extra Python threads when it starts children. Every wait also calls ``check`` (the child
process watchdog) and fails with :class:`EvalError` on a timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import rclpy
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rcl_interfaces.srv import SetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import String
from std_srvs.srv import Trigger

from act_ros.ros.sim_bridge.bridge import STATUS_QOS
from act_ros.ros.sim_bridge.messages import parse_status

BRIDGE = '/sim_bridge'
POLICY = '/act_node'


class EvalError(RuntimeError):
    """The evaluation cannot go on (a process died, a timeout, a refused request)."""


class EvalClient:
    """A node in ``domain_id`` that talks to ``/sim_bridge`` and ``/act_node``."""

    def __init__(self, domain_id: int, check: Callable[[], None] = lambda: None) -> None:
        self.context = rclpy.context.Context()
        rclpy.init(context=self.context, domain_id=domain_id,
                   signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node('ros_eval', context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.check = check
        self.status: dict[str, Any] | None = None
        self.node.create_subscription(String, f'{BRIDGE}/episode_status', self._on_status,
                                      STATUS_QOS)
        self.reset = self.node.create_client(Trigger, f'{BRIDGE}/reset')
        self.set_parameters = self.node.create_client(SetParameters, f'{BRIDGE}/set_parameters')
        self.policy_state = self.node.create_client(GetState, f'{POLICY}/get_state')
        self.policy_change = self.node.create_client(ChangeState, f'{POLICY}/change_state')
        self.policy_parameters = self.node.create_client(SetParameters,
                                                         f'{POLICY}/set_parameters')
        self.policy_seams = self.node.create_client(Trigger, f'{POLICY}/seams')

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)

    def _on_status(self, msg: String) -> None:
        try:
            self.status = parse_status(msg)
        except ValueError as exc:
            raise EvalError(f'unreadable episode status from {BRIDGE}: {exc}') from exc

    # ------------------------------------------------------------------ waiting
    def spin_until(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Spin until ``predicate()`` is truthy (returned); :class:`EvalError` after the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            self.check()
            if time.monotonic() > deadline:
                raise EvalError(f'timed out after {timeout_s:g} s waiting for {what}')
            self.executor.spin_once(timeout_sec=0.05)

    def spin_for(self, seconds: float) -> None:
        """Handle callbacks for ``seconds`` (and check the children)."""
        end = time.monotonic() + seconds
        self.spin_until(lambda: time.monotonic() >= end, seconds + 1.0, 'a pause')

    def call(self, client: Any, request: Any, timeout_s: float) -> Any:
        """Call a service (waiting for it to appear), within ``timeout_s`` in all."""
        deadline = time.monotonic() + timeout_s
        self.spin_until(lambda: client.service_is_ready(), timeout_s,
                        f'service {client.srv_name}')
        future = client.call_async(request)
        self.spin_until(future.done, max(deadline - time.monotonic(), 1.0),
                        f'an answer from {client.srv_name}')
        return future.result()

    # ------------------------------------------------------------------ the protocol
    def wait_policy_active(self, timeout_s: float) -> None:
        """Wait until ``/act_node`` is in the lifecycle state ``active``."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EvalError(f'{POLICY} is not active after {timeout_s:g} s')
            state = self.call(self.policy_state, GetState.Request(), remaining).current_state
            if state.id == State.PRIMARY_STATE_ACTIVE:
                return
            self.spin_for(0.3)

    def set_parameter(self, client: Any, name: str, value: Any, timeout_s: float) -> None:
        """Set one parameter of a remote node (``client``: its ``set_parameters``)."""
        request = SetParameters.Request(parameters=[
            Parameter(name, value=value).to_parameter_msg()])
        answer = self.call(client, request, timeout_s)
        if not answer.results or not answer.results[0].successful:
            reason = answer.results[0].reason if answer.results else 'no result'
            raise EvalError(f'{client.srv_name} refused {name}={value!r}: {reason}')

    def switch_policy_mode(self, mode: str, timeout_s: float) -> None:
        """Reconfigure the running ``/act_node`` for another ``mode`` (chunk, ensemble).

        Lifecycle: deactivate, cleanup, set ``mode``, configure (reloads the checkpoint),
        activate; cheaper than starting a new process.
        """
        steps = [(Transition.TRANSITION_DEACTIVATE, 'deactivate'),
                 (Transition.TRANSITION_CLEANUP, 'cleanup'), (None, 'mode'),
                 (Transition.TRANSITION_CONFIGURE, 'configure'),
                 (Transition.TRANSITION_ACTIVATE, 'activate')]
        for transition, label in steps:
            if transition is None:
                self.set_parameter(self.policy_parameters, 'mode', mode, timeout_s)
                continue
            request = ChangeState.Request(transition=Transition(id=transition))
            if not self.call(self.policy_change, request, timeout_s).success:
                raise EvalError(f'{POLICY}: lifecycle transition {label} failed while switching '
                                f'to mode {mode} (see its log)')

    def seams(self, timeout_s: float) -> dict[str, Any]:
        """The seam figures of every command ``/act_node`` sent since it was configured
        (its ``~/seams``; :meth:`act_ros.core.control.seams.SeamSamples.summary`)."""
        response = self.call(self.policy_seams, Trigger.Request(), timeout_s)
        if not response.success:
            raise EvalError(f'{POLICY}/seams failed: {response.message}')
        return json.loads(response.message)

    def run_episode(self, seed: int, lockstep_timeout_s: float,
                    startup_timeout_s: float) -> dict[str, Any]:
        """Start an episode with ``seed`` on the bridge and return its final status."""
        self.set_parameter(self.set_parameters, 'seed', int(seed), startup_timeout_s)
        previous = self.status['episode'] if self.status else -1
        response = self.call(self.reset, Trigger.Request(), startup_timeout_s * 2 + 60.0)
        if not response.success:
            raise EvalError(f'{BRIDGE}/reset failed: {response.message}')
        # A step may wait lockstep_timeout_s for a command; beyond that (and a margin for a
        # slow machine) without progress the episode is stuck.
        stall_s = 3 * lockstep_timeout_s + 60.0
        progress = {'step': -1, 'at': time.monotonic()}

        def finished() -> dict[str, Any] | None:
            status = self.status
            if status is None or status['episode'] <= previous:
                return None
            if status['step'] != progress['step']:
                progress.update(step=status['step'], at=time.monotonic())
            elif time.monotonic() - progress['at'] > stall_s:
                raise EvalError(f'episode with seed {seed} made no progress for {stall_s:g} s '
                                f'(step {status["step"]}/{status["episode_steps"]})')
            return status if status['done'] else None

        status = self.spin_until(finished, float('inf'), f'episode with seed {seed}')
        if status['seed'] != seed:
            raise EvalError(f'{BRIDGE} ran seed {status["seed"]}, expected {seed}')
        return status

