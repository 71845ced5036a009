"""The fault-injection suite in its short form (``act-ros bench faults --quick``): every
fault injected against the real node over real topics is survived: no non-finite command,
no command from stale inputs, no release outside the radius, a measured recovery from
each, no inference child leaked, and a clean exit on SIGTERM."""

import json

import pytest

pytestmark = pytest.mark.ros
pytest.importorskip('rclpy')


@pytest.mark.slow
def test_quick_fault_injection_is_survived(tmp_path, ros_domain_id, monkeypatch):
    from act_ros.bench import faults

    monkeypatch.setenv('ROS_DOMAIN_ID', str(ros_domain_id))
    out = tmp_path / 'faults.json'
    code = faults.main(['--quick', '--json', str(out), '--no-header'])
    report = json.loads(out.read_text())
    failed = [r for r in report['results'] if not r['recovered'] or r['stale_commands']
              or r['releases_outside']]
    assert code == 0 and report['ok'], failed or report
    kinds = {r['kind'] for r in report['results']}
    assert len(kinds) == 14
    assert report['nonfinite_commands'] == 0 and report['children_left'] == 0
    # Every fault has a measured recovery (none stands in as 0.0), and the node ended the
    # children it replaced itself (the benchmark counts them before cleaning up).
    assert all(r['recovery_s'] is not None and r['recovery_s'] > 0 for r in report['results'])
    assert report['children_leaked'] == 0
    assert all(r['children_leaked'] == 0 for r in report['results'])
