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

import os
from pathlib import Path

from act_ros.core.paths import config_path

PROFILE_NAME = 'fastdds_large_images.xml'
PROFILE_VARIABLES = ('FASTDDS_DEFAULT_PROFILES_FILE', 'FASTRTPS_DEFAULT_PROFILES_FILE')


def profile_path() -> Path:
    """The package's profile: ``config/fastdds_large_images.xml``."""
    return config_path(PROFILE_NAME)


def dds_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus the package's large-image Fast DDS profile.

    Unchanged when another middleware than Fast DDS is selected or a profile is set.
    """
    rmw = env.get('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp')
    if rmw not in ('rmw_fastrtps_cpp', 'rmw_fastrtps_dynamic_cpp'):
        return dict(env)
    if any(env.get(name) for name in PROFILE_VARIABLES):
        return dict(env)
    return dict(env, FASTDDS_DEFAULT_PROFILES_FILE=str(profile_path()))


def use_in_this_process(env: dict[str, str]) -> None:
    """Select the same profile for this process's participants (before ``rclpy.init``)."""
    for name in PROFILE_VARIABLES:
        if env.get(name) and not os.environ.get(name):
            os.environ[name] = env[name]
