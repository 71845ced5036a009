"""Translate the robot URDF into an MJCF body tree, so both share one kinematic model.

Only the subset the package's robot model uses is supported: revolute, prismatic and fixed
joints; box, cylinder and sphere geometry; materials by name or inline colour; diagonal
inertias. Anything else raises ``ValueError`` naming the element, so a model that the
simulation would silently misread cannot load.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class UrdfJoint:
    name: str
    type: str
    parent: str
    child: str
    xyz: np.ndarray
    rpy: np.ndarray
    axis: np.ndarray
    lower: float = 0.0
    upper: float = 0.0
    mimic: str | None = None


@dataclass
class UrdfLink:
    name: str
    mass: float = 0.0
    com: np.ndarray = field(default_factory=lambda: np.zeros(3))
    inertia: np.ndarray = field(default_factory=lambda: np.zeros(3))
    geoms: list[dict] = field(default_factory=list)


@dataclass
class UrdfModel:
    """The parsed robot: links by name, joints by name, and the root link."""

    name: str
    links: dict[str, UrdfLink]
    joints: dict[str, UrdfJoint]
    root: str

    def child_joints(self, link: str) -> list[UrdfJoint]:
        return [j for j in self.joints.values() if j.parent == link]


def _vec(text: str | None, n: int, default: float = 0.0) -> np.ndarray:
    if text is None:
        return np.full(n, default)
    values = [float(v) for v in text.split()]
    if len(values) != n:
        raise ValueError(f'expected {n} numbers, got {text!r}')
    return np.array(values)


def _origin(elem: ET.Element | None) -> tuple[np.ndarray, np.ndarray]:
    if elem is None:
        return np.zeros(3), np.zeros(3)
    return _vec(elem.get('xyz'), 3), _vec(elem.get('rpy'), 3)


def rpy_to_quat(rpy: np.ndarray) -> np.ndarray:
    """URDF roll-pitch-yaw (fixed axes X, Y, Z) to a MuJoCo quaternion (w, x, y, z)."""
    r, p, y = (float(a) / 2.0 for a in rpy)
    cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    return np.array([cr * cp * cy + sr * sp * sy, sr * cp * cy - cr * sp * sy,
                     cr * sp * cy + sr * cp * sy, cr * cp * sy - sr * sp * cy])


def parse_urdf(path: str | Path) -> UrdfModel:
    """Read a URDF file into a :class:`UrdfModel` (see the module docstring for the subset)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'robot model (URDF) not found: {path}')
    root = ET.parse(path).getroot()
    if root.tag != 'robot':
        raise ValueError(f'{path}: expected a <robot> root element, got <{root.tag}>')
    colors = {m.get('name'): _vec(m.find('color').get('rgba'), 4)
              for m in root.findall('material') if m.find('color') is not None}
    links: dict[str, UrdfLink] = {}
    for le in root.findall('link'):
        link = UrdfLink(le.get('name'))
        inertial = le.find('inertial')
        if inertial is not None:
            xyz, rpy = _origin(inertial.find('origin'))
            if np.any(rpy != 0.0):
                raise ValueError(f"{path}: link '{link.name}': rotated inertial frames are not "
                                 'supported')
            link.mass = float(inertial.find('mass').get('value'))
            link.com = xyz
            ie = inertial.find('inertia')
            if any(float(ie.get(k, 0.0)) != 0.0 for k in ('ixy', 'ixz', 'iyz')):
                raise ValueError(f"{path}: link '{link.name}': only diagonal inertias supported")
            link.inertia = np.array([float(ie.get(k)) for k in ('ixx', 'iyy', 'izz')])
        # Visual and collision entries describe the same primitives: take collisions as the
        # physical shape and the visual colours in the same order.
        visual_colors = []
        for ve in le.findall('visual'):
            me = ve.find('material')
            rgba = None
            if me is not None:
                ce = me.find('color')
                rgba = _vec(ce.get('rgba'), 4) if ce is not None else colors.get(me.get('name'))
            visual_colors.append(rgba)
        for i, ce in enumerate(le.findall('collision')):
            xyz, rpy = _origin(ce.find('origin'))
            geometry = ce.find('geometry')
            shape = geometry[0] if geometry is not None and len(geometry) else None
            if shape is None:
                raise ValueError(f"{path}: link '{link.name}': collision without geometry")
            if shape.tag == 'box':
                geom = {'type': 'box', 'size': _vec(shape.get('size'), 3) / 2.0}
            elif shape.tag == 'cylinder':
                geom = {'type': 'cylinder', 'size': np.array(
                    [float(shape.get('radius')), float(shape.get('length')) / 2.0])}
            elif shape.tag == 'sphere':
                geom = {'type': 'sphere', 'size': np.array([float(shape.get('radius'))])}
            else:
                raise ValueError(f"{path}: link '{link.name}': geometry <{shape.tag}> is not "
                                 'supported (expected box, cylinder or sphere)')
            geom.update(pos=xyz, quat=rpy_to_quat(rpy),
                        rgba=visual_colors[i] if i < len(visual_colors) else None)
            link.geoms.append(geom)
        links[link.name] = link
    joints: dict[str, UrdfJoint] = {}
    for je in root.findall('joint'):
        jtype = je.get('type')
        if jtype not in ('revolute', 'prismatic', 'fixed'):
            raise ValueError(f"{path}: joint '{je.get('name')}' has type '{jtype}', expected "
                             'revolute, prismatic or fixed')
        xyz, rpy = _origin(je.find('origin'))
        axis_e = je.find('axis')
        joint = UrdfJoint(je.get('name'), jtype, je.find('parent').get('link'),
                          je.find('child').get('link'), xyz, rpy,
                          _vec(axis_e.get('xyz') if axis_e is not None else None, 3, 0.0))
        if jtype != 'fixed':
            limit = je.find('limit')
            if limit is None:
                raise ValueError(f"{path}: joint '{joint.name}' has no <limit>")
            joint.lower, joint.upper = float(limit.get('lower')), float(limit.get('upper'))
            if je.find('mimic') is not None:
                joint.mimic = je.find('mimic').get('joint')
        for end in (joint.parent, joint.child):
            if end not in links:
                raise ValueError(f"{path}: joint '{joint.name}' refers to unknown link '{end}'")
        joints[joint.name] = joint
    children = {j.child for j in joints.values()}
    roots = [n for n in links if n not in children]
    if len(roots) != 1:
        raise ValueError(f'{path}: expected one root link, found {roots}')
    return UrdfModel(root.get('name', path.stem), links, joints, roots[0])


def _fmt(values: np.ndarray) -> str:
    return ' '.join(f'{float(v):.10g}' for v in np.ravel(values))


def mjcf_body_tree(model: UrdfModel, *, link_extras: dict[str, str] | None = None,
                   geom_attrs: dict[str, str] | None = None,
                   joint_attrs: str = '', body_attrs: str = '') -> str:
    """MJCF ``<body>`` elements for every link below the root (the root's geoms included).

    The root link becomes a fixed body at the origin of the enclosing MJCF frame. Each
    URDF joint becomes a child body at the joint origin with a hinge/slide joint of the same
    name, axis and range (fixed joints give a body without a joint). ``link_extras`` adds
    raw MJCF (sites, cameras) inside a link's body; ``geom_attrs`` adds attributes to the
    geoms of a link (key ``'*'`` for every link).
    """
    link_extras = link_extras or {}
    geom_attrs = geom_attrs or {}

    def link_content(name: str, indent: str) -> list[str]:
        link = model.links[name]
        out = []
        if link.mass > 0.0:
            out.append(f'{indent}<inertial pos="{_fmt(link.com)}" mass="{link.mass:.10g}" '
                       f'diaginertia="{_fmt(link.inertia)}"/>')
        extra = geom_attrs.get(name, geom_attrs.get('*', ''))
        for i, g in enumerate(link.geoms):
            rgba = f' rgba="{_fmt(g["rgba"])}"' if g['rgba'] is not None else ''
            out.append(f'{indent}<geom name="{name}_geom{i}" type="{g["type"]}" '
                       f'size="{_fmt(g["size"])}" pos="{_fmt(g["pos"])}" '
                       f'quat="{_fmt(g["quat"])}"{rgba} {extra}/>')
        if name in link_extras:
            out.append(indent + link_extras[name])
        for joint in model.child_joints(name):
            out.extend(joint_body(joint, indent))
        return out

    def joint_body(joint: UrdfJoint, indent: str) -> list[str]:
        child = joint.child
        out = [(f'{indent}<body name="{child}" pos="{_fmt(joint.xyz)}" '
                f'quat="{_fmt(rpy_to_quat(joint.rpy))}" {body_attrs}>')]
        if joint.type != 'fixed':
            kind = 'hinge' if joint.type == 'revolute' else 'slide'
            out.append(f'{indent}  <joint name="{joint.name}" type="{kind}" '
                       f'axis="{_fmt(joint.axis)}" range="{joint.lower:.10g} {joint.upper:.10g}" '
                       f'limited="true" {joint_attrs}/>')
        out.extend(link_content(child, indent + '  '))
        out.append(f'{indent}</body>')
        return out

    lines = [f'<body name="{model.root}">'] + link_content(model.root, '  ') + ['</body>']
    return '\n'.join(lines)
