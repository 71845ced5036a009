"""Launch record_node: demonstrations on ROS 2 topics to a LeRobot v3 dataset.

    ros2 launch act_ros record.launch.py output:=/data/my_demos
    ros2 launch act_ros record.launch.py output:=/data/my_demos action_source:=leader \
        action_topic:=/leader/joint_states
    ros2 launch act_ros record.launch.py output:=/data/my_demos \
        wrist_image_topic:=/wrist_cam/image wrist_image_transport:=compressed
    ros2 launch act_ros record.launch.py params_file:=my_recorder.yaml

Which value wins (act_ros.ros.launch_arguments): the params file (default
config/record.yaml) over the node's own defaults, and a launch argument you give over the
file; an argument you do not give passes nothing, so the file's action_source,
action_topic, max_episode_s, topics and transports stay as they are.

Then, per episode: ``ros2 service call /record_node/start_episode std_srvs/srv/Trigger``,
teleoperate, and ``.../save_episode`` (or ``.../discard_episode``).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from act_ros.ros.launch_arguments import RECORD_NODE_ARGUMENTS, parameter_sources

def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments; the node is made from their values (launch_setup)."""
    arguments = [
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('act_ros'), 'config', 'record.yaml']),
            description='Recorder parameters (YAML, ros__parameters under record_node); a '
                        'launch argument given wins over them.'),
        DeclareLaunchArgument(
            'output', default_value='',
            description='Dataset directory to write (required here or in the params file).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'action_source', default_value='',
            description='command: positions sent to the controller; leader: a leader arm.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'action_topic', default_value='',
            description='Controller command topic, or the leader arm joint states.'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'max_episode_s', default_value='',
            description='Save episodes automatically at this length (0: on ~/save_episode).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the node; its relative topic names follow it.'),
        DeclareLaunchArgument(
            'joint_states_topic', default_value='',
            description='Joint state input (sensor_msgs/JointState).'
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'top_image_topic', default_value='',
            description="The 'top' camera's topic (compressed: <topic>/compressed)."
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'wrist_image_topic', default_value='',
            description="The 'wrist' camera's topic (compressed: <topic>/compressed)."
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'top_image_transport', default_value='',
            description="raw or compressed for the 'top' camera."
                        ' Empty (default): the params file decides.'),
        DeclareLaunchArgument(
            'wrist_image_transport', default_value='',
            description="raw or compressed for the 'wrist' camera."
                        ' Empty (default): the params file decides.'),
    ]
    return LaunchDescription(arguments + [OpaqueFunction(function=launch_setup)])


def launch_setup(context, *args, **kwargs) -> list:
    """The record_node, from the launch arguments' values."""
    values = context.launch_configurations
    return [Node(
        package='act_ros',
        executable='record_node',
        name='record_node',
        namespace=values['namespace'],
        output='screen',
        emulate_tty=True,
        parameters=parameter_sources([values['params_file']], values, RECORD_NODE_ARGUMENTS),
    )]
