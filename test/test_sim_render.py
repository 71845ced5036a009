"""Headless rendering of the top and wrist cameras (MUJOCO_GL=egl, set in conftest)."""


import numpy as np
import pytest

pytest.importorskip('mujoco')

from act_ros.sim import PortPickAlignEnv, SimConfig  # noqa: E402

pytestmark = pytest.mark.sim


def _check_images(images, height, width):
    assert set(images) == {'top', 'wrist'}
    for name, image in images.items():
        assert image.shape == (height, width, 3), name
        assert image.dtype == np.uint8, name
        # Non-empty: real content with contrast, not a blank or single-colour frame.
        assert image.std() > 10.0, name
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20, name
    assert not np.array_equal(images['top'], images['wrist'])
    assert np.abs(images['top'].astype(int) - images['wrist'].astype(int)).mean() > 10.0


def test_both_cameras_render_small_and_follow_the_scene():
    with PortPickAlignEnv(SimConfig.from_yaml(camera_height=96, camera_width=128)) as env:
        obs = env.reset(seed=0)
        _check_images(obs.images, 96, 128)
        # The orange box is visible from the top camera, and it moves with the seed.
        other = env.reset(seed=1).images['top']
        assert not np.array_equal(obs.images['top'], other)
        orange = (obs.images['top'][..., 0] > 180) & (obs.images['top'][..., 2] < 90)
        assert orange.sum() > 5
        # Moving the arm changes the wrist view.
        moved = obs.joint_positions + np.array([0.4, 0.0, 0.0, 0.0, 0.6, 0.0])
        for _ in range(15):
            later = env.step(moved)
        change = later.images['wrist'].astype(int) - obs.images['wrist'].astype(int)
        assert np.abs(change).mean() > 2


def test_full_size_render_and_render_off():
    with PortPickAlignEnv(SimConfig.from_yaml()) as env:
        obs = env.reset(seed=3)
        _check_images(obs.images, 480, 640)
        _check_images(env.render(), 480, 640)  # its speed: act-ros bench (no bound here)
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as env:
        assert env.reset(seed=3).images == {}


def test_rendering_works_in_a_plain_shell_without_gl_settings():
    """Entry points pick a headless GL backend themselves: no MUJOCO_GL, no display."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ('MUJOCO_GL', 'PYOPENGL_PLATFORM', 'DISPLAY', 'WAYLAND_DISPLAY')}
    code = ('import os\n'
            'from act_ros.sim import PortPickAlignEnv, SimConfig\n'
            'with PortPickAlignEnv(SimConfig.from_yaml(None, camera_height=48, camera_width=64)) as e:\n'
            '    o = e.reset(seed=1)\n'
            '    assert o.images["top"].shape == (48, 64, 3) and o.images["top"].any()\n'
            'print(os.environ["MUJOCO_GL"])\n')
    proc = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == 'egl'


def _square_angle_deg(mask):
    """(angle modulo 90 degrees, side ratio) of the rectangle fit to a mask's pixels."""
    import cv2

    ys, xs = np.nonzero(mask)
    (_, _), (w, h), angle = cv2.minAreaRect(np.stack([xs, ys], 1).astype(np.float32))
    return angle % 90.0, min(w, h) / max(w, h)


def test_the_top_camera_shows_the_box_and_pad_at_their_recorded_yaws():
    """The labels a pose head learns from: where the top camera sees the box and the pad
    whole, their squares' orientation is their recorded yaw (modulo 90 degrees; the image
    y axis points down, so the angle turns the other way)."""
    checked = {'box': 0, 'pad': 0}
    with PortPickAlignEnv(SimConfig.from_yaml(camera_height=240, camera_width=320)) as env:
        for seed in range(12):
            obs = env.reset(seed=seed)
            image = obs.images['top'].astype(int)
            r, g, b = image[..., 0], image[..., 1], image[..., 2]
            masks = {'pad': (g > r + 60) & (g > b + 60),  # green plate (its dark stripe aside)
                     'box': (r > g + 60) & (r > b + 100)}  # orange cube
            for name, yaw in (('box', obs.box_pose[3]), ('pad', obs.pad_pose[3])):
                if masks[name].sum() < 50:
                    continue
                angle, squareness = _square_angle_deg(masks[name])
                if squareness < 0.9:  # partly hidden under the arm: not a whole square
                    continue
                error = (angle + np.degrees(yaw) + 45.0) % 90.0 - 45.0
                assert abs(error) < 3.0, (seed, name, angle, np.degrees(yaw))
                checked[name] += 1
    assert checked['box'] >= 6 and checked['pad'] >= 6, checked
