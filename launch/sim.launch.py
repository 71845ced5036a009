"""Launch the MuJoCo simulation (sim_bridge) and the ACT policy node (act_node) together.

    ros2 launch act_ros sim.launch.py model_path:=/path/to/pretrained_model
    ros2 launch act_ros sim.launch.py model_path:=... mode:=realtime policy_mode:=ensemble
    ros2 launch act_ros sim.launch.py model_path:=... seed:=100 episodes:=10 \
        image_height:=96 image_width:=128

mode:=lockstep (the default, unless bridge_params_file says otherwise) steps the
simulation once per command and runs the policy once per observation, synchronously
(act_node trigger observation, execution sync): the same seed gives the same episode
whatever the machine's speed. mode:=realtime runs the simulation at 30 Hz of wall clock
and the policy on its timer, as on a real arm. Before every episode the bridge calls
act_node/reset (empty action queue, release gate re-armed); the pad position comes from
the bridge's pad_pose topic. Episode results appear on /sim_bridge/episode_status (JSON).

Which value wins (act_ros.ros.launch_arguments.sim_parameters): the launch file's
defaults (lock-step, simulated time) lose to the params files, a launch argument you give
wins over the files, and an argument you do not give passes nothing. The pairing of the
two nodes (act_node's trigger, and its execution in lock-step, follow the bridge's mode;
the pad from the bridge; the bridge resets the policy; both start at once) is set last.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch_ros.actions import LifecycleNode, Node

from act_ros.ros.launch_arguments import sim_parameters

def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments; both nodes are made from their values (launch_setup)."""
    arguments = [
        DeclareLaunchArgument(
            'model_path', default_value='',
            description='Checkpoint directory (LeRobot pretrained_model) or Hub id '
                        'org/name[@revision][/subfolder].'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'mode', default_value='', choices=['', 'lockstep', 'realtime'],
            description='lockstep: one simulation step per command, one policy tick per '
                        'observation (reproducible); realtime: 30 Hz wall clock. Not given: '
                        'bridge_params_file, else lockstep.'),
        DeclareLaunchArgument(
            'policy_mode', default_value='', choices=['', 'chunk', 'ensemble', 'blend'],
            description='Policy execution: chunk (play n_action_steps of each chunk), '
                        'ensemble (temporal ensembling) or blend (crossfaded handovers).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'seed', default_value='',
            description='Seed of the first episode; the next ones use seed + 1, seed + 2, ...'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'episodes', default_value='',
            description='Episodes to run back to back (0 = until stopped).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'image_height', default_value='',
            description='Camera image height in pixels (0 = config/sim.yaml, 480).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'image_width', default_value='',
            description='Camera image width in pixels (0 = config/sim.yaml, 640).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'episode_steps', default_value='',
            description='Control steps per episode (0 = config/sim.yaml, 300 = 10 s).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'lockstep_timeout_s', default_value='',
            description='lockstep: seconds to wait for a command before the step runs with '
                        'the last target held (counted in the episode status).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'device', default_value='',
            description='Inference device: auto (MPS, then CUDA, then CPU), cpu, cuda, cuda:N '
                        'or mps.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='',
            description='act_node follows the simulated /clock published by sim_bridge (true '
                        'unless act_params_file or this argument says false).'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of both nodes; their relative topic names follow it.'),
        DeclareLaunchArgument(
            'bridge_params_file', default_value='',
            description="sim_bridge parameters (YAML); they win over the bridge's defaults "
                        'and this launch file\'s (lockstep), launch arguments given win over '
                        'them. Empty: none (the bridge\'s own defaults, config/sim_bridge.yaml).'),
        DeclareLaunchArgument(
            'act_params_file', default_value='',
            description="act_node parameters (YAML); they win over the node's defaults and "
                        'this launch file\'s (simulated time), launch arguments given win over '
                        'them. Empty: none (the node\'s own defaults, config/act.yaml).'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            description='Logging level of both nodes: debug, info, warn, error or fatal.'),
    ]
    return LaunchDescription(arguments + [OpaqueFunction(function=launch_setup)])


def launch_setup(context, *args, **kwargs) -> list:
    """sim_bridge and act_node, from the launch arguments' values."""
    values = context.launch_configurations
    bridge_parameters, act_parameters = sim_parameters(
        values, act_files=[values['act_params_file']],
        bridge_files=[values['bridge_params_file']], namespace=values['namespace'])
    log_args = ['--ros-args', '--log-level', values['log_level']]
    bridge = Node(
        package='act_ros',
        executable='sim_bridge',
        name='sim_bridge',
        namespace=values['namespace'],
        output='screen',
        emulate_tty=True,
        parameters=bridge_parameters,
        arguments=log_args,
    )
    policy = LifecycleNode(
        package='act_ros',
        executable='act_node',
        name='act_node',
        namespace=values['namespace'],
        output='screen',
        emulate_tty=True,
        parameters=act_parameters,
        arguments=log_args,
    )
    return [bridge, policy]
