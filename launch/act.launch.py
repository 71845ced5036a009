"""Launch act_node, the ACT policy lifecycle node, with its parameters from config/act.yaml.

    ros2 launch act_ros act.launch.py model_path:=/path/to/pretrained_model
    ros2 launch act_ros act.launch.py model_path:=... namespace:=arm device:=cuda \
        joint_states_topic:=/joint_states

By default the node configures and activates itself (autostart:=true); with
autostart:=false it waits in the unconfigured state for a lifecycle manager
(`ros2 lifecycle set /act_node configure`, then `activate`).

rviz:=true also starts RViz with rviz/act.rviz (launch/rviz.launch.py: the robot model, the
cameras, the planned end-effector path and the release gate; docs/visualization.md).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments and the act_node lifecycle node."""
    arguments = [
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('act_ros'), 'config', 'act.yaml']),
            description='Node parameters (YAML, ros__parameters under act_node).'),
        DeclareLaunchArgument(
            'model_path',
            description='Checkpoint directory (LeRobot pretrained_model) or Hub id '
                        'org/name[@revision][/subfolder]. Required.'),
        DeclareLaunchArgument(
            'device', default_value='auto',
            description='Inference device: auto (MPS, then CUDA, then CPU), cpu, cuda, cuda:N '
                        'or mps. A missing explicit device fails configure.'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the node; its relative topic names follow it.'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false',
            description='Use /clock (simulation) instead of the system clock.'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            description='Logging level: debug, info, warn, error or fatal.'),
        DeclareLaunchArgument(
            'autostart', default_value='true',
            description='Configure and activate on start-up; false to wait for a lifecycle '
                        'manager.'),
        DeclareLaunchArgument(
            'joint_states_topic', default_value='joint_states',
            description='Remap the joint state input (sensor_msgs/JointState).'),
        DeclareLaunchArgument(
            'top_image_topic', default_value='camera/top/image_raw',
            description="Remap the 'top' camera input (raw image transport)."),
        DeclareLaunchArgument(
            'wrist_image_topic', default_value='camera/wrist/image_raw',
            description="Remap the 'wrist' camera input (raw image transport)."),
        DeclareLaunchArgument(
            'rviz', default_value='false',
            description='Also start RViz with rviz/act.rviz and robot_state_publisher '
                        '(launch/rviz.launch.py; needs rviz2 and robot_state_publisher).'),
    ]

    node = LifecycleNode(
        package='act_ros',
        executable='act_node',
        name='act_node',
        namespace=LaunchConfiguration('namespace'),
        output='screen',
        emulate_tty=True,
        parameters=[
            LaunchConfiguration('params_file'),
            {
                'model_path': LaunchConfiguration('model_path'),
                'device': LaunchConfiguration('device'),
                'autostart': ParameterValue(LaunchConfiguration('autostart'), value_type=bool),
                'use_sim_time': ParameterValue(LaunchConfiguration('use_sim_time'),
                                               value_type=bool),
            },
        ],
        remappings=[
            ('joint_states', LaunchConfiguration('joint_states_topic')),
            ('camera/top/image_raw', LaunchConfiguration('top_image_topic')),
            ('camera/wrist/image_raw', LaunchConfiguration('wrist_image_topic')),
        ],
        arguments=['--ros-args', '--log-level', LaunchConfiguration('log_level')],
    )
    rviz = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare('act_ros'), 'launch', 'rviz.launch.py'])),
        launch_arguments={
            'joint_states_topic': LaunchConfiguration('joint_states_topic'),
            'namespace': LaunchConfiguration('namespace'),
            'use_sim_time': LaunchConfiguration('use_sim_time'),
        }.items(),
        condition=IfCondition(LaunchConfiguration('rviz')),
    )
    return LaunchDescription(arguments + [node, rviz])
