"""Skips for optional extras, one rule for every test.

The package runs without its optional extras (OpenVINO, ONNX Runtime, colcon), so a test
that needs one skips, saying which extra brings it, where a user installed only the core.
``make test`` installs every extra and sets ``ACT_ROS_REQUIRE_EXTRAS=1``: there a missing
extra is a broken environment, and the test runs and fails instead of skipping silently
(``make test REQUIRE_EXTRAS=0`` after ``make setup EXTRAS=...`` with fewer extras).
"""

import importlib.util
import os

import pytest

from act_ros.core.inference.options import installed_backends

REQUIRED = os.environ.get('ACT_ROS_REQUIRE_EXTRAS') == '1'
BACKENDS = installed_backends()


def needs(present: bool, what: str, extra: str) -> pytest.MarkDecorator:
    """``skipif`` ``what`` is missing, naming the extra that brings it; never skips under
    ``make test``."""
    return pytest.mark.skipif(not present and not REQUIRED,
                              reason=f"{what} is not installed (pip install -e '.[{extra}]'; "
                              'make setup installs it)')


def skip_unless(present: bool, what: str, extra: str) -> None:
    """The same inside a test or fixture."""
    if not present and not REQUIRED:
        pytest.skip(f"{what} is not installed (pip install -e '.[{extra}]'; make setup "
                    'installs it)')


needs_openvino = needs('openvino' in BACKENDS, 'openvino', 'openvino')
needs_onnxruntime = needs('onnxruntime' in BACKENDS, 'onnxruntime', 'onnxruntime')
needs_onnx = needs(BACKENDS != ['torch'], 'an ONNX backend (openvino or onnxruntime)',
                   'openvino,onnxruntime')
# NNCF quantizes for precision int8 (act-ros export --int8); it comes with the openvino extra.
HAS_NNCF = importlib.util.find_spec('nncf') is not None
needs_nncf = needs(HAS_NNCF and 'openvino' in BACKENDS, 'nncf (with openvino)', 'openvino')
# gym-aloha (installed without its pins, see docs/aloha.md) and dm-control: the aloha extra.
HAS_GYM_ALOHA = (importlib.util.find_spec('gym_aloha') is not None
                 and importlib.util.find_spec('dm_control') is not None)
needs_gym_aloha = needs(HAS_GYM_ALOHA, 'gym-aloha with dm-control', 'aloha')
