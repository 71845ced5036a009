"""Port-pick-align environment: config, seeding, stepping, FK parity with the URDF."""

import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip('mujoco')

from act_ros.core.contract import load_contract  # noqa: E402
from act_ros.sim import PortPickAlignEnv, SimConfig  # noqa: E402
from act_ros.sim.env import sample_layout  # noqa: E402
from act_ros.sim.metrics import EpisodeResult, summarize_results, symmetric_yaw_error_deg  # noqa: E402

pytestmark = pytest.mark.sim


@pytest.fixture(scope='module')
def env():
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as environment:
        yield environment


def test_config_file_loads_with_the_documented_values():
    cfg = SimConfig.from_yaml()
    assert cfg.fps == 30 and cfg.episode_steps == 300
    assert (cfg.camera_height, cfg.camera_width) == (480, 640)
    assert cfg.substeps * cfg.timestep_s == pytest.approx(1 / 30)
    assert cfg.timestep_s <= cfg.physics_timestep_s


@pytest.mark.parametrize('overrides, message', [
    ({'box_x_range_m': (0.3, 0.1)}, 'box_x_range_m'),
    ({'reach_min_m': 0.3}, 'reach_min_m'),
    ({'home_joint_positions': (0.0,) * 5}, '6 values'),
    ({'min_separation_m': 0.01}, 'overlap'),
    ({'physics_timestep_s': 0.1}, 'physics_timestep_s'),
    ({'camera_height': 0}, 'camera size'),
])
def test_invalid_config_is_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**overrides)


def test_unknown_yaml_key_is_rejected(tmp_path):
    path = tmp_path / 'sim.yaml'
    path.write_text('sim:\n  fps: 30\n  box_colour: red\n')
    with pytest.raises(ValueError, match=r"unknown sim settings \['box_colour'\]"):
        SimConfig.from_yaml(path)


def test_layouts_are_in_reach_and_apart():
    cfg = SimConfig()
    contract = load_contract()
    for seed in range(300):
        layout = sample_layout(cfg, seed, contract.lower, contract.upper)
        for pose in (layout.box_pose, layout.pad_pose):
            assert cfg.reach_min_m <= math.hypot(pose[0], pose[1]) <= cfg.reach_max_m
        assert np.linalg.norm(layout.box_pose[:2] - layout.pad_pose[:2]) >= cfg.min_separation_m
        assert np.all(layout.start_joints >= contract.lower)
        assert np.all(layout.start_joints <= contract.upper)


def _rollout(env, seed, steps=15):
    obs = env.reset(seed=seed)
    trace = [np.concatenate([obs.joint_positions, obs.box_pose, obs.pad_pose, obs.ee_position])]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        action = obs.joint_positions + np.append(rng.uniform(-0.05, 0.05, 5), 0.0)
        action[5] = 0.5
        obs = env.step(action)
        trace.append(np.concatenate([obs.joint_positions, obs.box_pose, obs.pad_pose,
                                     obs.ee_position]))
    return np.array(trace)


def test_same_seed_gives_an_identical_episode(env):
    first = _rollout(env, seed=123)
    second = _rollout(env, seed=123)
    np.testing.assert_array_equal(first, second)


def test_different_seeds_give_different_poses(env):
    a = env.reset(seed=1)
    b = env.reset(seed=2)
    assert np.linalg.norm(a.box_pose[:2] - b.box_pose[:2]) > 1e-3
    assert np.linalg.norm(a.pad_pose[:2] - b.pad_pose[:2]) > 1e-3
    assert not np.allclose(a.joint_positions, b.joint_positions)


def test_observation_layout(env):
    obs = env.reset(seed=5)
    assert obs.images == {}
    assert obs.joint_positions.shape == (6,) and obs.ee_position.shape == (3,)
    assert obs.box_pose.shape == (4,) and obs.pad_pose.shape == (4,)
    assert obs.step_index == 0 and obs.time_s == 0.0
    assert obs.joint_positions[5] == pytest.approx(1.0)          # starts open
    assert obs.box_pose[2] == pytest.approx(env.config.box_size_m / 2)
    obs = env.step(obs.joint_positions)
    assert obs.step_index == 1 and obs.time_s == pytest.approx(1 / 30)


def test_servos_track_joint_targets(env):
    obs = env.reset(seed=3)
    target = obs.joint_positions + np.array([0.3, -0.2, 0.25, -0.3, 0.5, 0.0])
    for _ in range(30):
        obs = env.step(target)
    np.testing.assert_allclose(obs.joint_positions[:5], target[:5], atol=0.01)


def test_targets_outside_the_limits_are_clipped(env):
    obs = env.reset(seed=4)
    contract = env.contract
    target = obs.joint_positions.copy()
    target[4] = contract.upper[4] + 1.0
    for _ in range(45):
        obs = env.step(target)
    assert obs.joint_positions[4] <= contract.upper[4] + 0.01


def test_bad_actions_and_misuse_raise(env):
    fresh = PortPickAlignEnv(SimConfig(render=False, episode_steps=2))
    with pytest.raises(RuntimeError, match='reset'):
        fresh.step(np.zeros(6))
    obs = fresh.reset(seed=0)
    with pytest.raises(ValueError, match='6 joint targets'):
        fresh.step(np.zeros(5))
    with pytest.raises(ValueError, match='finite'):
        fresh.step(np.full(6, np.nan))
    fresh.step(obs.joint_positions)
    assert not fresh.done
    fresh.step(obs.joint_positions)
    assert fresh.done
    with pytest.raises(RuntimeError, match='episode is over'):
        fresh.step(obs.joint_positions)


def test_mujoco_end_effector_equals_urdf_forward_kinematics(env):
    """The sim's arm is built from the URDF: its TCP matches pinocchio's FK within 1 mm."""
    pytest.importorskip('pinocchio')
    import mujoco

    from act_ros.core.control.kinematics import ForwardKinematics

    fk = ForwardKinematics()
    contract = env.contract
    rng = np.random.default_rng(7)
    data = mujoco.MjData(env.model)
    site = env.model.site('ee_site').id
    qadr = [env.model.joint(n).qposadr[0] for n in fk.joint_names]
    worst = 0.0
    for _ in range(200):
        q = rng.uniform(contract.lower[:5], contract.upper[:5])
        data.qpos[qadr] = q
        mujoco.mj_kinematics(env.model, data)
        worst = max(worst, float(np.linalg.norm(data.site_xpos[site] - fk.ee_position(q))))
    assert worst < 1e-3
    # Also through the simulated robot: measured joints -> FK equals the reported TCP.
    obs = env.reset(seed=11)
    for _ in range(10):
        obs = env.step(obs.joint_positions + np.array([0.05, 0.03, -0.04, 0.02, 0.1, 0.0]))
        np.testing.assert_allclose(fk.ee_position(obs.joint_positions), obs.ee_position, atol=1e-3)


@pytest.mark.parametrize('box_deg, pad_deg, expected', [
    (0.0, 0.0, 0.0), (90.0, 0.0, 0.0), (100.0, 0.0, 10.0), (-44.0, 0.0, 44.0),
    (46.0, 0.0, 44.0), (179.0, -179.0, 2.0), (30.0, 120.0, 0.0),
])
def test_yaw_error_uses_the_box_symmetry(box_deg, pad_deg, expected):
    got = symmetric_yaw_error_deg(math.radians(box_deg), math.radians(pad_deg))
    assert got == pytest.approx(expected, abs=1e-9)


def test_summary_names_and_values():
    results = [EpisodeResult(True, 0.004, 2.0, True, True, True, 0.05, 300,
                             max_lifted_tilt_deg=3.0),
               EpisodeResult(False, 0.1, 30.0, False, False, True, 0.0, 300,
                             max_lifted_tilt_deg=35.0)]
    summary = summarize_results(results)
    failures = summary.pop('failures')
    assert summary == pytest.approx({'align_rate': 0.5, 'mean_position_error': 0.052,
                                     'mean_yaw_error': 16.0, 'count': 2, 'tumbles': 1})
    assert set(failures.values()) == {0}  # the failed result names no failure phase
    with pytest.raises(ValueError, match='at least one'):
        summarize_results([])


def test_untouched_box_is_not_a_success(env):
    env.reset(seed=9)
    result = env.evaluate()
    assert not result.success and not result.box_on_pad
    assert result.position_error_m >= env.config.min_separation_m - 1e-9


def test_sim_never_imports_rclpy():
    code = ('import sys, importlib, pkgutil\n'
            'import act_ros.sim as sim\n'
            'for m in pkgutil.iter_modules(sim.__path__):\n'
            '    importlib.import_module(f"act_ros.sim.{m.name}")\n'
            'sys.exit(1 if any(k.split(".")[0] == "rclpy" for k in sys.modules) else 0)\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=False,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_gripper_command_maps_to_the_finger_opening(env):
    obs = env.reset(seed=6)
    assert env.finger_open_m == pytest.approx(0.025)     # URDF limit: 5 cm between fingers
    target = obs.joint_positions.copy()
    target[5] = 0.5
    for _ in range(15):
        obs = env.step(target)
    assert obs.joint_positions[5] == pytest.approx(0.5, abs=0.02)
    finger = env.data.qpos[env.model.joint('gripper').qposadr[0]]
    assert finger == pytest.approx(0.0125, abs=0.0005)


@pytest.mark.parametrize('replace, message', [
    ('<box size="0.03 0.035 0.116"/>', 'geometry <mesh> is not supported'),
    ('type="revolute"', "has type 'continuous'"),
])
def test_urdf_outside_the_supported_subset_is_rejected(tmp_path, replace, message):
    from act_ros.core.control.kinematics import default_urdf_path
    from act_ros.sim.urdf_mjcf import parse_urdf

    text = default_urdf_path().read_text()
    bad = {'<box size="0.03 0.035 0.116"/>': '<mesh filename="arm.stl"/>',
           'type="revolute"': 'type="continuous"'}[replace]
    assert replace in text
    path = tmp_path / 'bad.urdf'
    path.write_text(text.replace(replace, bad))
    with pytest.raises(ValueError, match=message):
        parse_urdf(path)


def _place_box(env, position, rotation):
    """Put the box at rest at ``position`` with orientation ``rotation`` (3x3)."""
    import mujoco

    quat = np.empty(4)
    mujoco.mju_mat2Quat(quat, np.asarray(rotation, dtype=np.float64).ravel())
    adr = env.model.joint('box_free').qposadr[0]
    vadr = env.model.joint('box_free').dofadr[0]
    env.data.qpos[adr:adr + 7] = [*position, *quat]
    env.data.qvel[vadr:vadr + 6] = 0.0
    mujoco.mj_forward(env.model, env.data)


def _rot_z(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _rot_x(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_y(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


# The six faces of the cube, each put down by one rotation of the box frame.
FACES = {'-z (upright)': np.eye(3), '+z (upside down)': _rot_x(math.pi),
         '-y': _rot_x(math.pi / 2), '+y': _rot_x(-math.pi / 2),
         '-x': _rot_y(-math.pi / 2), '+x': _rot_y(math.pi / 2)}


@pytest.mark.parametrize('face', sorted(FACES))
@pytest.mark.parametrize('turn_deg', [0.0, 90.0, 180.0, -90.0])
def test_a_cube_on_any_face_aligned_on_the_pad_is_a_success(env, face, turn_deg):
    """A cube is the same cube on each of its faces: resting on the pad within the
    tolerances, on any face and turned by any multiple of 90 degrees, it is aligned."""
    obs = env.reset(seed=21)
    pad = obs.pad_pose
    half = env.config.box_size_m / 2
    yaw = pad[3] + math.radians(turn_deg + 4.0)         # 4 degrees off: within 10
    offset = np.array([0.008, -0.006])                  # 1.0 cm off: within 1.5
    _place_box(env, [pad[0] + offset[0], pad[1] + offset[1], pad[2] + half],
               _rot_z(yaw) @ FACES[face])
    result = env.evaluate()
    assert result.box_on_pad and result.released, result
    assert result.yaw_error_deg == pytest.approx(4.0, abs=1e-6)
    assert result.position_error_m == pytest.approx(0.01, abs=1e-6)
    assert result.success, result
    # Beyond the yaw tolerance on the same face: not aligned.
    _place_box(env, [pad[0], pad[1], pad[2] + half],
               _rot_z(pad[3] + math.radians(turn_deg + 20.0)) @ FACES[face])
    result = env.evaluate()
    assert result.box_on_pad and not result.success and result.yaw_error_deg > 10.0


def test_a_tilted_box_is_not_resting_on_the_pad(env):
    obs = env.reset(seed=21)
    pad = obs.pad_pose
    half = env.config.box_size_m / 2
    tilt = math.radians(20.0)
    lowest = half * (math.cos(tilt) + math.sin(tilt))     # its lowest edge on the pad
    _place_box(env, [pad[0], pad[1], pad[2] + lowest], _rot_z(pad[3]) @ _rot_x(tilt))
    result = env.evaluate()
    assert not result.box_on_pad and not result.success


def test_box_pose_reports_the_yaw_of_a_cube_on_any_face(env):
    env.reset(seed=21)
    for rotation in FACES.values():
        yaw = math.radians(33.0)
        _place_box(env, [0.2, 0.0, env.config.box_size_m / 2], _rot_z(yaw) @ rotation)
        got = env.box_pose()[3]
        assert symmetric_yaw_error_deg(got, yaw) == pytest.approx(0.0, abs=1e-6)


def test_a_lifted_box_that_turns_is_a_tumble_one_on_the_table_is_not(env):
    from act_ros.sim.metrics import TUMBLE_TILT_DEG

    env.reset(seed=9)
    hold = env.joint_positions()
    # Tilted 30 degrees on the table: not lifted, so not a tumble.
    adr = env._box_qadr
    tilt = math.radians(30.0)
    env.data.qpos[adr + 3:adr + 7] = [math.cos(tilt / 2), math.sin(tilt / 2), 0.0, 0.0]
    env.step(hold)
    assert env.evaluate().max_lifted_tilt_deg == 0.0
    # The same tilt 10 cm above the table (falling, still above the lift height): a tumble.
    env.data.qpos[adr + 2] = 0.10
    env.data.qpos[adr + 3:adr + 7] = [math.cos(tilt / 2), math.sin(tilt / 2), 0.0, 0.0]
    env.data.qvel[env._box_vadr:env._box_vadr + 6] = 0.0  # at rest, as released there
    env.step(hold)
    result = env.evaluate()
    assert result.max_lifted_tilt_deg == pytest.approx(30.0, abs=2.0)
    assert result.max_lifted_tilt_deg > TUMBLE_TILT_DEG
    assert summarize_results([result])['tumbles'] == 1
    env.reset(seed=9)
    assert env.evaluate().max_lifted_tilt_deg == 0.0  # per episode
