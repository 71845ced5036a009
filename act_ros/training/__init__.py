"""Offline training of ACT policies (``act-ros train``) and closed-loop evaluation in the
simulation (``act-ros evaluate``). Never imports rclpy."""
