"""Test environment: offline model hub, headless MuJoCo, ROS 2 on loopback in its own domain."""

import ast
import functools
import itertools
import os
import re
import shutil
from pathlib import Path

# Set before anything imports huggingface_hub, mujoco or rclpy.
os.environ['HF_HUB_OFFLINE'] = '1'
os.environ.setdefault('MUJOCO_GL', 'egl')
os.environ.setdefault('PYOPENGL_PLATFORM', 'egl')
os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
os.environ.setdefault('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp')
# A domain of this test process's own, so parallel runs on one machine never see each other.
os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
# The Arrow copies LeRobot's parquet reads make of every test dataset go to a temporary
# cache removed at exit, not to the user's ~/.cache/huggingface/datasets.
if 'HF_DATASETS_CACHE' not in os.environ:
    import atexit
    import tempfile

    os.environ['HF_DATASETS_CACHE'] = tempfile.mkdtemp(prefix='act_ros_test_datasets_cache_')
    atexit.register(shutil.rmtree, os.environ['HF_DATASETS_CACHE'], ignore_errors=True)

import pytest  # noqa: E402

_domain_offsets = itertools.count()

# What makes a test module a ROS test module (marker ``ros``, ``make test-ros``): it imports
# rclpy, launch, a message or service package or the package's ROS layer (anywhere in the
# module, a function's own imports too), or names rclpy, one of the package's ROS
# executables or its ROS layer in a string (``importorskip('rclpy')``, a child process it
# starts: ``act_node``, ``sim_bridge``, ``record_node``, ``--over-ros``, a colcon build).
# A module may also mark itself (``pytestmark = pytest.mark.ros``).
ROS_IMPORTS = ('rclpy', 'launch', 'launch_ros', 'rcl_interfaces', 'builtin_interfaces',
               'ament_index_python')
ROS_STRING = re.compile(r'act_ros\.ros\b|\b(rclpy|launch_ros|act_node|sim_bridge|record_node|colcon)\b'
                        r'|over[-_]ros')


def _is_ros_import(module: str) -> bool:
    top = module.split('.')[0]
    return (top in ROS_IMPORTS or top.endswith(('_msgs', '_srvs'))
            or module == 'act_ros.ros' or module.startswith('act_ros.ros.'))


@functools.cache
def is_ros_test_module(path: Path) -> bool:
    """Whether the test module at ``path`` uses ROS 2 (see ``ROS_IMPORTS``, ``ROS_STRING``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(_is_ros_import(a.name) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and _is_ros_import(node.module):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and ROS_STRING.search(node.value):
            return True
    return False


def pytest_report_header(config):
    """Which rclpy the session runs against (Jazzy's is 7.x, Kilted's 9.x): ``make test``
    and ``make test ROS_DISTRO=jazzy`` differ only there."""
    from importlib import metadata
    rmw = os.environ['RMW_IMPLEMENTATION']
    for dist in ('ros-rclpy', 'rclpy'):
        try:
            return f'ROS 2: rclpy {metadata.version(dist)} ({dist}), {rmw}'
        except metadata.PackageNotFoundError:
            continue
    return f"ROS 2: rclpy of a ROS install (ROS_DISTRO={os.environ.get('ROS_DISTRO')}), {rmw}"


def pytest_collection_modifyitems(config, items):
    """Every test of a ROS test module is marked ``ros``: ``make test-ros`` (CI: on each
    ROS 2 distribution) runs them, whatever marks the module sets itself."""
    for item in items:
        if item.path.suffix == '.py' and is_ros_test_module(item.path):
            item.add_marker(pytest.mark.ros)


def unique_domain_id() -> int:
    """A ROS domain id for one test: distinct within this process, spread across processes."""
    base = int(os.environ['ROS_DOMAIN_ID'])
    return 1 + (base + next(_domain_offsets)) % 101


@pytest.fixture
def ros_domain_id() -> int:
    return unique_domain_id()


@pytest.fixture
def rclpy_context(ros_domain_id):
    """A fresh rclpy context in a domain of its own; shut down after the test."""
    rclpy = pytest.importorskip('rclpy')
    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    try:
        yield context
    finally:
        if context.ok():
            rclpy.shutdown(context=context)


@pytest.fixture(scope='module')
def module_tmp(request, tmp_path_factory):
    """``tmp_path_factory.mktemp`` for module-scoped fixtures: what they made is deleted once
    the module's tests are done, unless one of them failed (with pytest's
    ``tmp_path_retention_policy = failed``, set in setup.cfg; any other policy keeps it).
    Datasets, checkpoints and exports then occupy the disk one module at a time, not
    all of a session's at once."""
    made = []
    failed_before = request.session.testsfailed

    def mktemp(basename: str):
        path = tmp_path_factory.mktemp(basename)
        made.append(path)
        return path

    yield mktemp
    if (request.config.getini('tmp_path_retention_policy') == 'failed'
            and request.session.testsfailed == failed_before):
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope='session')
def tiny_checkpoint(tmp_path_factory):
    """A small real ACT checkpoint (LeRobot format, 48x64 cameras), shared by the session."""
    from act_ros.core.inference.checkpoint import create_checkpoint
    return create_checkpoint(tmp_path_factory.mktemp('ckpt') / 'tiny', preset='tiny',
                             image_size=(48, 64), seed=0)


@pytest.fixture(scope='session')
def tiny_pose_checkpoint(tmp_path_factory):
    """The tiny checkpoint with the object poses (observation.environment_state) as an
    input beside both cameras (48x64), shared by the session."""
    from act_ros.core.inference.checkpoint import create_checkpoint
    return create_checkpoint(tmp_path_factory.mktemp('ckpt_poses') / 'tiny_poses',
                             preset='tiny', image_size=(48, 64), seed=0, environment_state=True)


@pytest.fixture(scope='session')
def exported_checkpoint(tmp_path_factory, tiny_checkpoint):
    """A copy of the tiny checkpoint with its ONNX export (`act-ros export`), for the
    ONNX backends; skips where OpenVINO and ONNX Runtime are both missing."""
    import shutil

    from extras import skip_unless

    from act_ros.cli import main
    from act_ros.core.inference.options import installed_backends
    skip_unless(installed_backends() != ['torch'], 'an ONNX backend (openvino or onnxruntime)',
                'openvino,onnxruntime')
    ckpt = tmp_path_factory.mktemp('exported') / 'tiny'
    shutil.copytree(tiny_checkpoint, ckpt)
    assert main(['export', '--checkpoint', str(ckpt), '--format', 'onnx']) == 0
    return ckpt
