"""Scripted expert: succeeds, moves smoothly within limits, never trips the release gate,
acts from the measured state (so it recovers from perturbations and can label any state)."""

import math

import numpy as np
import pytest

pytest.importorskip('mujoco')

from act_ros.core.control.release_gate import GateState, ReleaseGate  # noqa: E402
from act_ros.sim import ExpertConfig, PortPickAlignEnv, ScriptedExpert, SimConfig, summarize_results  # noqa: E402
from act_ros.sim.perturb import PERTURBATIONS, Perturbation, run_perturbed_episode, sample_perturbation  # noqa: E402

pytestmark = pytest.mark.sim

SEEDS = (0, 1, 2, 3)
FINGERTIP_BELOW_TCP_M = 0.012  # the finger pads end this far below the tool centre point


@pytest.fixture(scope='module')
def env():
    with PortPickAlignEnv(SimConfig.from_yaml(render=False)) as environment:
        yield environment


def _run(env, expert, seed, *, force_open_after_carry_ticks=None):
    """One episode with an independent ReleaseGate watching the expert's gripper commands."""
    watcher = ReleaseGate()
    obs = env.reset(seed=seed)
    expert.reset(obs)
    actions, phases, decisions, observations = [], [], [], []
    carry_ticks = 0
    forced = False
    while not env.done:
        action = expert.act(obs)
        decisions.append(watcher.apply(action[5], obs.ee_position, obs.pad_pose[:3],
                                       measured_gripper=obs.joint_positions[5]))
        carry_ticks += expert.phase == 'carry'
        if force_open_after_carry_ticks is not None and carry_ticks >= force_open_after_carry_ticks:
            action = action.copy()
            action[5] = 1.0          # the simulator itself obeys: the gripper opens
            forced = True
        actions.append(action)
        phases.append(expert.phase)
        observations.append(obs)
        obs = env.step(action)
    return {'result': env.evaluate(), 'actions': np.array(actions), 'phases': phases,
            'decisions': decisions, 'watcher': watcher, 'forced': forced,
            'observations': observations, 'expert_gate_tripped': expert.gate_tripped,
            'ik_error': expert.max_ik_error_m}


@pytest.fixture(scope='module')
def episodes(env):
    expert = ScriptedExpert(env)
    return {seed: _run(env, expert, seed) for seed in SEEDS}


def test_expert_succeeds_and_the_metrics_say_so(episodes):
    results = [ep['result'] for ep in episodes.values()]
    for ep in episodes.values():
        r = ep['result']
        assert r.success, r
        assert r.released and r.box_on_pad and r.box_still
        assert r.max_box_height_m > 0.03          # it was carried, not pushed
        assert r.position_error_m < 0.003 and r.yaw_error_deg < 2.0
    summary = summarize_results(results)
    assert summary['align_rate'] == 1.0 and summary['count'] == len(SEEDS)


def test_expert_goes_through_the_task_phases_in_order(episodes):
    order = ('approach', 'descend', 'close', 'lift', 'carry', 'place', 'release', 'retreat')
    for ep in episodes.values():
        seen = list(dict.fromkeys(ep['phases']))   # first occurrences, in order
        assert [p for p in order if p in seen] == seen, seen
        assert {'close', 'carry', 'place', 'release', 'retreat'} <= set(seen)


def test_expert_never_trips_the_release_gate(episodes):
    for ep in episodes.values():
        watcher = ep['watcher']
        assert watcher.suppressed_releases == 0
        assert not any(d.changed for d in ep['decisions'])
        # The gate really engaged: it held the box, then let the release through.
        states = [d.state for d in ep['decisions']]
        assert GateState.HOLDING in states
        assert watcher.state is GateState.RELEASED
        assert not ep['expert_gate_tripped']


def test_expert_actions_are_within_limits_and_smooth(env, episodes):
    lower, upper = env.contract.lower, env.contract.upper
    for ep in episodes.values():
        actions = ep['actions']
        assert np.all(actions >= lower) and np.all(actions <= upper)
        step = np.abs(np.diff(actions[:, :5], axis=0))
        assert step.max() < 0.08               # rad per tick (2.4 rad/s)
        assert set(np.unique(actions[:, 5])) == {0.0, 1.0}
        assert ep['ik_error'] < 1e-3            # every target was reachable


def test_placing_and_releasing_outlast_an_action_chunk(episodes):
    """The descent over the pad takes more than 30 ticks; from the release until the
    fingertips clear the box, the arm stays where it let go (no sideways motion) for more
    than 30 ticks with the gripper open."""
    for ep in episodes.values():
        phases, actions, observations = ep['phases'], ep['actions'], ep['observations']
        place = [i for i, p in enumerate(phases) if p == 'place']
        assert len(place) > 30
        first_release = phases.index('release')
        beside = [i for i in range(first_release, len(phases))
                  if observations[i].ee_position[2] - FINGERTIP_BELOW_TCP_M
                  < observations[i].box_pose[2] + 0.015]
        assert len(beside) > 30
        assert np.all(actions[beside, 5] == 1.0)
        xy = np.array([observations[i].ee_position[:2] for i in beside])
        assert np.ptp(xy, axis=0).max() < 1e-3
        # Yaw alignment happens in transit: the wrist roll changes while carrying.
        carry = [i for i, p in enumerate(phases) if p in ('lift', 'carry')]
        assert np.ptp(actions[carry, 4]) > 0.0


def test_box_held_open_for_the_rest_of_the_episode_is_a_failure(env):
    """The simulator obeys the gripper: forced open from mid-carry on, the box stays down."""
    ep = _run(env, ScriptedExpert(env), seed=SEEDS[0], force_open_after_carry_ticks=10)
    r = ep['result']
    assert ep['forced']
    assert r.max_box_height_m > 0.03           # it had been lifted before the drop
    assert not r.success


def test_expert_acts_from_the_measured_state_alone(env, episodes):
    """A fresh expert shown any state of an episode commands what the running one did:
    the action is a function of the observation (the only memory breaks near-ties of the
    yaw choice), which is what lets it label states a learned policy visits (DAgger)."""
    fresh = ScriptedExpert(env)
    for ep in episodes.values():
        observations, actions = ep['observations'], ep['actions']
        same = 0
        for t in range(0, len(observations), 7):
            fresh.reset(observations[t])  # the gate never changed a command of the episode
            same += np.allclose(fresh.act(observations[t]), actions[t], atol=1e-9)
        assert same == len(range(0, len(observations), 7))


@pytest.mark.parametrize('kind', PERTURBATIONS)
def test_expert_recovers_from_perturbations(env, kind):
    rng = np.random.default_rng(5)
    expert = ScriptedExpert(env)
    for seed in (4_000_000, 4_000_001):
        perturbation = sample_perturbation(kind, rng)
        outcome = run_perturbed_episode(env, expert, seed, perturbation)
        assert outcome.fired_tick is not None, perturbation
        assert outcome.result.success, (perturbation, outcome.result)
        if kind == 'push_box':
            assert 0.02 <= outcome.push_m <= 0.04


def test_the_gripper_forced_open_in_transit_drops_the_box_and_the_expert_picks_it_again(env):
    expert = ScriptedExpert(env)
    outcome = run_perturbed_episode(env, expert, 4_000_010,
                                    Perturbation('open_gripper', 'carry', delay_ticks=5))
    assert outcome.fired_tick is not None and outcome.result.success
    # After the drop the gate still held (HOLDING): it kept the fingers closed until they
    # measured empty, then let the expert open them to grasp again.
    assert expert.gate.objects_lost == 1
    assert expert.gate.suppressed_releases > 0
    assert outcome.result.max_box_height_m > 0.03


def test_expert_config_validates():
    with pytest.raises(ValueError, match='gain_per_tick'):
        ExpertConfig(gain_per_tick=1.5)
    with pytest.raises(ValueError, match='place_speed_per_tick_m'):
        ExpertConfig(place_speed_per_tick_m=0.0)
    with pytest.raises(ValueError, match='travel_clearance_m'):
        ExpertConfig(travel_clearance_m=0.03)


def test_perturbation_validates():
    with pytest.raises(ValueError, match='unknown perturbation'):
        Perturbation('shake', 'carry', 0)
    with pytest.raises(ValueError, match="fires in"):
        Perturbation('open_gripper', 'approach', 0)
    assert math.isfinite(sample_perturbation('displace_arm', np.random.default_rng(0))
                         .joint_offsets_rad[0])
