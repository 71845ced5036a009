"""act_ros: run and train LeRobot ACT policies on ROS 2 arms."""

__version__ = '0.1.0'
