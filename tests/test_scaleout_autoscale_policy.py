"""The SLO-pressure autoscaling policy without a cluster: a replica's pressure from its own server state
(admission's predicted latency, the guard's window P99, over the SLO), the replicas the policy asks for, and
the CLI's refusals of the autoscaling and retry flags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fake_variants import admission_state
from latencylab.cli import main
from latencylab.clock import FakeClock
from latencylab.scaleout.autoscale import FLOOR, PRESSURE, SloPressure, desired, replica_pressure, replica_stats
from latencylab.scaleout.serve_ray import ReplicaOptions, autoscaling_config


def test_pressure_is_the_worse_of_predicted_latency_and_window_p99_over_the_slo() -> None:
    clock = FakeClock()
    state = admission_state(clock)  # one fake model: a 50-ms variant, SLO 30 ms
    svc = state.services["fake"]
    idle = replica_pressure(state)
    # nothing queued or running: a request now costs one batch of one, as admission predicts it
    predicted_ms = (svc.batchers[0].predicted_finish_ns(svc.now_ns()) - svc.now_ns()) / 1e6
    assert idle == pytest.approx(predicted_ms / 30) and predicted_ms > 0
    for _ in range(200):  # answers of 90 ms in the guard's window: its P99 is 3x the SLO, above the prediction
        svc.guard.observe(0, 90e6, probe=False)
    assert replica_pressure(state) == pytest.approx(svc.guard.window_quantile(0) / 30, rel=1e-6)
    assert replica_pressure(state) > 2.9
    assert replica_stats(state)[FLOOR] == pytest.approx(predicted_ms / 30)  # the floor: one request, idle
    clock.advance(60e9)  # the window has passed: back to the prediction
    assert replica_pressure(state) == pytest.approx(predicted_ms / 30)
    idle_stats = replica_stats(state)  # idle: all of the pressure is the floor, none of it is wait
    assert idle_stats[FLOOR] == pytest.approx(idle_stats[PRESSURE]) and idle_stats[FLOOR] > 1


def _ctx(running: int, per: dict[str, float] | None, floors: dict[str, float] | None = None) -> SimpleNamespace:
    metrics: dict[str, dict[str, float]] = {} if per is None else {PRESSURE: per}
    if floors is not None:
        metrics[FLOOR] = floors
    return SimpleNamespace(current_num_replicas=running, target_num_replicas=running, policy_state={},
                           aggregated_metrics=metrics)  # fmt: skip


def test_the_policy_holds_the_mean_pressure_at_its_target() -> None:
    pol = SloPressure(target=0.5)
    assert pol(_ctx(1, {"a": 1.0}))[0] == 2  # an overloaded replica (admission near its 0.9 aim): one more
    assert pol(_ctx(2, {"a": 0.9, "b": 1.1}))[0] == 4
    assert pol(_ctx(2, {"a": 0.5, "b": 0.5}))[0] == 2  # at the target: stay
    assert pol(_ctx(3, {"a": 0.1, "b": 0.2, "c": 0.0}))[0] == 1  # idle: down (Ray's bounds and delay apply)
    n, state = pol(_ctx(2, {"a": 0.75, "b": 0.75}))
    assert n == 3 and state["slo_pressure"] == pytest.approx(0.75)
    assert pol(_ctx(2, None))[0] == 2  # nothing reported yet: keep what is asked
    assert desired(2, float("inf"), 0.5) == 4
    with pytest.raises(ValueError):
        SloPressure(target=0.0)


def test_the_floor_does_not_hold_idle_replicas() -> None:
    pol = SloPressure(target=0.5)
    # two idle replicas of a model costing 0.3 of its SLO: no wait, so one is enough (without the floor: 2)
    assert pol(_ctx(2, {"a": 0.3, "b": 0.3}, {"a": 0.3, "b": 0.3}))[0] == 1
    assert pol(_ctx(2, {"a": 0.3, "b": 0.3}))[0] == 2  # a replica that reports no floor: all of it is wait
    # one overloaded replica, pressure 1.0, floor 0.2: a wait of 0.8 spread until 0.2 + wait = 0.5 -> 3 replicas
    n, state = pol(_ctx(1, {"a": 1.0}, {"a": 0.2}))
    assert n == 3 and state["slo_floor"] == pytest.approx(0.2)
    # a floor at or past the target keeps a fifth of the target as room: it scales on the wait alone
    assert pol(_ctx(2, {"a": 0.8, "b": 0.8}, {"a": 0.8, "b": 0.8}))[0] == 1
    assert pol(_ctx(2, {"a": 1.2, "b": 1.2}, {"a": 0.8, "b": 0.8}))[0] == 8
    assert desired(3, 0.5, 0.5, floor=0.3) == 3  # at the target: stay


def test_the_autoscaling_config_names_the_policy_and_the_bounds() -> None:
    cfg = autoscaling_config(ReplicaOptions(replicas=1, autoscale=(1, 3), autoscale_target=0.6))
    assert (cfg["min_replicas"], cfg["max_replicas"], cfg["initial_replicas"]) == (1, 3, 1)
    assert cfg["policy"] == {"policy_function": "latencylab.scaleout.autoscale:SloPressure",
                             "policy_kwargs": {"target": 0.6}}  # fmt: skip
    from ray.serve.config import AutoscalingConfig  # Ray Serve accepts it as it is

    assert AutoscalingConfig(**cfg).max_replicas == 3


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["serve", "--model", "vision", "--autoscale", "1:3"], "--autoscale needs --ray"),
        (["serve", "--model", "vision", "--retry-shed", "2"], "--retry-shed needs --ray"),
        (["serve", "--model", "vision", "--ray", "--autoscale", "3:2"], "need 1 <= MIN <= MAX"),
        (["serve", "--model", "vision", "--ray", "--autoscale", "x"], "is not MIN:MAX"),
    ],
)
def test_cli_refuses_the_ray_flags_without_ray_or_out_of_range(
    argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of a malformed value
        code = int(exc.code or 0)
    assert code == 2
    assert msg in capsys.readouterr().err
