"""Evaluation over ROS 2: ``sim_bridge`` and ``act_node`` as processes, driven episode by
episode (``act-ros ros-eval``)."""
