"""RViz with rviz/act.rviz: the robot model, the cameras, act_node's planned path and gate.

    ros2 launch act_ros rviz.launch.py                  # beside a running act_node
    ros2 launch act_ros act.launch.py model_path:=... rviz:=true   # includes this file

Starts robot_state_publisher with the package's URDF (the gripper joint normalized 0..1 as
in joint_states, act_ros.ros.robot_description) so RViz can draw the arm, and rviz2 with
the config. robot_state_publisher:=false leaves the TF tree to the robot's own bringup.
Needs the rviz2 and robot_state_publisher packages (a desktop install has both); the
robot itself does not, which is why package.xml does not require them.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from act_ros.ros.robot_description import display_description


def generate_launch_description() -> LaunchDescription:
    """Declare the launch arguments, robot_state_publisher and rviz2."""
    arguments = [
        DeclareLaunchArgument(
            'rviz_config',
            default_value=PathJoinSubstitution([FindPackageShare('act_ros'), 'rviz', 'act.rviz']),
            description='RViz configuration (topics of act_node at the root namespace).'),
        DeclareLaunchArgument(
            'robot_state_publisher', default_value='true',
            description='Start robot_state_publisher with the package URDF (false: the '
                        "robot's own publishes the TF tree)."),
        DeclareLaunchArgument(
            'joint_states_topic', default_value='joint_states',
            description='Joint states that robot_state_publisher turns into the TF tree.'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of robot_state_publisher (its robot_description and '
                        'joint_states follow it).'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false',
            description='Use /clock (simulation) instead of the system clock.'),
    ]
    use_sim_time = ParameterValue(LaunchConfiguration('use_sim_time'), value_type=bool)
    state_publisher = Node(
        package='robot_state_publisher',
        executable='robot_state_publisher',
        namespace=LaunchConfiguration('namespace'),
        output='screen',
        parameters=[{
            'robot_description': ParameterValue(display_description(), value_type=str),
            'use_sim_time': use_sim_time,
        }],
        remappings=[('joint_states', LaunchConfiguration('joint_states_topic'))],
        condition=IfCondition(LaunchConfiguration('robot_state_publisher')),
    )
    rviz = Node(
        package='rviz2',
        executable='rviz2',
        name='rviz2',
        output='screen',
        arguments=['-d', LaunchConfiguration('rviz_config')],
        parameters=[{'use_sim_time': use_sim_time}],
    )
    return LaunchDescription(arguments + [state_publisher, rviz])
