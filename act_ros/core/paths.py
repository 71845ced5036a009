"""Locate the package's shared files (config/, urdf/, models/) in every install layout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE_NAME = 'act_ros'
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def share_dir() -> Path:
    """Return the directory that holds ``config/``, ``urdf/`` and ``models/``.

    Looked up in this order: ``ACT_ROS_SHARE_DIR``; the source tree (editable and
    ``colcon --symlink-install`` checkouts); ``<prefix>/share/act_ros`` of a pip install;
    the ament index of a ROS install.
    """
    env = os.environ.get('ACT_ROS_SHARE_DIR')
    if env:
        return Path(env)
    if (_SOURCE_ROOT / 'config' / 'contract.yaml').is_file():
        return _SOURCE_ROOT
    prefix_share = Path(sys.prefix) / 'share' / PACKAGE_NAME
    if (prefix_share / 'config' / 'contract.yaml').is_file():
        return prefix_share
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory(PACKAGE_NAME))
    except (ImportError, LookupError) as exc:
        raise FileNotFoundError(
            'cannot find the act_ros share directory (config/contract.yaml): set '
            f'ACT_ROS_SHARE_DIR, or install the package (looked in {_SOURCE_ROOT} and '
            f'{prefix_share})') from exc


def config_path(name: str) -> Path:
    """Return the path of a file under the package's ``config/`` directory."""
    return share_dir() / 'config' / name


def load_yaml_mapping(path: str | Path, what: str = 'config') -> dict:
    """Read a YAML file whose top level is a mapping; errors name the file and the problem."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'{what} file not found: {path}')
    with path.open() as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ValueError(f'{path}: not valid YAML: {exc}') from exc
    if not isinstance(data, dict):
        raise ValueError(f'{path}: expected a mapping at top level, got {type(data).__name__}')
    return data


def main(argv: list[str] | None = None) -> int:
    """``act-ros share-dir``: print :func:`share_dir`, as ``ros2 pkg prefix act_ros`` (plus
    ``/share/act_ros``) prints it where ROS is installed."""
    import argparse

    from act_ros.core.arguments import HelpFormatter

    p = argparse.ArgumentParser(
        prog='act-ros share-dir', formatter_class=HelpFormatter,
        description="print the folder that holds the package's config/, models/, urdf/ and "
                    'launch/ (the repository checkout of a pip install -e),\nfor example '
                    'FASTDDS_DEFAULT_PROFILES_FILE=$(act-ros share-dir)/config/'
                    'fastdds_large_images.xml;\nwhere ROS is installed the same as '
                    '$(ros2 pkg prefix act_ros)/share/act_ros')
    p.parse_args(argv)
    try:
        print(share_dir())
    except FileNotFoundError as exc:
        print(f'act-ros share-dir: {exc}', file=sys.stderr)
        return 1
    return 0
