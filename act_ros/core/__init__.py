"""ROS-free core of act_ros: contract, policy runtime, chunking, safety, release gate.

Nothing under ``act_ros.core`` imports rclpy; the ROS adapters in ``act_ros.ros`` build on it.
"""
