"""Evaluation over ROS 2: ``sim_bridge`` and ``act_node`` as processes, driven episode by
episode (``python -m act_ros.ros.evaluation.ros_eval``)."""
