"""The control path: from the newest inputs to a safe joint command.

The input store and message decoding (``inputs``, ``decode``), the safety chain and its
speed limits (``safety``, ``speed_limits``), the release gate (``release_gate``), the
end-effector kinematics (``kinematics``), the planned command (``command_plan``), seam
metering (``seams``) and the control step that ties them to the policy runtime
(``loop``). ROS-free; imports :mod:`act_ros.core.inference` and the ground floor below it
(docs/architecture.md, section 1).
"""
