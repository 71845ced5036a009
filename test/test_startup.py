"""Time to the first command: the phases of a start-up add up to its total, the parent of an
inference child reads only the checkpoint's JSON (no torch, no LeRobot, no weights), and
the child's start-up moments come back in the order they happened."""

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from act_ros.core.errors import CheckpointError, ContractMismatchError
from act_ros.core.startup import EVENTS, StartupTimeline, process_start_monotonic


def test_phases_follow_the_moments_and_add_up_to_the_total():
    timeline = StartupTimeline(origin=100.0)
    for name, at in [('imported', 100.5), ('node_created', 100.7), ('configure_started', 100.7),
                     ('child_running', 101.2), ('model_imported', 105.0), ('warmed_up', 106.0),
                     ('first_command', 107.5)]:
        timeline.mark(name, at)
    phases = timeline.phases()
    assert list(phases) == ['import', 'node_init', 'wait_configure', 'child_start',
                            'model_import', 'warmup', 'first_command']
    assert phases['import'] == pytest.approx(0.5)
    assert phases['model_import'] == pytest.approx(3.8)
    assert sum(phases.values()) == pytest.approx(timeline.total_s()) == pytest.approx(7.5)
    values = timeline.as_values()
    assert values['startup.time_to_first_command_s'] == pytest.approx(7.5)
    assert values['startup.warmup_s'] == pytest.approx(1.0)
    assert 'first command 7.50 s after process start: import 0.50' in timeline.line()


def test_a_moment_out_of_order_is_a_zero_phase_and_the_sum_still_holds():
    timeline = StartupTimeline(origin=0.0)
    timeline.mark('child_running', 2.0)
    timeline.mark('model_imported', 1.999)  # another process's clock reading, a tick early
    timeline.mark('first_command', 3.0)
    phases = timeline.phases()
    assert phases['model_import'] == 0.0 and min(phases.values()) >= 0.0
    assert sum(phases.values()) == pytest.approx(3.0)


def test_first_record_stays_and_a_new_configure_forgets_the_old_one():
    timeline = StartupTimeline(origin=0.0)
    timeline.mark('configure_started', 1.0)
    timeline.mark('configure_started', 5.0)
    assert timeline.at('configure_started') == 1.0
    timeline.merge({'model_imported': 2.0, 'not_a_moment': 3.0})
    timeline.notes['backend_cache'] = 'none'
    timeline.forget_from('configure_started')
    assert timeline.events == {} and timeline.notes == {}
    assert not timeline.complete and timeline.total_s() is None
    with pytest.raises(ValueError, match="unknown start-up moment 'bogus'"):
        timeline.mark('bogus')


def test_every_moment_has_a_distinct_phase():
    phases = [phase for _, phase in EVENTS]
    assert len(set(phases)) == len(phases)


def test_process_start_is_before_now_and_after_the_interpreter_was_asked_for():
    asked = time.monotonic()
    code = ('import time; from act_ros.core.startup import process_start_monotonic as p; '
            'print(p(), time.monotonic())')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    started, now = float(out[0]), float(out[1])
    assert asked - 0.05 <= started <= now  # 10 ms clock ticks: a little slack before
    assert process_start_monotonic() < asked


# ---------------------------------------------------------------- the parent reads JSON only

PARENT = r'''
import json, sys, time
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0]))
                 if event == 'open' and args and isinstance(args[0], str) else None)
from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig
rt = PolicyRuntime(RuntimeConfig(model_path=sys.argv[1], device='cpu', execution='process',
                                 torch_threads=1), wait=False)
ready_before_wait = rt._remote.ready
rt.wait_ready()
verdict = rt.feasibility(30.0)
events = rt.startup_events
rt.close()
print(json.dumps({
    'modules': sorted(m for m in ('torch', 'lerobot', 'torchvision', 'safetensors', 'openvino')
                      if m in sys.modules),
    'weights_opened': [p for p in opened if p.endswith('.safetensors')],
    'ready_before_wait': ready_before_wait, 'device': str(rt.device),
    'chunk_size': rt.chunk_size, 'checkpoint': rt.checkpoint is None,
    'predictor': rt.predictor is None, 'samples': verdict.latency.samples,
    'events': events}))
'''


def test_process_parent_never_imports_torch_or_opens_the_weights(tiny_checkpoint):
    """The parent checks the checkpoint from JSON; only the child loads the model."""
    out = subprocess.run([sys.executable, '-c', PARENT, str(tiny_checkpoint)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report['modules'] == [], report['modules']
    assert report['weights_opened'] == [], report['weights_opened']
    assert report['checkpoint'] and report['predictor']
    assert report['ready_before_wait'] is False  # wait=False returned with the child loading
    assert report['device'] == 'cpu' and report['chunk_size'] == 30
    assert report['samples'] == 2
    events = report['events']
    order = ['child_running', 'model_imported', 'checkpoint_loaded', 'backend_built',
             'warmed_up', 'ready', 'latency_measured']
    assert [name for name in order if name in events] == order, sorted(events)
    times = [events[name] for name in order]
    assert times == sorted(times), dict(zip(order, times))


def test_in_process_runtime_reports_its_load_moments(tiny_checkpoint):
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    with PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, device='cpu',
                                     execution='async', torch_threads=1)) as rt:
        rt.wait_ready()  # in-process: loaded already, a no-op
        rt.feasibility(30.0)
        events = rt.startup_events
    order = ['model_imported', 'checkpoint_loaded', 'backend_built', 'warmed_up',
             'latency_measured']
    assert [events[name] for name in order] == sorted(events[name] for name in order)
    assert 'child_running' not in events and rt.stats.backend_cache == 'none'


# ------------------------------------------------- the JSON checks match the full load's

@pytest.fixture
def ckpt(tiny_checkpoint, tmp_path):
    path = tmp_path / 'ckpt'
    shutil.copytree(tiny_checkpoint, path)
    return path


def _edit_config(path, edit):
    config = json.loads((path / 'config.json').read_text())
    edit(config)
    (path / 'config.json').write_text(json.dumps(config))


@pytest.mark.parametrize('edit, error, match', [
    (lambda c: c.update(type='diffusion'), CheckpointError, "expected 'act'"),
    (lambda c: c['input_features']['observation.state'].update(shape=[7]),
     ContractMismatchError, 'observation.state.*6 joints'),
    (lambda c: c['input_features'].update({'observation.images.side': dict(
        c['input_features']['observation.images.wrist'])}), ContractMismatchError,
     r"camera features \['observation.images.side'\] are not cameras of the contract"),
    (lambda c: c.update(chunk_size=0), CheckpointError, 'chunk_size must be a positive'),
])
def test_checkpoint_info_refuses_what_the_full_load_refuses(ckpt, edit, error, match):
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.checkpoint_info import read_checkpoint_info

    _edit_config(ckpt, edit)
    with pytest.raises(error, match=match):
        read_checkpoint_info(ckpt, load_contract())


def test_checkpoint_info_matches_the_loaded_checkpoint(tiny_checkpoint):
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.checkpoint import load_checkpoint
    from act_ros.core.inference.checkpoint_info import read_checkpoint_info

    info = read_checkpoint_info(tiny_checkpoint, load_contract())
    loaded = load_checkpoint(tiny_checkpoint)
    assert info.image_shapes == loaded.image_shapes
    assert list(info.image_features) == list(loaded.config.image_features)
    assert info.chunk_size == loaded.chunk_size and info.state_dim == loaded.state_dim


def test_missing_weights_fail_before_the_child_starts(ckpt):
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    (ckpt / 'model.safetensors').unlink()
    with pytest.raises(CheckpointError, match=r'model\.safetensors: missing'):
        PolicyRuntime(RuntimeConfig(model_path=ckpt, execution='process'), wait=False)


def test_n_action_steps_above_chunk_size_fails_in_the_parent(tiny_checkpoint):
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    with pytest.raises(ValueError, match=r'n_action_steps \(31\) cannot exceed'):
        PolicyRuntime(RuntimeConfig(model_path=tiny_checkpoint, execution='process',
                                    n_action_steps=31), wait=False)


def test_bench_reads_the_start_up_from_diagnostics():
    from act_ros.bench.node import startup_values

    assert startup_values(None) == {}
    waiting = (0, 'ok', {'startup.time_to_first_command_s': 'n/a', 'startup.import_s': '0.5'})
    assert startup_values(waiting) == {}  # not complete yet
    done = (0, 'ok', {'startup.time_to_first_command_s': '3.250', 'startup.import_s': '0.500',
                      'startup.backend_cache': 'export hit, compiled hit', 'other': '1'})
    assert startup_values(done) == {'startup.time_to_first_command_s': 3.25,
                                    'startup.import_s': 0.5,
                                    'startup.backend_cache': 'export hit, compiled hit'}


def test_bench_tells_a_node_that_sends_nothing_from_one_still_starting():
    """A node whose every chunk comes after its last action was due never commands; the
    benchmark measures it (0 commands/s) instead of waiting out its start-up timeout."""
    from act_ros.bench.node import sends_nothing

    def diag(active, computed, late):
        return (0, 'warn', {'active': active, 'chunks_computed': computed, 'chunks_late': late})

    assert sends_nothing(diag('True', '3', '3'))
    assert not sends_nothing(diag('True', '1', '1'))    # one late chunk: still starting up
    assert not sends_nothing(diag('True', '4', '3'))    # one came in time: it commands
    assert not sends_nothing(diag('False', '3', '3'))   # not active
    assert not sends_nothing(diag('True', 'n/a', '3')) and not sends_nothing(None)


def test_bench_node_describes_the_created_checkpoint_and_checks_its_options(capsys):
    from act_ros.bench.node import parse_args, summarize

    args = parse_args(['--model-size', '240x320', '--chunk-size', '100'])
    assert args.model_size == (240, 320) and args.chunk_size == 100
    for bad, message in [(['--model-size', '240'], 'expected HxW'),
                         (['--model-size', '8x8'], 'at least 16x16'),
                         (['--model-path', 'x', '--chunk-size', '100'], 'cannot be combined'),
                         (['--chunk-size', '0'], '--chunk-size must be >= 1')]:
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert message in capsys.readouterr().err

    from act_ros.ros.harness import ReceivedCommand

    # 31 commands at 30 Hz with one gap of three periods at the middleware; this process's
    # callbacks ran late, in bunches of five, which must not count as the node's gaps.
    sent = [k / 30 for k in range(20)] + [(k + 2) / 30 for k in range(20, 31)]

    class Received:
        commands = [ReceivedCommand(sent[k - k % 5 + 4] if k - k % 5 + 4 < 31 else sent[-1],
                                    np.zeros(6), (), 1e9 + t) for k, t in enumerate(sent)]

    before = (0, 'ok', {'chunks_late': '1', 'missed_periods': '4'})
    after = (0, 'ok', {'chunks_late': '3', 'missed_periods': '6', 'realtime.feasible': 'False',
                       'realtime.feasibility': '2 x (32 + 2 margin) = 68 > 30',
                       'realtime.latency_worst_ms': '1050.0'})
    # The window ends one period after the last command: no missed periods at its edges.
    result = summarize(Received, 0.0, 33 / 30, 30.0, after, before=before)
    assert result['commands'] == 31 and result['missed_periods'] == 2
    assert result['missed_periods_at_callback'] > 2
    assert result['chunks_late'] == 3 and result['chunks_late_in_window'] == 2
    assert result['node_missed_periods_in_window'] == 2
    assert result['realtime_feasible'] == 'False' and result['realtime_latency_worst_ms'] == 1050
    # No latency split reported: no chunk counted in the window.
    assert result['split_chunks'] == 0

    # The latency split over the window: the counters' growth per chunk (4 chunks here),
    # beside the model alone measured at configure.
    before[2].update({'latency_split.chunks': '2', 'latency_split.model_sum_ms': '200.0',
                      'latency_split.transfer_sum_ms': '10.0',
                      'latency_split.total_sum_ms': '230.0'})
    after[2].update({'latency_split.chunks': '6', 'latency_split.model_sum_ms': '640.0',
                     'latency_split.transfer_sum_ms': '30.0', 'latency_split.total_sum_ms': '710.0',
                     'latency_split.model_only_ms': '100.0', 'precision': 'fp32',
                     'realtime.measured_precision': 'fp32'})
    result = summarize(Received, 0.0, 33 / 30, 30.0, after, before=before)
    assert result['split_chunks'] == 4
    assert result['split_model_ms'] == pytest.approx(110.0)
    assert result['split_transfer_ms'] == pytest.approx(5.0)
    assert result['split_total_ms'] == pytest.approx(120.0)
    assert result['split_total_over_model_only'] == pytest.approx(1.2)
    assert result['precision'] == result['realtime_measured_precision'] == 'fp32'


def test_bench_node_feeds_object_poses_to_a_policy_that_takes_them(tiny_checkpoint,
                                                                    tiny_pose_checkpoint):
    """A checkpoint with the environment state gets the box and pad poses on the node's
    object pose topics (config/act.yaml); one without gets none."""
    import yaml

    from act_ros.bench.node import BENCH_OBJECT_POSES, object_pose_feeds
    from act_ros.core.contract import load_contract
    from act_ros.core.paths import config_path

    topics = yaml.safe_load(config_path('act.yaml').read_text())['/**/act_node'][
        'ros__parameters']['object_pose_topics']
    feeds = object_pose_feeds(tiny_pose_checkpoint, load_contract())
    assert feeds == {topics['box']: BENCH_OBJECT_POSES['box'],
                     topics['pad']: BENCH_OBJECT_POSES['pad']}
    assert object_pose_feeds(tiny_checkpoint, load_contract()) == {}
