"""``act-ros plot-plan``: a picture of what act_node plans, from its visualization topics.

    act-ros plot-plan --duration 15 --output plan.png        # beside a running act_node

Subscribes to ``<node>/planned_path`` and ``<node>/markers`` as RViz does (reliable,
transient local; :mod:`act_ros.ros.node.visualization`) for ``--duration`` seconds, then
draws the robot base frame from above (x, y) and from the side (x, z): the release region
around the pad in the gate's colour, the end effector's track (the positions the gate
used, one per marker message), the last planned paths (older ones fainter) and on the
newest one the chunk's gripper requests (green open, red closed), titled with the gate
text (state, distance, release radius, input ages). For machines without RViz, and for a
picture of a run in the docs. Only rclpy and matplotlib; no display needed.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from act_ros.core.arguments import HelpFormatter

PATHS_SHOWN = 4


@dataclass
class PlanRecord:
    """What arrived on the two topics, reduced to arrays."""

    paths: list[np.ndarray] = field(default_factory=list)  # (N, 3) each, oldest first
    ee_track: list[np.ndarray] = field(default_factory=list)
    region: tuple[np.ndarray, float, tuple[float, ...]] | None = None  # centre, radius, rgba
    plan_points: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    plan_colors: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    text: str = ''
    frame_id: str = ''

    def add_path(self, msg: Any) -> None:
        points = np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z]
                           for p in msg.poses]).reshape(-1, 3)
        if len(points):
            self.paths.append(points)
        self.frame_id = msg.header.frame_id or self.frame_id

    def add_markers(self, msg: Any) -> None:
        from visualization_msgs.msg import Marker

        for m in msg.markers:
            position = np.array([m.pose.position.x, m.pose.position.y, m.pose.position.z])
            if m.action != Marker.ADD:
                if m.ns == 'release_region':
                    self.region = None
                continue
            if m.ns == 'release_region':
                c = m.color
                self.region = (position, m.scale.x / 2.0, (c.r, c.g, c.b, c.a))
            elif m.ns == 'end_effector':
                self.ee_track.append(position)
            elif m.ns == 'planned_gripper':
                self.plan_points = np.array([[p.x, p.y, p.z] for p in m.points]).reshape(-1, 3)
                self.plan_colors = np.array([[c.r, c.g, c.b, c.a]
                                             for c in m.colors]).reshape(-1, 4)
            elif m.ns == 'gate_state':
                self.text = m.text
            self.frame_id = m.header.frame_id or self.frame_id


def draw(record: PlanRecord, output: str | Path) -> Path:
    """Top and side views of ``record`` into ``output`` (PNG)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
    for ax, (i, j), name in zip(axes, ((0, 1), (0, 2)), ('from above', 'from the side')):
        if record.region is not None:
            centre, radius, rgba = record.region
            ax.add_patch(Circle((centre[i], centre[j]), radius, color=rgba[:3], alpha=0.3,
                                label='release region (gate colour)'))
            ax.plot(centre[i], centre[j], '+', color=rgba[:3], markersize=10)
        if record.ee_track:
            track = np.array(record.ee_track)
            ax.plot(track[:, i], track[:, j], '-', color='0.35', lw=1.2,
                    label='end effector (as the gate saw it)')
            ax.plot(track[-1, i], track[-1, j], 'o', color='0.1', markersize=6)
        shown = record.paths[-PATHS_SHOWN:]
        for k, path in enumerate(shown):
            newest = k == len(shown) - 1
            ax.plot(path[:, i], path[:, j], '-', color='#e6a400',
                    alpha=1.0 if newest else 0.25 + 0.15 * k, lw=2.0 if newest else 1.0,
                    label='planned path (newest chunk)' if newest else None)
        if len(record.plan_points):
            ax.scatter(record.plan_points[:, i], record.plan_points[:, j], s=14,
                       c=np.clip(record.plan_colors[:, :3], 0, 1), zorder=3,
                       label='gripper request (green open, red closed)')
        axis = 'xyz'
        ax.set_xlabel(f'{axis[i]} (m)')
        ax.set_ylabel(f'{axis[j]} (m)')
        ax.set_title(f'{record.frame_id or "base frame"}, {name}')
        ax.set_aspect('equal', adjustable='datalim')
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc='lower center', ncol=4, fontsize=8, frameon=False)
    fig.suptitle(record.text or 'no markers received', fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 0.93))
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def record_topics(node_name: str, duration_s: float) -> PlanRecord:
    """Listen to ``<node_name>/planned_path`` and ``<node_name>/markers`` for a while."""
    import rclpy
    from nav_msgs.msg import Path as PathMsg
    from rclpy.executors import SingleThreadedExecutor
    from visualization_msgs.msg import MarkerArray

    from act_ros.ros.node.visualization import VISUALIZATION_QOS

    record = PlanRecord()
    context = rclpy.context.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node('act_plan_plot', context=context)
        base = node_name.rstrip('/')
        node.create_subscription(PathMsg, f'{base}/planned_path', record.add_path,
                                 VISUALIZATION_QOS)
        node.create_subscription(MarkerArray, f'{base}/markers', record.add_markers,
                                 VISUALIZATION_QOS)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        executor.shutdown()
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='act-ros plot-plan', description=__doc__.split('\n')[0],
                                formatter_class=HelpFormatter)
    p.add_argument('--node', default='/act_node', help='the act_node (default /act_node)')
    p.add_argument('--duration', type=float, default=10.0, help='seconds to listen')
    p.add_argument('--output', type=Path, required=True, help='the picture to write (PNG)')
    args = p.parse_args(argv)
    record = record_topics(args.node, args.duration)
    if not record.paths and record.region is None:
        print(f'[plot-plan] nothing on {args.node}/planned_path or {args.node}/markers in '
              f'{args.duration:g} s (is act_node active, visualization.enabled true, the same '
              'ROS_DOMAIN_ID?)', file=sys.stderr)
        return 1
    print(f'[plot-plan] {len(record.paths)} paths, {len(record.ee_track)} marker messages: '
          f'{draw(record, args.output)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
