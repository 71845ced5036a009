"""Offline training of ACT policies (``act-ros train``), closed-loop evaluation in the
simulation (``act-ros evaluate``), and the drivers that put a trained policy in the loop:
DAgger collection (:mod:`act_ros.training.drivers.dagger`, through ``act-ros collect --dagger``:
:mod:`act_ros.training.drivers.collect`) and its iterations (``act-ros dagger``). Never imports
rclpy."""
