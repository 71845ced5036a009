"""Launch act_node, the ACT policy lifecycle node, with its parameters from a params file.

    ros2 launch act_ros act.launch.py model_path:=/path/to/pretrained_model
    ros2 launch act_ros act.launch.py params_file:=my_arm.yaml
    ros2 launch act_ros act.launch.py model_path:=... namespace:=arm device:=cuda \
        joint_states_topic:=/joint_states

Which value wins (act_ros.ros.launch_arguments): the params file (default
config/act.yaml) over the node's own defaults, and a launch argument you give over the
file. An argument you do not give passes nothing: `autostart: false` in my_arm.yaml stays
false (the node waits in the unconfigured state for a lifecycle manager: `ros2 lifecycle
set /act_node configure`, then `activate`), and so does every other value of the file.

rviz:=true also starts RViz with rviz/act.rviz (launch/rviz.launch.py: the robot model, the
cameras, the planned end-effector path and the release gate; docs/visualization.md).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.substitutions import FindPackageShare

from act_ros.ros.launch_arguments import ACT_NODE_ARGUMENTS, given, parameter_sources

# Passed on to launch/rviz.launch.py when given (its namespace always).
RVIZ_ARGUMENTS = ('joint_states_topic', 'use_sim_time')

def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments; the node is made from their values (launch_setup)."""
    arguments = [
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('act_ros'), 'config', 'act.yaml']),
            description='Node parameters (YAML, ros__parameters under act_node); they win '
                        "over the node's defaults, a launch argument given wins over them."),
        DeclareLaunchArgument(
            'model_path', default_value='',
            description='Checkpoint directory (LeRobot pretrained_model) or Hub id '
                        'org/name[@revision][/subfolder].'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'device', default_value='',
            description='Inference device: auto (MPS, then CUDA, then CPU), cpu, cuda, cuda:N '
                        'or mps. A missing explicit device fails configure.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the node; its relative topic names follow it.'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='',
            description='true: use /clock (simulation) instead of the system clock.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            description='Logging level: debug, info, warn, error or fatal.'),
        DeclareLaunchArgument(
            'autostart', default_value='',
            description='true: configure and activate on start-up; false: wait for a '
                        'lifecycle manager.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'joint_states_topic', default_value='',
            description='Joint state input (sensor_msgs/JointState), parameter '
                        'joint_states_topic.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'top_image_topic', default_value='',
            description="The 'top' camera's topic, parameter cameras.top.topic."
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'wrist_image_topic', default_value='',
            description="The 'wrist' camera's topic, parameter cameras.wrist.topic."
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'rviz', default_value='false',
            description='Also start RViz with rviz/act.rviz and robot_state_publisher '
                        '(launch/rviz.launch.py; needs rviz2 and robot_state_publisher).'),
    ]
    return LaunchDescription(arguments + [OpaqueFunction(function=launch_setup)])


def launch_setup(context, *args, **kwargs) -> list:
    """The node and the RViz include, from the launch arguments' values."""
    values = context.launch_configurations
    node = LifecycleNode(
        package='act_ros',
        executable='act_node',
        name='act_node',
        namespace=values['namespace'],
        output='screen',
        emulate_tty=True,
        parameters=parameter_sources([values['params_file']], values, ACT_NODE_ARGUMENTS),
        arguments=['--ros-args', '--log-level', values['log_level']],
    )
    # RViz's robot_state_publisher: the joint states topic and the clock, when given.
    passed = {name: values[name] for name in RVIZ_ARGUMENTS if given(values, name)}
    rviz = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare('act_ros'), 'launch', 'rviz.launch.py'])),
        launch_arguments={'namespace': values['namespace'], **passed}.items(),
        condition=IfCondition(LaunchConfiguration('rviz')),
    )
    return [node, rviz]
