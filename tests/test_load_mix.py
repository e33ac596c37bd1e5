"""The stratified payload mix (latencylab.load.mix): every round of ``strata`` requests holds one payload of
each cost stratum, so a window's cost mix no longer depends on the draw."""

from __future__ import annotations

import numpy as np
import pytest

from latencylab.load.arrivals import Poisson
from latencylab.load.mix import Stratified, strata_of


def test_strata_rank_payloads_by_cost_into_equal_groups() -> None:
    costs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    assert strata_of(costs, 3) == [[1, 5], [3, 0], [4, 2]]
    assert strata_of(costs, 10) == [[1], [5], [3], [0], [4], [2]]  # no more groups than payloads
    with pytest.raises(ValueError):
        strata_of(costs, 0)
    with pytest.raises(ValueError):
        strata_of([], 3)


def test_every_round_holds_one_payload_of_each_stratum_at_the_base_process_times() -> None:
    rng = np.random.default_rng(3)
    costs = list(rng.gamma(1.0, 200.0, 600))  # a long tail, like the text corpus
    mix = Stratified.of(Poisson(40.0, 5), costs, strata=20, seed=9)
    got = list(mix.arrivals(duration_s=60.0))
    base = list(Poisson(40.0, 5).arrivals(duration_s=60.0))
    assert [a.t_s for a in got] == [a.t_s for a in base]
    group = {i: g for g, members in enumerate(mix.groups) for i in members}
    rounds = [[group[a.payload] for a in got[k : k + 20]] for k in range(0, len(got) - 19, 20)]
    assert len(rounds) > 100 and all(sorted(r) == list(range(20)) for r in rounds)
    # the 5% costliest payloads: exactly 1 in 20 of any 400 consecutive requests, where a uniform draw scatters
    top = set(mix.groups[-1])
    counts = [sum(a.payload in top for a in got[k : k + 400]) for k in range(0, len(got) - 400, 400)]
    assert all(19 <= c <= 21 for c in counts), counts
    drawn = np.random.default_rng(1).integers(0, 600, size=(50, 400))
    spread = np.isin(drawn, list(top)).sum(axis=1)
    assert spread.max() - spread.min() >= 8  # what the stratified mix removes
    # seeded: the same seed repeats the sequence, another seed draws other members and orders
    again = [a.payload for a in Stratified.of(Poisson(40.0, 5), costs, 20, seed=9).arrivals(duration_s=60.0)]
    other = [a.payload for a in Stratified.of(Poisson(40.0, 5), costs, 20, seed=10).arrivals(duration_s=60.0)]
    assert again == [a.payload for a in got] and other != again
    assert mix.describe()["payload_mix"] == "stratified" and mix.mean_rate() == 40.0
