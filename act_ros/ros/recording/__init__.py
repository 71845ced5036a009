"""Demonstrations over ROS 2: ``record_node`` and the scripted expert as a teleoperator."""
