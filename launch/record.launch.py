"""Launch record_node: demonstrations on ROS 2 topics to a LeRobot v3 dataset.

    ros2 launch act_ros record.launch.py output:=/data/my_demos
    ros2 launch act_ros record.launch.py output:=/data/my_demos action_source:=leader \
        action_topic:=/leader/joint_states
    ros2 launch act_ros record.launch.py output:=/data/my_demos \
        wrist_image_topic:=/wrist_cam/image wrist_image_transport:=compressed

Then, per episode: ``ros2 service call /record_node/start_episode std_srvs/srv/Trigger``,
teleoperate, and ``.../save_episode`` (or ``.../discard_episode``).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments and the record_node."""
    arguments = [
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('act_ros'), 'config', 'record.yaml']),
            description='Recorder parameters (YAML, ros__parameters under record_node).'),
        DeclareLaunchArgument('output', description='Dataset directory to write. Required.'),
        DeclareLaunchArgument(
            'action_source', default_value='command',
            description='command: positions sent to the controller; leader: a leader arm.'),
        DeclareLaunchArgument(
            'action_topic', default_value='joint_trajectory_controller/joint_trajectory',
            description='Controller command topic, or the leader arm joint states.'),
        DeclareLaunchArgument(
            'max_episode_s', default_value='0.0',
            description='Save episodes automatically at this length (0: on ~/save_episode).'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the node; its relative topic names follow it.'),
        DeclareLaunchArgument(
            'joint_states_topic', default_value='joint_states',
            description='Remap the joint state input (sensor_msgs/JointState).'),
        DeclareLaunchArgument(
            'top_image_topic', default_value='camera/top/image_raw',
            description="Remap the 'top' camera input."),
        DeclareLaunchArgument(
            'wrist_image_topic', default_value='camera/wrist/image_raw',
            description="Remap the 'wrist' camera input."),
        DeclareLaunchArgument(
            'top_image_transport', default_value='',
            description="raw or compressed for the 'top' camera (empty: image_transport of "
                        'the parameter file); compressed reads <top_image_topic>/compressed.'),
        DeclareLaunchArgument(
            'wrist_image_transport', default_value='',
            description="raw or compressed for the 'wrist' camera (empty: image_transport).")
    ]
    node = Node(
        package='act_ros',
        executable='record_node',
        name='record_node',
        namespace=LaunchConfiguration('namespace'),
        output='screen',
        emulate_tty=True,
        parameters=[
            LaunchConfiguration('params_file'),
            {
                'output': LaunchConfiguration('output'),
                'action_source': LaunchConfiguration('action_source'),
                'action_topic': LaunchConfiguration('action_topic'),
                'max_episode_s': ParameterValue(LaunchConfiguration('max_episode_s'),
                                                value_type=float),
                'cameras.top.transport': ParameterValue(
                    LaunchConfiguration('top_image_transport'), value_type=str),
                'cameras.wrist.transport': ParameterValue(
                    LaunchConfiguration('wrist_image_transport'), value_type=str),
            },
        ],
        # A compressed camera is read on <topic>/compressed: both names follow the remap.
        remappings=[
            ('joint_states', LaunchConfiguration('joint_states_topic')),
            ('camera/top/image_raw', LaunchConfiguration('top_image_topic')),
            ('camera/top/image_raw/compressed',
             [LaunchConfiguration('top_image_topic'), '/compressed']),
            ('camera/wrist/image_raw', LaunchConfiguration('wrist_image_topic')),
            ('camera/wrist/image_raw/compressed',
             [LaunchConfiguration('wrist_image_topic'), '/compressed']),
        ],
    )
    return LaunchDescription(arguments + [node])
