"""MuJoCo scene of the port-pick-align task: table, arm (from the URDF), box, pad, cameras.

The arm's bodies, joints and geometry come from the robot URDF through
:mod:`act_ros.sim.urdf_mjcf`, so the simulation and the node's forward kinematics share one
model. This module adds what only the simulation needs: servos (position actuators with
gravity compensation, like a hobby servo's internal loop), contact settings, the objects
and the cameras.
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from act_ros.core.control.kinematics import default_urdf_path
from act_ros.sim.config import SimConfig
from act_ros.sim.urdf_mjcf import UrdfModel, mjcf_body_tree, parse_urdf

ARM_JOINTS = ('shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll')
FINGER_JOINTS = ('gripper', 'gripper_mirror')
FINGER_LINKS = ('finger_left_link', 'finger_right_link')
GRIPPER_LINK = 'gripper_link'
EE_LINK = 'ee_link'
EE_SITE = 'ee_site'
BOX_BODY = 'box'
PAD_BODY = 'pad'
CAMERAS = ('top', 'wrist')

# Servo gains per arm joint: (kp [N m/rad], kv [N m s/rad]), close to critical damping for
# the link inertia plus armature, about 7-10 Hz bandwidth: a 30 Hz target stream is
# followed within ~2 ticks.
SERVO_GAINS = {
    'shoulder_pan': (40.0, 1.4),
    'shoulder_lift': (40.0, 1.4),
    'elbow_flex': (30.0, 1.0),
    'wrist_flex': (15.0, 0.5),
    'wrist_roll': (10.0, 0.3),
}
SERVO_FORCE_LIMIT = 5.0      # N m, stall torque class of an STS3215 servo
ARMATURE = 0.005             # kg m^2, reflected rotor inertia of a geared servo
FINGER_KP, FINGER_KV = 200.0, 4.0
FINGER_FORCE_LIMIT = 5.0     # N per finger

# Top camera: straight down over the middle of the workspace, image-up = +x (forward).
# The field of view spans where box and pad can lie (reach 0.13-0.225 m, |y| <= 0.16 m,
# plus the pad's half diagonal), about 0.35 m along x by 0.46 m along y at 4:3, with the
# arm's base at the bottom edge: the objects fill the frame, which is what lets a small
# model input (96x128) still show the box over several pixels (about 8).
TOP_CAMERA_POS = (0.175, 0.0, 0.8)
TOP_CAMERA_FOVY_DEG = 24.5

# Collision bits: (contype, conaffinity). The box meets everything; the arm meets the
# table, pad and box but not itself; the pad meets the box and arm, not the table it lies on.
_BOX_BITS = (1, 7)
_TABLE_BITS = (2, 0)
_PAD_BITS = (2, 4)
_ARM_BITS = (4, 2)


def lookat_xyaxes(pos: np.ndarray, target: np.ndarray, up: np.ndarray) -> str:
    """MJCF ``xyaxes`` of a camera at ``pos`` looking at ``target`` with image-up near ``up``."""
    forward = np.asarray(target, float) - np.asarray(pos, float)
    forward /= np.linalg.norm(forward)
    x = np.cross(forward, up)
    x /= np.linalg.norm(x)
    y = np.cross(x, forward)
    return ' '.join(f'{v:.6f}' for v in (*x, *y))


def _wrist_camera_xml() -> str:
    """Camera on the gripper, beside the palm, looking along the approach axis."""
    tilt = 0.45  # rad toward the fingers
    pos = np.array([-0.036, 0.0, 0.03])
    x = np.array([0.0, 1.0, 0.0])                       # fingers left/right in the image
    y = np.array([np.cos(tilt), 0.0, -np.sin(tilt)])
    axes = ' '.join(f'{v:.6f}' for v in (*x, *y))
    return (f'<camera name="wrist" pos="{pos[0]} {pos[1]} {pos[2]}" xyaxes="{axes}" fovy="75"/>'
            '<geom name="wrist_camera_housing" type="box" size="0.006 0.012 0.01" '
            'pos="-0.028 0 0.03" rgba="0.1 0.1 0.1 1" contype="0" conaffinity="0"/>')


def build_mjcf(config: SimConfig, urdf: UrdfModel) -> str:
    """The complete MJCF document of the scene for ``config``."""
    missing = [j for j in ARM_JOINTS + FINGER_JOINTS if j not in urdf.joints]
    missing += [name for name in (EE_LINK, GRIPPER_LINK) + FINGER_LINKS if name not in urdf.links]
    if missing:
        raise ValueError(f'robot model lacks {missing} (expected the so101_class layout)')
    finger_open_m = urdf.joints['gripper'].upper
    arm_geom = f'contype="{_ARM_BITS[0]}" conaffinity="{_ARM_BITS[1]}"'
    finger_geom = (f'{arm_geom} condim="4" friction="1.5 0.01 0.0001" '
                   'solref="0.004 1" solimp="0.95 0.99 0.001"')
    geom_attrs = {'*': arm_geom, FINGER_LINKS[0]: finger_geom, FINGER_LINKS[1]: finger_geom}
    link_extras = {
        GRIPPER_LINK: _wrist_camera_xml(),
        EE_LINK: f'<site name="{EE_SITE}" pos="0 0 0" size="0.004" rgba="1 0 0 0.0"/>',
    }
    arm = mjcf_body_tree(urdf, link_extras=link_extras, geom_attrs=geom_attrs,
                         joint_attrs=f'armature="{ARMATURE}" damping="0.02"',
                         body_attrs='gravcomp="1"')
    actuators = []
    for name in ARM_JOINTS:
        kp, kv = SERVO_GAINS[name]
        j = urdf.joints[name]
        actuators.append(f'<position name="{name}" joint="{name}" kp="{kp}" kv="{kv}" '
                         f'ctrlrange="{j.lower} {j.upper}" '
                         f'forcerange="-{SERVO_FORCE_LIMIT} {SERVO_FORCE_LIMIT}"/>')
    for name in FINGER_JOINTS:
        actuators.append(f'<position name="{name}" joint="{name}" kp="{FINGER_KP}" '
                         f'kv="{FINGER_KV}" ctrlrange="0 {finger_open_m}" '
                         f'forcerange="-{FINGER_FORCE_LIMIT} {FINGER_FORCE_LIMIT}"/>')
    half_box = config.box_size_m / 2.0
    half_pad = config.pad_size_m / 2.0
    half_thick = config.pad_thickness_m / 2.0
    top_pos = np.array(TOP_CAMERA_POS)
    top_axes = lookat_xyaxes(top_pos, np.array([top_pos[0], top_pos[1], 0.0]),
                             np.array([1.0, 0.0, 0.0]))
    box_inertia = config.box_mass_kg * config.box_size_m ** 2 / 6.0
    return f"""<mujoco model="port_pick_align">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{config.timestep_s:.10g}" integrator="implicitfast" cone="elliptic"
          impratio="10"/>
  <visual>
    <global offwidth="{max(config.camera_width, 640)}"
            offheight="{max(config.camera_height, 480)}"/>
    <quality offsamples="{config.render_msaa_samples}" shadowsize="0"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.35 0.35 0.35" specular="0 0 0"/>
  </visual>
  <worldbody>
    <light name="sun" directional="true" pos="0 0 2" dir="0.2 0.1 -1" castshadow="false"
           diffuse="0.5 0.5 0.5"/>
    <geom name="floor" type="plane" size="2 2 0.1" pos="0 0 -0.75" rgba="0.3 0.3 0.32 1"
          contype="0" conaffinity="0"/>
    <geom name="table" type="box" size="0.45 0.55 0.02" pos="0.15 0 -0.02"
          rgba="0.62 0.5 0.38 1" contype="{_TABLE_BITS[0]}" conaffinity="{_TABLE_BITS[1]}"
          friction="0.6 0.005 0.0001"/>
    <camera name="top" pos="{top_pos[0]} {top_pos[1]} {top_pos[2]}" xyaxes="{top_axes}"
            fovy="{TOP_CAMERA_FOVY_DEG}"/>
{arm}
    <body name="{BOX_BODY}" pos="0.2 0 {half_box}">
      <freejoint name="box_free"/>
      <inertial pos="0 0 0" mass="{config.box_mass_kg}"
                diaginertia="{box_inertia} {box_inertia} {box_inertia}"/>
      <geom name="box_geom" type="box" size="{half_box} {half_box} {half_box}"
            rgba="0.95 0.45 0.1 1" condim="4" friction="{config.box_friction} 0.01 0.0001"
            contype="{_BOX_BITS[0]}" conaffinity="{_BOX_BITS[1]}"/>
    </body>
    <body name="{PAD_BODY}" mocap="true" pos="0.2 0.1 0">
      <geom name="pad_geom" type="box" size="{half_pad} {half_pad} {half_thick}"
            pos="0 0 {half_thick}" rgba="0.2 0.7 0.3 1" friction="0.8 0.01 0.0001"
            contype="{_PAD_BITS[0]}" conaffinity="{_PAD_BITS[1]}"/>
      <geom name="pad_stripe" type="box" size="{half_pad * 0.45} {half_pad * 0.12} 0.0005"
            pos="{half_pad * 0.45} 0 {2 * half_thick}" rgba="0.05 0.15 0.05 1"
            contype="0" conaffinity="0"/>
      <geom name="pad_arrow" type="box" size="{half_pad * 0.14} {half_pad * 0.14} 0.0005"
            pos="{half_pad * 0.78} 0 {2 * half_thick}" quat="0.92388 0 0 0.382683"
            rgba="0.05 0.15 0.05 1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <contact>
    <exclude body1="{FINGER_LINKS[0]}" body2="{FINGER_LINKS[1]}"/>
  </contact>
  <actuator>
    {chr(10).join('    ' + a for a in actuators).strip()}
  </actuator>
</mujoco>
"""


def build_model(config: SimConfig) -> tuple[mujoco.MjModel, UrdfModel]:
    """Compile the scene; returns the MuJoCo model and the parsed robot URDF."""
    urdf_path = Path(config.urdf_path) if config.urdf_path else default_urdf_path()
    urdf = parse_urdf(urdf_path)
    xml = build_mjcf(config, urdf)
    try:
        model = mujoco.MjModel.from_xml_string(xml)
    except ValueError as exc:
        raise ValueError(f'scene built from {urdf_path} does not compile: {exc}') from exc
    return model, urdf
