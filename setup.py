"""Packaging for act_ros: an ament_python package that also installs with pip."""

from glob import glob
import os

from setuptools import find_packages, setup

package_name = 'act_ros'


def _files(pattern: str) -> list[str]:
    return sorted(path for path in glob(pattern, recursive=True) if os.path.isfile(path))


# Made on one machine for its CPU: exports and compiled caches are never installed.
_MACHINE_DIRS = {'export', 'openvino_cache'}


def _models() -> list[tuple[str, list[str]]]:
    """Install models/: the README, the shipped policy and any checkpoint placed there."""
    entries = []
    for directory in sorted({os.path.dirname(p) for p in _files('models/**/*')}):
        if _MACHINE_DIRS & set(directory.split(os.sep)):
            continue
        entries.append((os.path.join('share', package_name, directory),
                        _files(os.path.join(directory, '*'))))
    return entries


ROS_WHEELS = [
    # ROS 2 Kilted from the Python package index, for machines without a ROS install
    # (the default of make setup / make test).
    'ros-rclpy>=9,<11',
    'ros-sensor-msgs>=5,<6',
    'ros-std-msgs>=5,<6',
    'ros-std-srvs>=5,<6',
    'ros-trajectory-msgs>=5,<6',
    'ros-geometry-msgs>=5,<6',
    'ros-diagnostic-msgs>=5,<6',
    'ros-nav-msgs>=5,<6',  # the planned path (act_node visualization)
    'ros-visualization-msgs>=5,<6',  # the release gate's markers
    'ros-lifecycle-msgs>=2,<3',
    'ros-rosgraph-msgs>=2,<3',
    'ros-rcl-interfaces>=2,<3',
    'ros-rmw-fastrtps-cpp>=9,<11',
]

# The same packages from ROS 2 Jazzy (the LTS): each `ros-jazzy-<name>` wheel pins Jazzy's
# `ros-<name>` build (rclpy 7.1, Fast DDS RMW 8.4). Exclusive with the `ros` extra;
# `make test ROS_DISTRO=jazzy` builds its environment with this one.
ROS_WHEELS_JAZZY = [
    'ros-jazzy-rclpy>=7.1,<8',
    'ros-jazzy-sensor-msgs>=5.3,<6',
    'ros-jazzy-std-msgs>=5.3,<6',
    'ros-jazzy-std-srvs>=5.3,<6',
    'ros-jazzy-trajectory-msgs>=5.3,<6',
    'ros-jazzy-geometry-msgs>=5.3,<6',
    'ros-jazzy-diagnostic-msgs>=5.3,<6',
    'ros-jazzy-nav-msgs>=5.3,<6',
    'ros-jazzy-visualization-msgs>=5.3,<6',
    'ros-jazzy-lifecycle-msgs>=2,<3',
    'ros-jazzy-rosgraph-msgs>=2,<3',
    'ros-jazzy-rcl-interfaces>=2,<3',
    'ros-jazzy-rmw-fastrtps-cpp>=8.4,<9',
]

# The ONNX exporter (torch.onnx, dynamo) and the optional CPU inference backends.
ONNX_EXPORT = ['onnx>=1.17,<2', 'onnxscript>=0.5,<1']

setup(
    name=package_name,
    version='0.1.0',
    # research/ (probes run from a checkout) is not installed.
    packages=find_packages(exclude=['test', 'test.*', 'research', 'research.*']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        ('share/' + package_name + '/launch', _files('launch/*.launch.py')),
        ('share/' + package_name + '/config', _files('config/*.yaml') + _files('config/*.xml')),
        # The example arms' contracts and node parameters (config/robots/<arm>/).
        *((os.path.join('share', package_name, directory), _files(os.path.join(directory, '*.yaml')))
          for directory in sorted({os.path.dirname(p) for p in _files('config/robots/*/*.yaml')})),
        ('share/' + package_name + '/urdf', _files('urdf/*')),
        ('share/' + package_name + '/rviz', _files('rviz/*.rviz')),
    ] + _models(),
    python_requires='>=3.12',
    install_requires=[
        'setuptools',
        'lerobot>=0.6,<0.7',
        'huggingface-hub>=1.6,<2',  # Hub ids (act_ros.core.inference.hub); LeRobot 0.6 needs the same
        'torch>=2.7,<2.12',
        'numpy>=1.26,<3',
        'pyyaml>=6,<7',
        'safetensors>=0.4,<1',
        'opencv-python-headless>=4.9,<5',
        'pin>=3,<5',  # pinocchio: forward kinematics for the release gate
        'matplotlib>=3.8,<4',  # training plots
        'tqdm>=4.60,<5',
        'psutil>=5.9,<8',  # process trees of the evaluation, demo and benchmark children
    ],
    extras_require={
        'ros': ROS_WHEELS,
        'ros-jazzy': ROS_WHEELS_JAZZY,
        'sim': ['mujoco>=3.2,<4'],
        # gym-aloha's tasks (act_ros.sim.aloha): dm-control 1.0.50 is the release for MuJoCo
        # 3.17 (1.0.52 needs MuJoCo 4). gym-aloha itself pins mujoco<3.9 though it runs on
        # 3.17: install it without its pins, `pip install --no-deps gym-aloha==0.1.5`
        # (make setup does; docs/aloha.md).
        'aloha': ['dm-control>=1.0.50,<1.0.52', 'gymnasium>=0.29,<2', 'imageio>=2.34,<3'],
        'dataset': ['lerobot[dataset]>=0.6,<0.7'],
        'dev': ['pytest>=8,<10', 'pytest-timeout>=2.3,<3', 'ruff>=0.6,<1',
                # colcon from PyPI: the colcon build test (a ROS machine has its own)
                'colcon-core>=0.15,<1', 'colcon-ros>=0.5,<1', 'colcon-python-setup-py>=0.2,<1',
                'colcon-package-selection>=0.2,<1'],
        'onnx': ONNX_EXPORT,
        # nncf: INT8 post-training quantization for precision int8 (act-ros export --int8).
        'openvino': ONNX_EXPORT + ['openvino>=2025.0,<2027', 'nncf>=3,<4'],
        'onnxruntime': ONNX_EXPORT + ['onnxruntime>=1.20,<2'],
        # LeRobot's own training step (update_policy) for `act-ros bench training`.
        'bench': ['accelerate>=1.14,<2'],
        # `act-ros train` as several processes under `accelerate launch` (DDP); one
        # process never imports it.
        'distributed': ['accelerate>=1.14,<2'],
        # act-ros import-bag: rosbag2 (MCAP, SQLite3) without a ROS install.
        'bag': ['rosbags>=0.10,<1'],
    },
    zip_safe=True,
    maintainer='act_ros maintainers',
    maintainer_email='maintainers@act-ros.invalid',
    description='ROS 2 bridge, simulation, trainer and benchmarks for LeRobot ACT policies.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'act-ros = act_ros.cli:main',
            'act_node = act_ros.ros.node.act_node:main',
            'sim_bridge = act_ros.ros.sim_bridge.bridge:main',
            'record_node = act_ros.ros.recording.record_node:main',
            'train = act_ros.training.train:main',
        ],
    },
)
