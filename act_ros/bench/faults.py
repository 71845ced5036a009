"""``act-ros bench faults``: fault injection against the real act_node over real topics.

``act_node`` runs as its own process (the console-script entry point, model in a child
process) fed by a stand-in robot in this process at 30 Hz: two cameras, joint states, the
end-effector and pad poses (``ee_source``/``pad_source: topic``). The checkpoint's gripper
request is steered by the image (dark: closed, bright: open), so the release gate can be
exercised. The faults, one after the other, each followed by a recovery check:

- inputs going stale and coming back: a camera, the joint states (no command may be
  published from stale inputs); the pad and end-effector poses (optional: commands go on,
  but nothing may be released);
- malformed messages: a NaN joint position, a wrong-size image, an unknown encoding, a
  non-finite end-effector pose (rejected; the stream counts as missing);
- timing: out-of-order and duplicated header stamps, a burst of messages, half of the
  messages dropped (commands go on);
- the inference child killed (SIGKILL) and hung (SIGSTOP): restarted by the node, which
  must also end the hung child itself (a child still there 10 s after the node commands
  again counts as leaked; only then does the benchmark kill it);
- an open-gripper request far from the pad while holding (suppressed), then near it
  (passes);
- at the end, SIGTERM (or SIGINT) to the node: it must exit, its child with it.

Recovery is measured for every fault, from the moment the fault ends (the child faults:
from the signal) until the node is back to normal:

- stream faults (inputs stale, malformed, mistimed): the first command of a run of
  ``STEADY_COMMANDS`` commands at the control rate (each gap at most 1.5 periods, at the
  middleware's reception time). After a fault that silences the node this is its return;
  after one it rides through, how soon its stream is regular again (about one period when
  the fault never disturbed it);
- the release gate: from the end effector reaching the pad to the release passing;
- the inference child killed or hung: from the signal to a new child and commands at the
  control rate again.

It prints one table: the faults injected per kind, non-finite commands published (must
be 0), commands published from stale inputs (0), releases outside the radius (0), time to
recover (median and max, per kind and per group of faults), inference children leaked
(0) and whether the node was alive at the end. ``--quick`` is the short form the test
suite runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter
from act_ros.core.atomic import write_text_atomic
from act_ros.core.processes import ProcessSet, wait_gone

FAR_EE = (0.6, 0.3, 0.3)    # 0.5 m from the pad
NEAR_EE = (0.27, 0.01, 0.02)  # 3 cm from the pad
PAD = (0.25, 0.0, 0.0)
MAX_OBS_AGE_S = 0.2
HELD_GRIPPER_OPENING = 0.6  # measured gripper while holding an object (normalized)
SILENCE_GRACE_S = MAX_OBS_AGE_S + 0.15  # a command may still leave this long after a fault
RATE_HZ = 30.0  # the harness's publishing rate = the node's control rate
STEADY_COMMANDS = 5  # recovered: this many commands in a row at the control rate
RECOVERY_TIMEOUT_S = 15.0
LEAK_WAIT_S = 10.0  # how long a replaced child may take to be gone
RECOVERY_DEFINITION = (
    'seconds from the end of the fault (child faults: from the signal; the gate: from the end '
    'effector reaching the pad) until the node is back to normal: the first command of '
    f'{STEADY_COMMANDS} in a row at the control rate (gaps <= 1.5 periods, middleware reception '
    'time; child faults: from the new child), the gate: the release passing')
GROUPS = {  # how the summary groups the recovery times (fault kind -> group)
    True: 'inputs that silence the node', False: 'faults the node rides through'}


@dataclass
class FaultResult:
    """What one injected fault did."""

    kind: str
    silent_expected: bool
    commands_during: int = 0
    stale_commands: int = 0
    recovery_s: float | None = None
    recovered: bool = False
    releases_outside: int = 0
    children_leaked: int = 0
    group: str = ''
    note: str = ''


@dataclass
class Report:
    results: list[FaultResult] = field(default_factory=list)
    nonfinite_commands: int = 0
    commands_total: int = 0
    alive_at_end: bool = False
    exit_s: float | None = None
    children_left: int = 0

    @property
    def children_leaked(self) -> int:
        return sum(r.children_leaked for r in self.results)

    def recovery_by_group(self) -> dict[str, list[float]]:
        groups: dict[str, list[float]] = {}
        for r in self.results:
            if r.recovery_s is not None:
                groups.setdefault(r.group, []).append(r.recovery_s)
        return groups

    def table(self) -> str:
        kinds: dict[str, list[FaultResult]] = {}
        for r in self.results:
            kinds.setdefault(r.kind, []).append(r)
        rows = ['| fault | injected | recovered | stale commands | releases outside radius | '
                'children leaked | recovery median / max (s) |', '|---|---|---|---|---|---|---|']
        for kind, items in kinds.items():
            rec = [r.recovery_s for r in items if r.recovery_s is not None]
            timing = (f'{float(np.median(rec)):.2f} / {max(rec):.2f}' if rec else '-')
            rows.append(f'| {kind} | {len(items)} | {sum(r.recovered for r in items)} | '
                        f'{sum(r.stale_commands for r in items)} | '
                        f'{sum(r.releases_outside for r in items)} | '
                        f'{sum(r.children_leaked for r in items)} | {timing} |')
        all_rec = [r.recovery_s for r in self.results if r.recovery_s is not None]
        by_group = [f'  - {group}: median {float(np.median(rec)):.2f} s, max {max(rec):.2f} s '
                    f'({len(rec)} faults)' for group, rec in self.recovery_by_group().items()]
        summary = [
            f'- faults injected: {len(self.results)} of {len(kinds)} kinds; recovered: '
            f'{sum(r.recovered for r in self.results)}',
            f'- non-finite commands published: {self.nonfinite_commands} (must be 0)',
            f'- commands published from stale inputs: '
            f'{sum(r.stale_commands for r in self.results)} (must be 0)',
            f'- releases outside the radius: {sum(r.releases_outside for r in self.results)} '
            '(must be 0)',
            (f'- time to recover (every fault): median {float(np.median(all_rec)):.2f} s, max '
             f'{max(all_rec):.2f} s' if all_rec else '- time to recover: -'), *by_group,
            f'- inference children leaked (still there {LEAK_WAIT_S:.0f} s after the node '
            f'commanded again): {self.children_leaked} (must be 0)',
            f'- node alive at the end: {self.alive_at_end}; exit after the signal: '
            + (f'{self.exit_s:.1f} s' if self.exit_s is not None else 'did not exit')
            + f', processes left behind: {self.children_left}',
            f'- commands received in all: {self.commands_total}']
        return '\n'.join(rows) + '\n\n' + '\n'.join(summary)

    @property
    def ok(self) -> bool:
        return (self.nonfinite_commands == 0 and self.alive_at_end and self.exit_s is not None
                and self.children_left == 0 and self.children_leaked == 0
                and all(r.recovered and r.stale_commands == 0 and r.releases_outside == 0
                        for r in self.results))


def first_steady(times: Any, period_s: float, count: int = STEADY_COMMANDS) -> float | None:
    """The first of ``times`` (sorted) that starts ``count`` commands in a row with every gap
    at most 1.5 periods; ``None`` if there is no such run."""
    times = np.asarray(times, dtype=np.float64)
    if times.size < count:
        return None
    regular = np.diff(times) <= 1.5 * period_s
    for i in range(times.size - count + 1):
        if regular[i:i + count - 1].all():
            return float(times[i])
    return None


def _inference_children(pid: int) -> list[int]:
    """The node's inference processes (recognised by their command line's marker)."""
    import psutil

    from act_ros.core.inference.inference_process import CHILD_MARKER

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if CHILD_MARKER in child.cmdline():
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


class Scenario:
    """Drives the harness through the faults and measures what the node sends."""

    def __init__(self, harness: Any, node_pid: int, open_image: np.ndarray,
                 closed_image: np.ndarray, *, hold_s: float, gripper: int,
                 release_threshold: float = 0.9) -> None:
        from std_srvs.srv import Trigger

        self.h, self.node_pid = harness, node_pid
        self._reset = harness.create_client(Trigger, '/act_node/reset')
        self.open_image, self.closed_image = open_image, closed_image
        self.hold_s, self.gripper = hold_s, gripper
        self.threshold = release_threshold
        self.report = Report()

    # -- measuring -----------------------------------------------------------------------
    def _commands(self, since: float, until: float | None = None) -> list[Any]:
        return [c for c in self.h.commands_since(since) if until is None or c.received <= until]

    def _times(self, since: float) -> np.ndarray:
        """When the commands after ``since`` arrived, on this process's monotonic clock: the
        middleware's reception times (a callback runs late while this process is busy),
        moved to that clock by the smallest callback delay seen; the callbacks' times where
        the middleware gives none."""
        commands = self.h.commands_since(since - 1.0)
        stamps = [c.middleware_received_s for c in self.h.commands_since(0.0)]
        if commands and all(s is not None for s in stamps):
            shift = min(c.received - c.middleware_received_s
                        for c in self.h.commands_since(0.0))
            times = np.sort([c.middleware_received_s + shift for c in commands])
        else:
            times = np.sort([c.received for c in commands])
        return times[times >= since]

    def _steady_since(self, since: float, timeout_s: float = RECOVERY_TIMEOUT_S
                      ) -> float | None:
        """The time of the first command after ``since`` that starts ``STEADY_COMMANDS`` at
        the control rate (waiting up to ``timeout_s`` for it); ``None`` if none came."""
        deadline = since + timeout_s
        while True:
            found = first_steady(self._times(since), 1.0 / RATE_HZ)
            if found is not None or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def _releases(self, since: float, until: float) -> int:
        return sum(1 for c in self._commands(since, until)
                   if c.positions.size > self.gripper and c.positions[self.gripper] > 0.5)

    # -- faults --------------------------------------------------------------------------
    def silence(self, kind: str, inject, restore) -> None:
        """A fault after which the node must stop commanding, then resume when it ends."""
        start = time.monotonic()
        inject()
        time.sleep(self.hold_s)
        end = time.monotonic()
        restore()
        r = FaultResult(kind, True, group=GROUPS[True])
        r.commands_during = len(self._commands(start, end))
        r.stale_commands = len(self._commands(start + SILENCE_GRACE_S, end))
        back = self._steady_since(end)
        r.recovered = back is not None
        r.recovery_s = back - end if back is not None else None
        self.report.results.append(r)

    def continuing(self, kind: str, inject, restore, *, far_open: bool = False) -> None:
        """A fault the node must ride through: commands go on (and, with ``far_open``, the
        open request far from the pad never passes)."""
        if far_open:
            self.h.image = self.open_image
        start = time.monotonic()
        inject()
        time.sleep(self.hold_s)
        end = time.monotonic()
        restore()
        r = FaultResult(kind, False, group=GROUPS[False])
        r.commands_during = len(self._commands(start, end))
        back = self._steady_since(end)
        r.recovered = r.commands_during > 0 and back is not None
        r.recovery_s = back - end if back is not None else None
        if far_open:
            r.releases_outside = self._releases(start, end)
            self.h.image = self.closed_image
        self.report.results.append(r)

    def child(self, kind: str, sig: int) -> None:
        """Kill or stop the inference process: the node must restart it (ending a hung one
        itself) and command at the control rate again."""
        children = _inference_children(self.node_pid)
        r = FaultResult(kind, False, group='inference child restarted', note=f'children {children}')
        if not children:
            r.note = 'no inference child found (execution is not process?)'
            self.report.results.append(r)
            return
        start = time.monotonic()
        for pid in children:
            os.kill(pid, sig)
        # Commands stop once the queued actions are played; they come back after a restart,
        # from the new child: a steady run that starts after it appeared.
        deadline = start + 60.0
        fresh_at = None
        while time.monotonic() < deadline:
            if fresh_at is None and [p for p in _inference_children(self.node_pid)
                                     if p not in children]:
                fresh_at = time.monotonic()
            back = (self._steady_since(fresh_at, timeout_s=0.0) if fresh_at is not None
                    else None)
            if back is not None:
                r.recovered = True
                r.recovery_s = back - start
                break
            time.sleep(0.05)
        # The node must have ended the old child (a hung one included): counted before this
        # benchmark cleans anything up.
        leaked = wait_gone(children, LEAK_WAIT_S)
        r.children_leaked = len(leaked)
        if leaked:
            r.note += f'; leaked {leaked} (killed by the benchmark after counting)'
        for pid in leaked:
            for cleanup in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, cleanup)
                except ProcessLookupError:
                    break
        self.report.results.append(r)

    def gate(self) -> None:
        """Holding, an open request far from the pad is suppressed; near it, it passes."""
        self.h.image = self.closed_image
        time.sleep(0.5)  # closed for more than hold_ticks: HOLDING
        self.h.ee_position = np.array(FAR_EE)
        self.h.image = self.open_image
        start = time.monotonic()
        time.sleep(self.hold_s)
        end = time.monotonic()
        r = FaultResult('open request far from the pad while holding', False,
                        group='release near the pad after a refused one')
        r.commands_during = len(self._commands(start, end))
        r.releases_outside = self._releases(start, end)
        self.h.ee_position = np.array(NEAR_EE)
        near = time.monotonic()
        deadline = near + 10.0
        while time.monotonic() < deadline and not self._releases(near, time.monotonic()):
            time.sleep(0.02)
        r.recovered = bool(self._releases(near, time.monotonic())) and r.commands_during > 0
        r.recovery_s = (time.monotonic() - near) if r.recovered else None
        r.note = 'released near the pad' if r.recovered else 'no release near the pad'
        self.report.results.append(r)
        self.h.ee_position = np.array(FAR_EE)
        self.h.image = self.closed_image
        self.reset_episode()  # RELEASED until reset: a new episode, the gate FREE again

    def reset_episode(self) -> None:
        from std_srvs.srv import Trigger

        if not self._reset.wait_for_service(timeout_sec=10.0):
            raise RuntimeError('/act_node/reset is not available')
        future = self._reset.call_async(Trigger.Request())
        deadline = time.monotonic() + 10.0
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # closed image again: HOLDING after hold_ticks


def _mutators(harness: Any):
    def nan_joint(msg):
        positions = list(msg.position)
        positions[0] = float('nan')
        msg.position = positions
        return msg

    def short_image(msg):
        from sensor_msgs.msg import Image

        out = Image(height=msg.height, width=msg.width, encoding=msg.encoding, step=msg.step)
        out.header = msg.header
        out.data = bytes(msg.data)[: len(msg.data) // 2]
        return out

    def bad_encoding(msg):
        from sensor_msgs.msg import Image

        out = Image(height=msg.height, width=msg.width, encoding='yuv422', step=msg.step)
        out.header = msg.header
        out.data = bytes(msg.data)
        return out

    def old_stamp(msg):
        msg.header.stamp.sec = max(0, msg.header.stamp.sec - int(np.random.randint(1, 3)))
        return msg

    frozen = {}

    def same_stamp(msg):
        frozen.setdefault('stamp', msg.header.stamp)
        msg.header.stamp = frozen['stamp']
        return msg

    return dict(nan_joint=nan_joint, short_image=short_image, bad_encoding=bad_encoding,
                old_stamp=old_stamp, same_stamp=same_stamp)


def run_scenario(scenario: Scenario, rounds: int) -> None:
    h = scenario.h
    m = _mutators(h)
    streams = ('joint_states', *h.cameras)

    def setter(**changes):
        def apply():
            for key, value in changes.items():
                if key == 'enabled':
                    h.enabled.update(value)
                elif key == 'mutate':
                    h.mutate.update(value)
                elif key == 'drop':
                    h.drop.update(value)
                else:
                    setattr(h, key, value)
        return apply

    def clear():
        h.enabled.update({s: True for s in streams})
        h.mutate.clear()
        h.drop.clear()
        h.pad_position = np.array(PAD)
        h.ee_position = np.array(FAR_EE)

    def burst():
        for _ in range(40):
            h.publish_once()

    for _ in range(rounds):
        scenario.silence('camera stale', setter(enabled={'wrist': False}), clear)
        scenario.silence('joint states stale', setter(enabled={'joint_states': False}), clear)
        scenario.silence('NaN joint position', setter(mutate={'joint_states': m['nan_joint']}),
                         clear)
        scenario.silence('wrong-size image', setter(mutate={'top': m['short_image']}), clear)
        scenario.silence('unknown encoding', setter(mutate={'wrist': m['bad_encoding']}), clear)
        scenario.continuing('pad pose stale (open request)', setter(pad_position=None), clear,
                            far_open=True)
        scenario.continuing('end-effector pose stale (open request)', setter(ee_position=None),
                            clear, far_open=True)
        scenario.continuing('out-of-order stamps', setter(mutate={s: m['old_stamp']
                                                                  for s in streams}), clear)
        scenario.continuing('duplicated stamps', setter(mutate={s: m['same_stamp']
                                                                for s in streams}), clear)
        scenario.continuing('burst of messages', burst, clear)
        scenario.continuing('half the messages dropped', setter(drop={s: 0.5 for s in streams}),
                            clear)
        scenario.gate()
        scenario.child('inference child killed (SIGKILL)', signal.SIGKILL)
        scenario.child('inference child hung (SIGSTOP)', signal.SIGSTOP)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros bench faults', description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument('--model-path', help='checkpoint (default: a new tiny one); its gripper '
                   'output is steered by the image')
    p.add_argument('--rounds', type=int, default=3, help='times every fault is injected')
    p.add_argument('--hold-s', type=float, default=2.0, help='how long each fault lasts')
    p.add_argument('--quick', action='store_true', help='one round, short faults (tests)')
    p.add_argument('--signal', choices=('SIGTERM', 'SIGINT'), default='SIGTERM',
                   help='signal that ends the node at the end')
    p.add_argument('--startup-timeout', type=float, default=180.0)
    p.add_argument('--json', type=Path, help='also write the results as JSON')
    p.add_argument('--no-header', action='store_true')
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.hold_s = 1, 1.0
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import rclpy

    from act_ros.core.contract import load_contract
    from act_ros.core.inference.checkpoint import create_checkpoint
    from act_ros.ros.harness import (
        FAST_ROBOT_MAX_JOINT_VELOCITY,
        RobotHarness,
        fast_robot_model,
        make_gated_checkpoint,
        spinning,
        wait_until,
    )
    from act_ros.ros.node.parameters import format_parameter_value

    contract = load_contract()
    with tempfile.TemporaryDirectory(prefix='act_ros_faults_') as tmp:
        base = args.model_path or str(create_checkpoint(Path(tmp) / 'tiny', preset='tiny',
                                                        image_size=(48, 64)))
        # The robot holds an object: its gripper measures 0.6 (fingers on the object). An
        # empty gripper (0) would make the gate free the gripper again, as it should.
        joints = {n: 0.0 for n in contract.joint_names}
        joints[contract.gripper_joints[0]] = HELD_GRIPPER_OPENING
        model, open_image, closed_image = make_gated_checkpoint(
            base, Path(tmp) / 'gated', state=np.array([joints[n] for n in contract.joint_names]))
        cmd = [sys.executable, '-m', 'act_ros.ros.node.act_node', '--ros-args',
               '-p', f'model_path:={model}', '-p', 'execution:=process', '-p', 'mode:=chunk',
               '-p', 'n_action_steps:=5', '-p', 'torch_threads:=1', '-p', 'device:=cpu',
               '-p', f'max_obs_age_s:={MAX_OBS_AGE_S}',
               # Commands pass the speed limit unchanged (the same kinematics, fast joints).
               '-p', 'max_joint_velocity:='
               + format_parameter_value(FAST_ROBOT_MAX_JOINT_VELOCITY),
               '-p', f'urdf_path:={fast_robot_model(tmp)}',
               '-p', 'ee_source:=topic', '-p', 'pad_source:=topic',
               '-p', 'inference_timeout_s:=2.0', '-p', 'diagnostics_period_s:=0.5']
        procs = ProcessSet(Path(tmp) / 'logs', dict(os.environ))
        node = procs.start('act_node', cmd)
        context = rclpy.context.Context()
        rclpy.init(context=context)
        harness = RobotHarness(context=context, joints=joints,
                               image=closed_image, rate_hz=30.0, name='fault_robot')
        harness.pad_position = np.array(PAD)
        harness.ee_position = np.array(FAR_EE)
        report = None
        try:
            with spinning(context, harness, num_threads=1):
                if not wait_until(lambda: harness.commands or not node.running(),
                                  args.startup_timeout, 0.2):
                    print(f'[bench faults] no command within {args.startup_timeout:.0f} s:\n'
                          f'{node.log_tail(40)}', flush=True)
                    return 1
                scenario = Scenario(harness, node.pid, open_image, closed_image,
                                    hold_s=args.hold_s, gripper=contract.gripper_indices[0])
                run_scenario(scenario, args.rounds)
                report = scenario.report
                report.alive_at_end = node.running()
                commands = harness.commands_since(0.0)
                report.commands_total = len(commands)
                report.nonfinite_commands = sum(not np.all(np.isfinite(c.positions))
                                                for c in commands)
                tree = [node.pid] + _inference_children(node.pid)
                sent = time.monotonic()
                if node.running():
                    node.popen.send_signal(getattr(signal, args.signal))
                try:
                    node.popen.wait(timeout=30.0)
                    report.exit_s = time.monotonic() - sent
                except Exception:  # noqa: BLE001 - reported as 'did not exit'
                    report.exit_s = None
                report.children_left = len(wait_gone(tree, 10.0))
        finally:
            procs.stop_all()
            rclpy.try_shutdown(context=context)
    title = '' if args.no_header else '# act_ros fault injection\n\n'
    text = (f'{title}## Fault injection: act_node over real topics\n\n'
            f'{args.rounds} round(s), each fault held {args.hold_s:g} s; tiny ACT with an '
            'image-steered gripper, process execution, chunk mode (5 actions per chunk), '
            f'{MAX_OBS_AGE_S} s input age limit, 2 s inference timeout.\n\n' + report.table()
            + '\n')
    print(text, flush=True)
    if args.json:
        from act_ros.bench.report import result_provenance
        write_text_atomic(args.json, json.dumps({
            'provenance': result_provenance('act-ros bench faults',
                                            argv if argv is not None else sys.argv[1:],
                                            output_path=args.json),
            'ok': report.ok, 'results': [r.__dict__ for r in report.results],
            'nonfinite_commands': report.nonfinite_commands, 'alive_at_end': report.alive_at_end,
            'exit_s': report.exit_s, 'children_left': report.children_left,
            'children_leaked': report.children_leaked,
            'recovery_definition': RECOVERY_DEFINITION,
            'recovery_by_group': {group: {'median_s': float(np.median(rec)), 'max_s': max(rec),
                                          'faults': len(rec)}
                                  for group, rec in report.recovery_by_group().items()},
            'settings': {'rounds': args.rounds, 'hold_s': args.hold_s, 'rate_hz': RATE_HZ,
                         'steady_commands': STEADY_COMMANDS, 'max_obs_age_s': MAX_OBS_AGE_S}},
            indent=2,
            default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else str(v)))
    return 0 if report.ok else 1


if __name__ == '__main__':
    sys.exit(main())
