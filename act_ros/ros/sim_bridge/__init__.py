"""``sim_bridge``: the MuJoCo task on ROS 2 topics (``python -m act_ros.ros.sim_bridge``)."""
