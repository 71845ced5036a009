"""``act-ros <command>``: one entry point for the package's tools.

Each command lives in its own module with a ``main(argv)`` function; this file only
dispatches, so that importing it stays cheap (torch, MuJoCo and rclpy load on demand).
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    'collect': ('act_ros.training.drivers.collect', 'record scripted-expert demonstrations to a LeRobot '
                'dataset (--dagger: a policy drives, the expert labels)'),
    'generate-synthetic': ('act_ros.data.synthetic', 'write a small random dataset for smoke tests'),
    'import-bag': ('act_ros.data.bag_import', 'rosbag2 recordings (MCAP, SQLite3) to a LeRobot '
                   'dataset'),
    'record': ('act_ros.ros.recording.record_node', 'record demonstrations from ROS 2 topics (record_node)'),
    'train': ('act_ros.training.train', 'train an ACT policy on a LeRobot dataset'),
    'evaluate': ('act_ros.training.evaluation.evaluate', 'closed-loop evaluation in the simulation'),
    'pose-pretrain': ('act_ros.training.pose_pretrain', "train a policy's vision backbone on "
                      'the object poses of random rendered scenes (no expert)'),
    'dagger': ('act_ros.training.drivers.dagger_loop', 'DAgger iterations: collect with the policy, '
               'expert labels, train, repeat'),
    'recipe': ('act_ros.training.drivers.recipe', 'a whole training recipe (config/recipe_<name>.yaml) '
               'as one resumable command'),
    'bench': ('act_ros.bench.__main__', 'benchmarks (runtime, node, compile, training, all)'),
    'init-checkpoint': ('act_ros.core.inference.checkpoint',
                        'write an untrained ACT checkpoint (benchmarks, tests)'),
    'package-model': ('act_ros.training.package_model', 'check a checkpoint and copy it to a '
                      'deployable model folder (fp16 weights)'),
    'export': ('act_ros.training.quantize', 'export a checkpoint to ONNX (openvino / onnxruntime '
               'backends); --int8: quantize it with NNCF on dataset frames (precision int8)'),
    'report': ('act_ros.report', 'write the tables of figures in README.md and docs/ from the '
               'committed result files (--check: fail when a page is stale)'),
    'ros-eval': ('act_ros.ros.evaluation.ros_eval', 'closed-loop evaluation over ROS 2: '
                 'act_node and the simulation bridge in lock-step, every mode'),
    'compare-evals': ('act_ros.ros.evaluation.compare', 'an in-process and an over-ROS '
                      'evaluation of the same seeds, episode by episode'),
    'expert-eval': ('act_ros.sim.expert_eval', "a task's scripted expert on N seeds: success "
                    'and failure stages'),
    'demo': ('act_ros.demo', 'the shipped policies doing the simulated tasks over ROS 2, beside '
             'their experts (make demo)'),
    'plot-seams': ('act_ros.training.evaluation.seam_plot', 'joint position and velocity around chunk '
                   'handovers, one panel per mode (chunk, ensemble, blend)'),
    'call': ('act_ros.ros.tools.call', 'call a std_srvs/srv/Trigger service (ros2 service call, '
             'without a ROS install)'),
    'topics': ('act_ros.ros.tools.topics', 'the topics this machine sees, with their types '
               '(ros2 topic list -t)'),
    'hz': ('act_ros.ros.tools.hz', 'the message rate of a topic (ros2 topic hz)'),
    'share-dir': ('act_ros.core.paths', "the folder of the package's config/ and models/ "
                  '(ros2 pkg prefix act_ros + /share/act_ros)'),
    'plot-plan': ('act_ros.ros.plan_plot', "a picture of act_node's planned path and release "
                  'gate, from its visualization topics'),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ['usage: act-ros <command> [options]', '', 'commands:']
    lines += [f'  {name:<{width}}  {help_}' for name, (_, help_) in COMMANDS.items()]
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help'):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"act-ros: unknown command '{name}'\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == '__main__':
    sys.exit(main())
