"""precision auto (act_ros.core.inference.precision): the rule with injected CPU flags, the check of
bf16 against fp32 with real backends (bf16 itself only where the CPU computes it natively),
the fallback to fp32, and where the result shows (runtime, verdict, node, evaluator); the
latency split of background chunks (act_ros.core.inference.latency_split)."""

import extras
import numpy as np
import pytest
import torch

from act_ros.core.inference import precision as precision_rules
from act_ros.core.inference.backends import installed_backends
from act_ros.core.inference.feasibility import Latency, verdict
from act_ros.core.inference.latency_split import PARTS, ChunkTiming, SplitStats, window_line, window_means
from act_ros.core.inference.precision import (
    DEFAULT_TOLERANCE,
    PrecisionPlan,
    auto_precision,
    check_observations,
    compare_backends,
    cpu_has_native_bf16,
    parse_cpuinfo_flags,
)
from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

NATIVE_BF16 = cpu_has_native_bf16()
NO_BF16 = ('this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 among its flags): '
           'OpenVINO refuses bf16 here')
HAS_OPENVINO = 'openvino' in installed_backends()
needs_openvino = extras.needs_openvino

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse sse2 avx2 avx512f avx512_bf16 amx_tile
bogomips\t: 4000

processor\t: 1
flags\t\t: fpu sse
"""


@pytest.fixture
def flags(monkeypatch):
    """Inject the CPU flags the detection sees (in this process)."""
    def use(values):
        monkeypatch.setattr(precision_rules, 'cpu_flags', lambda: frozenset(values))
    return use


def test_cpuinfo_flags_are_the_first_processors():
    assert parse_cpuinfo_flags(CPUINFO) == {'fpu', 'sse', 'sse2', 'avx2', 'avx512f',
                                            'avx512_bf16', 'amx_tile'}
    assert parse_cpuinfo_flags('processor : 0\n') == frozenset()


def test_detection_agrees_with_torch_on_this_cpu():
    caps = torch.cpu.get_capabilities()
    assert cpu_has_native_bf16() == bool(caps.get('avx512_bf16') or caps.get('amx_bf16'))


@pytest.mark.parametrize('cpu, saturates', [
    ({'sse2', 'avx2', 'fma'}, True),  # AVX2: byte products summed in pairs in 16 bits
    ({'sse2', 'avx2', 'avx512f', 'avx512bw'}, True),  # AVX-512 without VNNI
    ({'sse2', 'avx2', 'avx512f', 'avx512_vnni'}, False),
    ({'sse2', 'avx2', 'avx_vnni'}, False),
    ({'sse2', 'amx_int8', 'amx_tile'}, False),
    ({'fp', 'asimd', 'asimddp'}, False),  # an Arm CPU (/proc/cpuinfo 'Features')
])
def test_int8_saturation_is_told_by_the_cpu_flags(cpu, saturates):
    assert precision_rules.cpu_saturates_int8(cpu) is saturates


def test_int8_saturation_detection_agrees_with_torch_on_this_cpu():
    caps = torch.cpu.get_capabilities()
    dot = any(caps.get(flag) for flag in precision_rules.INT8_DOT_FLAGS)
    assert precision_rules.cpu_saturates_int8() == (caps.get('architecture') == 'x86_64'
                                                    and not dot)


@pytest.mark.parametrize('backend, cpu, expected', [
    ('openvino', {'avx2', 'avx512_bf16'}, 'bf16'),
    ('openvino', {'amx_bf16', 'amx_tile'}, 'bf16'),
    ('openvino', {'avx2', 'avx512f', 'avx512_vnni'}, 'fp32'),  # AVX-512 without BF16
    ('openvino', set(), 'fp32'),
    ('torch', {'avx512_bf16'}, 'fp32'),
    ('onnxruntime', {'amx_bf16'}, 'fp32'),
])
def test_auto_rule_with_injected_flags(backend, cpu, expected):
    chosen, why = auto_precision(backend, flags=cpu)
    assert chosen == expected
    if expected == 'bf16':
        assert 'natively' in why and any(f in why for f in ('avx512_bf16', 'amx_bf16'))
    plan = PrecisionPlan.make('auto', backend, flags=cpu)
    assert plan.build == 'fp32' and plan.candidate == (None if expected == 'fp32' else 'bf16')
    # A precision as set is built as asked, never checked.
    assert PrecisionPlan.make('fp32', backend, flags=cpu).candidate is None


def test_auto_picks_fp32_on_a_cpu_without_bf16(flags):
    flags({'avx2', 'avx512f', 'avx512_vnni'})  # what the detection sees, on any CPU
    assert auto_precision('openvino') == ('fp32', 'this CPU has no native bfloat16 (no '
                                          'avx512_bf16 or amx_bf16 among its flags): bf16 '
                                          'would be emulated')


@pytest.mark.parametrize('tolerance', [-0.1, float('nan'), float('inf')])
def test_bad_tolerance_is_refused(tolerance, tiny_checkpoint):
    with pytest.raises(ValueError, match='precision_tolerance must be a finite number >= 0'):
        RuntimeConfig(model_path=tiny_checkpoint, precision='auto', precision_tolerance=tolerance)
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        RuntimeConfig(model_path=tiny_checkpoint, precision='int4')


def test_training_and_inference_share_the_detection(flags):
    """Training's --precision auto and the inference rule read the same flags."""
    from act_ros.training.loop import resolve_precision
    cpu = torch.device('cpu')
    flags({'avx512_bf16'})
    assert resolve_precision('auto', cpu) == 'bf16'
    assert PrecisionPlan.make('auto', 'openvino').candidate == 'bf16'
    flags({'avx2'})
    assert resolve_precision('auto', cpu) == 'fp32'
    assert PrecisionPlan.make('auto', 'openvino').candidate is None


def test_check_observations_start_with_the_warm_up_one():
    cameras = [('top', 'observation.images.top', (4, 6))]
    lower, upper = -np.ones(6), np.ones(6)
    obs = check_observations(cameras, lower, upper, 10, count=3)
    assert len(obs) == 3 and not obs[0].images['top'].any() and np.all(obs[0].state == 0)
    assert all(o.images['top'].shape == (4, 6, 3) for o in obs)
    assert all(np.all((o.state >= lower) & (o.state <= upper)) for o in obs[1:])
    assert obs[1].environment_state.shape == (10,)
    again = check_observations(cameras, lower, upper, 10, count=3)
    assert np.array_equal(obs[2].images['top'], again[2].images['top'])  # seeded


# -- real backends ------------------------------------------------------------------------

@pytest.fixture
def exported(exported_checkpoint):
    extras.skip_unless(HAS_OPENVINO, 'openvino', 'openvino')
    return exported_checkpoint


def _runtime(checkpoint, **overrides):
    config = dict(model_path=checkpoint, device='cpu', execution='sync', backend='openvino',
                  precision='auto', torch_threads=1) | overrides
    return PolicyRuntime(RuntimeConfig(**config))


@needs_openvino
@extras.needs_onnxruntime
@pytest.mark.slow
def test_tolerance_decides_with_real_backends(exported):
    """The check's arithmetic on two real fp32 backends that differ in rounding: OpenVINO as
    the reference, ONNX Runtime as the candidate (bf16 cannot run on every CPU)."""
    from act_ros.core.inference.backends import OnnxRuntimeBackend
    with _runtime(exported, precision='fp32') as rt:
        predictor = rt.predictor
        reference = predictor.backend
        observations = check_observations(predictor.cameras, rt.contract.lower,
                                          rt.contract.upper, 0)

        def candidate():
            return OnnxRuntimeBackend(reference.export, threads=1)

        kept = compare_backends(predictor, candidate, observations, 1.0, requested='auto',
                                why='test', name='onnxruntime')
        assert kept.precision == 'onnxruntime' and not kept.fell_back
        assert predictor.backend is not reference and predictor.backend.name == 'onnxruntime'
        diff = kept.max_diff
        assert 0.0 < diff < 1e-3  # the same fp32 network, summed in another order
        predictor.use_backend(reference)
        refused = compare_backends(predictor, candidate, observations, diff / 2,
                                   requested='auto', why='test', name='onnxruntime')
        assert refused.precision == 'fp32' and refused.fell_back
        assert refused.max_diff == pytest.approx(diff) and predictor.backend is reference
        assert 'over the tolerance' in refused.line() and 'kept fp32' in refused.line()
        values = refused.as_values()
        assert values['precision.check_max_diff'] == pytest.approx(diff)
        assert values['precision.fell_back'] is True and values['precision'] == 'fp32'


@needs_openvino
@pytest.mark.slow
def test_auto_runs_fp32_without_bf16_and_the_verdict_says_so(exported, flags):
    flags({'avx2'})  # a CPU without native bf16, whatever this one has
    with _runtime(exported) as rt:
        check = rt.precision_check
        assert (check.requested, check.precision, check.candidate) == ('auto', 'fp32', None)
        assert rt.precision == 'fp32' and rt.predictor.backend.precision == 'fp32'
        result = rt.feasibility(30.0, Latency(0.1, 0.1, 2))
        assert result.precision == 'openvino fp32'
        assert '(openvino fp32)' in result.line()
        assert result.as_values()['measured_precision'] == 'openvino fp32'


@needs_openvino
@pytest.mark.slow
def test_bf16_that_cannot_run_falls_back_to_fp32(exported, flags):
    """Flags that claim native bf16: auto tries bf16; on a CPU that lacks it OpenVINO refuses
    to compile it, and the model stays fp32 with the reason."""
    flags({'avx512_bf16'})
    with _runtime(exported) as rt:
        check = rt.precision_check
        assert check.candidate == 'bf16'
        if NATIVE_BF16:
            assert check.failure == '' and check.max_diff is not None
            return
        assert check.precision == 'fp32' and check.fell_back and rt.precision == 'fp32'
        assert 'cannot run it natively' in check.failure
        assert rt.predictor.backend.precision == 'fp32'
        assert 'bf16 could not run here, kept fp32' in check.line()


@needs_openvino
@pytest.mark.skipif(not NATIVE_BF16, reason=NO_BF16)
@pytest.mark.slow
def test_bf16_is_kept_within_the_tolerance_and_refused_over_it(exported):
    with _runtime(exported) as rt:
        check = rt.precision_check
        assert check.candidate == 'bf16' and check.max_diff is not None
        assert check.max_diff <= DEFAULT_TOLERANCE, check.line()
        assert check.precision == 'bf16' and rt.predictor.backend.precision == 'bf16'
        assert '(openvino bf16)' in rt.feasibility(30.0, Latency(0.1, 0.1, 2)).line()
    if check.max_diff > 0:
        with _runtime(exported, precision_tolerance=check.max_diff / 2) as rt:
            assert rt.precision_check.fell_back and rt.precision == 'fp32'
            assert rt.predictor.backend.precision == 'fp32'


def test_check_observations_saved_beside_a_checkpoint_load_back(tmp_path):
    """save_check_observations / load_check_observations: frames, state and object poses
    round-trip; a file that lacks an input the checkpoint takes is not used."""
    from act_ros.core.inference.precision import (
        CHECK_OBSERVATIONS_FILE,
        load_check_observations,
        save_check_observations,
    )

    cameras = [('top', 'observation.images.top', (12, 16)), ('wrist', 'w', (12, 16))]
    saved = check_observations(cameras, np.zeros(6), np.ones(6), 10, count=4, seed=1)
    assert load_check_observations(tmp_path, ['top']) is None  # none there
    path = save_check_observations(tmp_path, saved)
    assert path == tmp_path / CHECK_OBSERVATIONS_FILE
    loaded = load_check_observations(tmp_path, ['top', 'wrist'], 10)
    assert len(loaded) == 4
    for a, b in zip(saved, loaded):
        np.testing.assert_array_equal(a.images['top'], b.images['top'])
        np.testing.assert_array_equal(a.state, b.state)
        np.testing.assert_allclose(a.environment_state, b.environment_state)
    assert load_check_observations(tmp_path, ['top', 'side']) is None  # a camera missing
    assert load_check_observations(tmp_path, ['top'], 7) is None  # other object features
    assert load_check_observations(tmp_path, ['top'])[0].environment_state is None


@needs_openvino
@pytest.mark.skipif(not NATIVE_BF16, reason=NO_BF16)
@pytest.mark.slow
def test_bf16_set_by_name_is_checked_on_the_saved_observations_and_refused_over_it(
        exported, tmp_path):
    """precision bf16 (openvino) set by name: checked against fp32 on the observations saved
    beside the checkpoint (not synthetic ones), kept within the tolerance, refused over it
    with the figure in the error (never silently replaced by fp32)."""
    import shutil

    from act_ros.core.contract import load_contract
    from act_ros.core.errors import PrecisionRefusedError
    from act_ros.core.inference.precision import save_check_observations

    ckpt = tmp_path / 'ckpt'
    shutil.copytree(exported, ckpt)
    contract = load_contract()
    cameras = [(c, f'observation.images.{c}', (48, 64)) for c in contract.camera_names]
    save_check_observations(ckpt, check_observations(cameras, contract.lower, contract.upper,
                                                     0, count=8, seed=5))
    with _runtime(ckpt, precision='bf16') as rt:
        check = rt.precision_check
        assert (check.requested, check.candidate, check.source, check.observations) == (
            'bf16', 'bf16', 'saved', 8)
        assert 'on 8 real observations saved with the checkpoint' in check.line()
        assert check.precision == 'bf16' and not check.warning, check.line()
        diff = check.max_diff
    assert diff > 0
    with pytest.raises(PrecisionRefusedError) as refused:
        _runtime(ckpt, precision='bf16', precision_tolerance=diff / 2)
    line = str(refused.value)
    assert f'max normalized action difference {diff:.4f}, over the tolerance' in line, line
    assert 'bf16 refused' in line and 'set precision fp32' in line


@needs_openvino
@pytest.mark.slow
def test_process_child_settles_the_precision_and_splits_each_chunk(exported, flags):
    """execution process: the child runs the check (bf16 claimed by the injected flags;
    refused on a CPU without it), reports it, and every background chunk comes back with
    its parts; the model-only time comes from the same child."""
    flags({'amx_bf16'})
    config = dict(model_path=exported, device='cpu', execution='process', backend='openvino',
                  precision='auto', torch_threads=1, n_action_steps=4)
    with PolicyRuntime(RuntimeConfig(**config)) as rt:
        check = rt.precision_check
        assert check is not None and check.requested == 'auto' and check.candidate == 'bf16'
        assert rt.precision == ('bf16' if NATIVE_BF16 and not check.fell_back else 'fp32')
        # A restarted child builds the settled precision, unchecked.
        assert rt._remote.spec.precision_plan is None
        assert rt._remote.spec.options.precision == rt.precision
        obs = check_observations([(c, f'observation.images.{c}', (48, 64))
                                  for c in rt.cameras], rt.contract.lower, rt.contract.upper,
                                 0, count=2)[1]
        rt.reset()
        for _ in range(12):
            rt.act(obs)
            rt.wait_idle(30)
        rt.act(obs)
        split = rt.stats.split
        assert split.chunks == rt.stats.chunks_computed >= 2
        values = split.as_values()
        sums = [values[f'latency_split.{part}_sum_ms'] for part in PARTS]
        assert all(value >= 0 for value in sums)
        assert values['latency_split.model_sum_ms'] > 0
        assert values['latency_split.transfer_sum_ms'] > 0  # crossed a socket
        assert sum(sums) <= values['latency_split.total_sum_ms']
        times = rt.measure_model_only(3)
        assert len(times) == 3 and all(t > 0 for t in times)
        assert split.as_values()['latency_split.model_only_calls'] == 3


@needs_openvino
@pytest.mark.slow
@pytest.mark.parametrize('execution', ['sync', 'process'])
def test_without_saved_observations_the_check_waits_for_live_ones(exported, flags, execution):
    """precision_check_live (act_node): with no saved observations beside the checkpoint the
    candidate is not checked on synthetic frames at start-up; the model runs fp32 and the
    check runs once, on the observations given at activation (in the child too), and a
    precision set by name that drifts on them is refused there."""
    from act_ros.core.errors import PrecisionRefusedError

    flags({'amx_bf16'})  # auto's candidate is bf16 (kept only where the CPU runs it)
    config = dict(model_path=exported, device='cpu', execution=execution, backend='openvino',
                  precision='auto', torch_threads=1, precision_check_live=True)
    with PolicyRuntime(RuntimeConfig(**config)) as rt:
        check = rt.precision_check
        assert check.pending and check.candidate == 'bf16' and rt.precision == 'fp32'
        assert 'first live observations at activation' in check.line() and not check.warning
        assert check.as_values()['precision.check_source'] == 'pending'
        live = check_observations([(c, f'observation.images.{c}', (48, 64)) for c in rt.cameras],
                                  rt.contract.lower, rt.contract.upper, 0, count=4, seed=9)[1:]
        settled = rt.settle_precision(live)
        assert settled.source == 'live' and not settled.pending
        if not settled.failure:  # bf16 ran: checked on the 3 observations given
            assert settled.observations == 3 and settled.max_diff is not None
            assert '3 live observations before activation' in settled.line()
        assert rt.precision == settled.precision
        assert rt.settle_precision(live) is settled  # settled once
        if execution == 'process':  # a restarted child builds the settled precision
            assert rt._remote.spec.options.precision == settled.precision
        rt.act(live[0])
    if not NATIVE_BF16:
        return
    named = dict(config, precision='bf16', precision_tolerance=1e-12)
    with PolicyRuntime(RuntimeConfig(**named)) as rt:
        assert rt.precision_check.pending and rt.precision == 'fp32'
        with pytest.raises(PrecisionRefusedError) as refused:
            rt.settle_precision(live)
        assert 'on 3 live observations before activation' in str(refused.value)
        assert refused.value.values['precision.refused'] is True
        assert rt.precision == 'fp32'


def test_child_timing_arithmetic():
    timing = ChunkTiming.from_child(10.0, 10.5, {'received': 10.02, 'replied': 10.49,
                                                 'preprocess_s': 0.1, 'model_s': 0.3,
                                                 'postprocess_s': 0.05})
    assert timing.total_s == pytest.approx(0.5)
    assert timing.transfer_s == pytest.approx(0.02) and timing.return_s == pytest.approx(0.01)
    assert timing.other_s == pytest.approx(0.02)
    stats = SplitStats()
    stats.add(timing)
    stats.add(ChunkTiming.in_process(0.2, {'preprocess_s': 0.05, 'model_s': 0.14}))
    values = stats.as_values()
    assert values['latency_split.chunks'] == 2
    assert values['latency_split.model_sum_ms'] == pytest.approx(440.0)
    assert values['latency_split.transfer_sum_ms'] == pytest.approx(20.0)
    assert values['latency_split.model_only_ms'] == 'n/a'
    assert values['latency_split.total_over_model_only'] == 'n/a'
    stats.set_model_only([0.2, 0.3, 0.25])
    values = stats.as_values()
    assert values['latency_split.model_only_ms'] == pytest.approx(250.0)
    assert values['latency_split.total_p50_ms'] == pytest.approx(350.0)  # of 500 and 200
    assert values['latency_split.total_over_model_only'] == pytest.approx(1.4)


def test_window_means_difference_two_readings_as_strings():
    """What a benchmark reads from /diagnostics (strings) at a window's start and end."""
    stats = SplitStats()
    stats.add(ChunkTiming(total_s=1.0, transfer_s=0.1, model_s=0.8))
    before = {k: str(v) for k, v in stats.as_values().items()}
    stats.add(ChunkTiming(total_s=0.5, transfer_s=0.02, preprocess_s=0.03, model_s=0.4,
                          return_s=0.01))
    stats.add(ChunkTiming(total_s=0.7, transfer_s=0.04, preprocess_s=0.05, model_s=0.6,
                          return_s=0.01))
    stats.set_model_only([0.5])
    after = {k: str(v) for k, v in stats.as_values().items()}
    means = window_means(before, after)
    assert means['chunks'] == 2
    assert means['transfer_ms'] == pytest.approx(30.0) and means['model_ms'] == pytest.approx(500.0)
    assert means['total_ms'] == pytest.approx(600.0) and means['other_ms'] == pytest.approx(20.0)
    assert means['total_over_model_only'] == pytest.approx(1.2)
    assert 'transfer 30 ms' in window_line(means) and '1.20x' in window_line(means)
    assert window_means(after, after) == {'chunks': 0}
    assert window_means(None, after)['chunks'] == 3
    assert 'no chunk' in window_line({'chunks': 0})


def test_verdict_names_what_it_measured():
    result = verdict(mode='chunk', execution='process', rate_hz=30.0, chunk_size=30,
                     n_action_steps=30, latency=Latency(0.18, 0.18, 2),
                     precision='openvino bf16')
    assert '; model (openvino bf16) 180 ms median' in result.line()
    assert result.feasible and result.as_values()['measured_precision'] == 'openvino bf16'
    plain = verdict(mode='chunk', execution='process', rate_hz=30.0, chunk_size=30,
                    n_action_steps=30, latency=Latency(0.18, 0.18, 2))
    assert 'measured_precision' not in plain.as_values() and '; model 180 ms' in plain.line()


def test_node_and_evaluator_default_to_auto():
    import yaml

    from act_ros.core.paths import config_path
    from act_ros.ros.node.parameters import parameter_specs
    from act_ros.training.evaluation.evaluate import build_parser
    specs = {s.name: s for s in parameter_specs(None)}
    assert specs['precision'].default == 'auto'
    # The node offers what the runtime runs (its constants), plus auto.
    from act_ros.core.inference.options import PRECISIONS
    assert specs['precision'].choices == ('auto', *PRECISIONS)
    assert set(PRECISIONS) == {'fp32', 'fp16', 'bf16', 'int8'}
    assert specs['precision_tolerance'].default == DEFAULT_TOLERANCE
    node_yaml = yaml.safe_load(config_path('act.yaml').read_text())['/**/act_node'][
        'ros__parameters']
    assert node_yaml['precision'] == 'auto'
    assert node_yaml['precision_tolerance'] == DEFAULT_TOLERANCE
    args = build_parser().parse_args(['--checkpoint', 'ckpt'])
    assert (args.precision, args.precision_tolerance) == ('auto', DEFAULT_TOLERANCE)
    assert build_parser().parse_args(['--checkpoint', 'c', '--precision', 'bf16']).precision == 'bf16'
    assert build_parser().parse_args(['--checkpoint', 'c', '--precision', 'int8']).precision == 'int8'
    with pytest.raises(SystemExit):
        build_parser().parse_args(['--checkpoint', 'c', '--precision', 'int4'])


@pytest.mark.ros
@needs_openvino
@pytest.mark.slow
def test_node_reports_precision_and_latency_split(rclpy_context, exported):
    """act_node with its defaults (precision auto) on backend openvino in a child process:
    the settled precision, the verdict's precision and the model-only time on
    /diagnostics' key/values."""
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from act_ros.ros.node.act_node import ActNode
    values = {'model_path': str(exported), 'autostart': False, 'torch_threads': 1,
              'backend': 'openvino', 'visualization.enabled': False}
    node = ActNode(context=rclpy_context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        _, _, report = node.status.report()
        # No saved observations beside this checkpoint: a bf16 candidate waits for the live
        # inputs at activation (test_node_checks_the_precision_on_live_inputs_...), fp32 until.
        expected = 'fp32'
        assert report['precision'] == expected and report['precision.requested'] == 'auto'
        assert report['realtime.measured_precision'] == f'openvino {expected}'
        # The model's part of the two timed calls behind the verdict: no extra call.
        assert report['latency_split.model_only_calls'] == 2
        assert 0 < report['latency_split.model_only_ms'] <= report['realtime.latency_worst_ms']
        assert report['latency_split.chunks'] == 0  # nothing requested before activation
        if NATIVE_BF16:
            assert report['precision.check_source'] == 'pending' and report[
                'precision.check_tolerance'] == DEFAULT_TOLERANCE
    finally:
        node.destroy_node()


@pytest.mark.ros
@needs_openvino
@pytest.mark.slow
def test_node_checks_the_precision_on_live_inputs_before_it_activates(rclpy_context, exported,
                                                                      flags):
    """act_node, a checkpoint without saved check observations: configure leaves the
    candidate pending (fp32 runs), the node samples its live inputs while inactive, and
    activation checks the candidate on them; bf16 set by name that drifts on them is
    refused at activation with the figure on /diagnostics, and the node stays inactive."""
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from act_ros.core.contract import load_contract
    from act_ros.ros.harness import RobotHarness, spinning, wait_until
    from act_ros.ros.node.act_node import ActNode

    flags({'amx_bf16'})  # auto's candidate is bf16 on every CPU (kept where it runs)
    contract = load_contract()
    joints = dict(zip(contract.joint_names, (contract.lower + contract.upper) / 2))
    harness = RobotHarness(context=rclpy_context, joints=joints,
                           image=np.full((48, 64, 3), 90, np.uint8), rate_hz=20.0)

    def node_with(**params):
        values = {'model_path': str(exported), 'autostart': False, 'torch_threads': 1,
                  'backend': 'openvino', 'visualization.enabled': False,
                  'max_obs_age_s': 2.0, 'diagnostics_period_s': 0.2, **params}
        return ActNode(context=rclpy_context,
                       parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])

    node = node_with()
    with spinning(rclpy_context, harness, node):
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        check = node.loop.runtime.precision_check
        assert check.pending and node.loop.runtime.precision == 'fp32', check.line()
        assert wait_until(lambda: len(node._check_samples) >= 3, 120.0), \
            'no live observations sampled while inactive'
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        check = node.loop.runtime.precision_check
        assert check.source == 'live' and check.observations >= 3, check.line()
        _, _, report = node.status.report()
        assert report['precision.check_source'] == 'live'
        assert report['precision'] == node.loop.runtime.precision
    if not NATIVE_BF16:
        return
    harness = RobotHarness(context=rclpy_context, joints=joints,
                           image=np.full((48, 64, 3), 90, np.uint8), rate_hz=20.0)
    node = node_with(precision='bf16', precision_tolerance=1e-12)
    with spinning(rclpy_context, harness, node):
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert wait_until(lambda: len(node._check_samples) >= 3, 120.0)
        assert node.trigger_activate() == TransitionCallbackReturn.FAILURE
        assert not node.is_active and node.lifecycle_state == 'inactive'
        assert wait_until(lambda: any(d[2].startswith('activate refused')
                                      for d in harness.diagnostics), 120.0)
    message, values = next((d[2], d[3]) for d in harness.diagnostics
                           if d[2].startswith('activate refused'))
    print(message)
    assert 'live observations before activation' in message and 'bf16 refused' in message
    assert values['precision.refused'] == 'True' and float(values['precision.check_max_diff']) > 0


@needs_openvino
@pytest.mark.sim
@pytest.mark.slow
def test_evaluate_records_the_settled_precision(exported, tmp_path, capsys, flags):
    """act-ros evaluate --backend openvino with its default precision (auto): the precision
    it ran in, and the check behind it, in each mode's result and on its output. The flags
    claim native bf16, so auto tries bf16 (kept where it runs and passes, else fp32)."""
    pytest.importorskip('mujoco')
    import json

    from act_ros.training.evaluation.evaluate import main
    flags({'avx512_bf16'})
    out = tmp_path / 'eval.json'
    assert main(['--checkpoint', str(exported), '--episodes', '1', '--mode', 'chunk',
                 '--episode-steps', '5', '--backend', 'openvino', '--output', str(out),
                 '--no-progress']) == 0
    data = json.loads(out.read_text())
    assert (data['precision'], data['precision_tolerance']) == ('auto', DEFAULT_TOLERANCE)
    precision = data['modes']['chunk']['precision']
    assert precision['precision.requested'] == 'auto' and precision['precision.candidate'] == 'bf16'
    if not NATIVE_BF16:
        assert precision['precision'] == 'fp32' and precision['precision.fell_back'] is True
        assert 'cannot run it natively' in precision['precision.check_failure']
    printed = capsys.readouterr().out
    assert f"precision {precision['precision']} (requested auto: this CPU computes bfloat16 " \
           'natively (avx512_bf16))' in printed
    if not NATIVE_BF16:
        assert '; bf16 could not run here: DeviceUnavailableError' in printed
