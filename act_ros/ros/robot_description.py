"""The robot model for ``robot_state_publisher`` and RViz, from the package's URDF.

``joint_states`` carries the gripper as the contract does: normalized, 0 closed and 1
open. In the URDF the gripper is a prismatic finger joint in metres (0 to its upper limit,
2.5 cm), so ``robot_state_publisher`` fed the normalized value would slide the fingers up
to a metre. :func:`display_description` returns the URDF with the gripper as the contract
has it: a joint of that name from 0 to 1 (on a link without geometry), which both finger
joints follow as mimic joints scaled by the finger travel. Forward kinematics and the
simulation keep reading the URDF file itself. No ROS import: the launch file calls this.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from act_ros.core.control.kinematics import default_urdf_path

GRIPPER_JOINT = 'gripper'


def display_description(urdf_path: str | Path | None = None,
                        grippers: Sequence[str] = (GRIPPER_JOINT,)) -> str:
    """The URDF text for ``robot_state_publisher``'s ``robot_description`` (see above).

    ``grippers``: the contract's gripper joints (the package arm's one by default); each
    that is a prismatic joint of the model becomes a normalized joint of that name. Any
    other (missing, or not prismatic) is left unchanged.
    """
    path = Path(urdf_path) if urdf_path else default_urdf_path()
    root = ET.fromstring(path.read_text())
    for gripper_joint in grippers:
        _normalize_gripper(root, gripper_joint)
    return ET.tostring(root, encoding='unicode')


def _normalize_gripper(root: ET.Element, gripper_joint: str) -> None:
    joints = {j.get('name'): j for j in root.findall('joint')}
    finger = joints.get(gripper_joint)
    if finger is None or finger.get('type') != 'prismatic' or finger.find('mimic') is not None:
        return
    limit = finger.find('limit')
    travel = float(limit.get('upper', '0')) if limit is not None else 0.0
    if travel <= 0.0:
        return
    finger_name = f'{gripper_joint}_finger'
    finger.set('name', finger_name)
    # The normalized gripper of the contract, on a link of its own (no geometry).
    parent = finger.find('parent').get('link')
    command_link = f'{gripper_joint}_command'
    ET.SubElement(root, 'link', name=command_link)
    joint = ET.SubElement(root, 'joint', name=gripper_joint, type='prismatic')
    ET.SubElement(joint, 'parent', link=parent)
    ET.SubElement(joint, 'child', link=command_link)
    axis = finger.find('axis')
    ET.SubElement(joint, 'axis', xyz=axis.get('xyz') if axis is not None else '1 0 0')
    ET.SubElement(joint, 'limit', lower='0', upper='1',
                  effort=limit.get('effort', '0'), velocity=limit.get('velocity', '0'))
    # Every finger joint follows it: the finger itself, and those that mimicked the finger.
    ET.SubElement(finger, 'mimic', joint=gripper_joint, multiplier=repr(travel), offset='0')
    for other in joints.values():
        mimic = other.find('mimic')
        if other is not finger and mimic is not None and mimic.get('joint') == gripper_joint:
            mimic.set('multiplier', repr(float(mimic.get('multiplier', '1')) * travel))
            mimic.set('offset', mimic.get('offset', '0'))
