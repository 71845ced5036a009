"""``act_node``: the policy as a ROS 2 lifecycle node (parameters, interfaces, status)."""
