"""Launch the MuJoCo simulation (sim_bridge) and the ACT policy node (act_node) together.

    ros2 launch act_ros sim.launch.py model_path:=/path/to/pretrained_model
    ros2 launch act_ros sim.launch.py model_path:=... mode:=realtime policy_mode:=ensemble
    ros2 launch act_ros sim.launch.py model_path:=... seed:=100 episodes:=10 \
        image_height:=96 image_width:=128

mode:=lockstep (default) steps the simulation once per command and runs the policy once
per observation, synchronously (act_node trigger observation, execution sync): the same
seed gives the same episode whatever the machine's speed. mode:=realtime runs the
simulation at 30 Hz of wall clock and the policy on its timer with background inference,
as on a real arm. Before every episode the bridge calls act_node/reset (empty action
queue, release gate re-armed); the pad position comes from the bridge's pad_pose topic.
Episode results appear on /sim_bridge/episode_status (JSON).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments, the sim_bridge node and the act_node lifecycle node."""
    config = PathJoinSubstitution([FindPackageShare('act_ros'), 'config'])
    arguments = [
        DeclareLaunchArgument(
            'model_path',
            description='Checkpoint directory (LeRobot pretrained_model) or Hub id '
                        'org/name[@revision][/subfolder]. Required.'),
        DeclareLaunchArgument(
            'mode', default_value='lockstep', choices=['lockstep', 'realtime'],
            description='lockstep: one simulation step per command, one policy tick per '
                        'observation (reproducible); realtime: 30 Hz wall clock.'),
        DeclareLaunchArgument(
            'policy_mode', default_value='chunk', choices=['chunk', 'ensemble'],
            description='Policy execution: chunk (play n_action_steps of each chunk) or '
                        'ensemble (temporal ensembling).'),
        DeclareLaunchArgument(
            'seed', default_value='0',
            description='Seed of the first episode; the next ones use seed + 1, seed + 2, ...'),
        DeclareLaunchArgument(
            'episodes', default_value='0',
            description='Episodes to run back to back (0 = until stopped).'),
        DeclareLaunchArgument(
            'image_height', default_value='0',
            description='Camera image height in pixels (0 = config/sim.yaml, 480).'),
        DeclareLaunchArgument(
            'image_width', default_value='0',
            description='Camera image width in pixels (0 = config/sim.yaml, 640).'),
        DeclareLaunchArgument(
            'episode_steps', default_value='0',
            description='Control steps per episode (0 = config/sim.yaml, 300 = 10 s).'),
        DeclareLaunchArgument(
            'lockstep_timeout_s', default_value='2.0',
            description='lockstep: seconds to wait for a command before the step runs with '
                        'the last target held (counted in the episode status).'),
        DeclareLaunchArgument(
            'device', default_value='auto',
            description='Inference device: auto (MPS, then CUDA, then CPU), cpu, cuda, cuda:N '
                        'or mps.'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='true',
            description='act_node follows the simulated /clock published by sim_bridge.'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of both nodes; their relative topic names follow it.'),
        DeclareLaunchArgument(
            'bridge_params_file', default_value=PathJoinSubstitution([config, 'sim_bridge.yaml']),
            description='sim_bridge parameters (YAML); launch arguments override them.'),
        DeclareLaunchArgument(
            'act_params_file', default_value=PathJoinSubstitution([config, 'act.yaml']),
            description='act_node parameters (YAML); launch arguments override them.'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            description='Logging level of both nodes: debug, info, warn, error or fatal.'),
    ]
    mode = LaunchConfiguration('mode')
    lockstep = ["'", mode, "' == 'lockstep'"]
    log_args = ['--ros-args', '--log-level', LaunchConfiguration('log_level')]

    bridge = Node(
        package='act_ros',
        executable='sim_bridge',
        name='sim_bridge',
        namespace=LaunchConfiguration('namespace'),
        output='screen',
        emulate_tty=True,
        parameters=[
            LaunchConfiguration('bridge_params_file'),
            {
                'mode': mode,
                'seed': ParameterValue(LaunchConfiguration('seed'), value_type=int),
                'episodes': ParameterValue(LaunchConfiguration('episodes'), value_type=int),
                'image_height': ParameterValue(LaunchConfiguration('image_height'),
                                               value_type=int),
                'image_width': ParameterValue(LaunchConfiguration('image_width'),
                                              value_type=int),
                'episode_steps': ParameterValue(LaunchConfiguration('episode_steps'),
                                                value_type=int),
                'lockstep_timeout_s': ParameterValue(LaunchConfiguration('lockstep_timeout_s'),
                                                     value_type=float),
                'autostart': True,
                'policy_reset_service': 'act_node/reset',
            },
        ],
        arguments=log_args,
    )
    policy = LifecycleNode(
        package='act_ros',
        executable='act_node',
        name='act_node',
        namespace=LaunchConfiguration('namespace'),
        output='screen',
        emulate_tty=True,
        parameters=[
            LaunchConfiguration('act_params_file'),
            {
                'model_path': LaunchConfiguration('model_path'),
                'device': LaunchConfiguration('device'),
                'mode': LaunchConfiguration('policy_mode'),
                'trigger': PythonExpression(["'observation' if ", *lockstep, " else 'timer'"]),
                'execution': PythonExpression(["'sync' if ", *lockstep, " else 'process'"]),
                'pad_source': 'topic',
                'pad_pose_topic': 'pad_pose',
                'autostart': True,
                'use_sim_time': ParameterValue(LaunchConfiguration('use_sim_time'),
                                               value_type=bool),
            },
        ],
        arguments=log_args,
    )
    return LaunchDescription(arguments + [bridge, policy])
