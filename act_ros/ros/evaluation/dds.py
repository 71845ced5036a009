"""Fast DDS settings for full-size camera images between processes on one machine.

With its default settings Fast DDS (the default ROS 2 middleware) cannot pass a
480x640 rgb8 image (921,600 bytes) through shared memory: the default segment is 512 KiB,
so the sample goes over UDP loopback in 64 KiB fragments, and a best-effort reader (the
``sensor_data`` QoS that camera topics and ``act_node`` use) loses most of them. Measured
here: 7 of 40 images arrive at 10 Hz; 240x320 images all arrive. A participant profile
with a larger shared-memory segment delivers all of them.

:func:`dds_environment` returns the environment that selects the package's profile
(``config/fastdds_large_images.xml``: shared memory with a 32 MiB segment, plus UDP
restricted to 127.0.0.1), unless the user chose a middleware or a profile already.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from act_ros.core.paths import config_path

PROFILE_NAME = 'fastdds_large_images.xml'
# Where Fast DDS looks for a profile file: Fast DDS 3 (Kilted on) reads the first (and warns
# that the second is deprecated), Fast DDS 2.x (Humble, Jazzy) reads only the second.
PROFILE_VARIABLES = ('FASTDDS_DEFAULT_PROFILES_FILE', 'FASTRTPS_DEFAULT_PROFILES_FILE')
FAST_DDS_2_DISTROS = ('humble', 'iron', 'jazzy')


def profile_path() -> Path:
    """The package's profile: ``config/fastdds_large_images.xml``."""
    return config_path(PROFILE_NAME)


def profile_variable(env: dict[str, str] | None = None) -> str:
    """The variable this ROS 2's Fast DDS reads its profile file from: by ``ROS_DISTRO``
    (a sourced ROS install sets it), else by the installed wheels (Jazzy's are
    ``ros-jazzy-*``; Kilted's ``ros-*``)."""
    distro = (os.environ if env is None else env).get('ROS_DISTRO', '')
    if not distro:
        try:
            importlib.metadata.version('ros-jazzy-rclpy')
            distro = 'jazzy'
        except importlib.metadata.PackageNotFoundError:
            pass
    return PROFILE_VARIABLES[1] if distro in FAST_DDS_2_DISTROS else PROFILE_VARIABLES[0]


def dds_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus the package's large-image Fast DDS profile.

    Unchanged when another middleware than Fast DDS is selected or a profile is set.
    """
    rmw = env.get('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp')
    if rmw not in ('rmw_fastrtps_cpp', 'rmw_fastrtps_dynamic_cpp'):
        return dict(env)
    if any(env.get(name) for name in PROFILE_VARIABLES):
        return dict(env)
    return dict(env, **{profile_variable(env): str(profile_path())})


def use_in_this_process(env: dict[str, str]) -> None:
    """Select the same profile for this process's participants (before ``rclpy.init``)."""
    for name in PROFILE_VARIABLES:
        if env.get(name) and not os.environ.get(name):
            os.environ[name] = env[name]
