"""The edt rate controller as a pure function: properties over random tenants and demands (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shaperd.backends.edt.controller import Share, State, allocate, estimate_demand, rates, step

G = 1_000_000_000


@st.composite
def scenario(draw):
    capacity = draw(st.integers(min_value=1_000_000, max_value=400 * G))
    n = draw(st.integers(min_value=1, max_value=12))
    # Guarantees sum to at most 99 % of capacity (config validation keeps the reserve).
    parts = draw(st.lists(st.integers(min_value=0, max_value=1000), min_size=n, max_size=n))
    budget = capacity * 99 // 100
    scale = max(sum(parts), 1000)
    shares = []
    for i, p in enumerate(parts):
        g = budget * p // scale
        limit = draw(st.integers(min_value=max(g, 1), max_value=capacity))
        prio = draw(st.sampled_from([0, 10, 50, 100]))
        shares.append(Share(key=0x73680010 + i, guarantee_bps=g, limit_bps=limit, priority=prio))
    demand = {s.key: draw(st.integers(min_value=0, max_value=2 * capacity)) for s in shares}
    return capacity, shares, demand


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_never_above_a_limit_nor_capacity(sc):
    capacity, shares, demand = sc
    alloc = allocate(capacity, shares, demand)
    assert all(alloc[s.key] <= s.limit_bps for s in shares)
    assert sum(alloc.values()) <= capacity
    written = rates(shares, alloc)
    assert all(written[s.key] <= s.limit_bps for s in shares)


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_guarantees_met_whenever_demanded(sc):
    capacity, shares, demand = sc
    alloc = allocate(capacity, shares, demand)
    for s in shares:
        assert alloc[s.key] >= min(demand[s.key], s.guarantee_bps)
    # ... and the headroom: the written rate lets an idle tenant reach its guarantee at once.
    written = rates(shares, allocate(capacity, shares, {s.key: 0 for s in shares}))
    assert all(written[s.key] >= min(s.guarantee_bps, s.limit_bps) for s in shares)


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_work_conserving(sc):
    capacity, shares, demand = sc
    alloc = allocate(capacity, shares, demand)
    wanted = sum(min(demand[s.key], s.limit_bps) for s in shares)
    assert sum(alloc.values()) == min(capacity, wanted)
    assert all(alloc[s.key] <= demand[s.key] for s in shares)


@settings(max_examples=200, deadline=None)
@given(scenario(), st.randoms())
def test_deterministic_in_any_order(sc, rnd):
    capacity, shares, demand = sc
    shuffled = list(shares)
    rnd.shuffle(shuffled)
    assert allocate(capacity, shares, demand) == allocate(capacity, shuffled, dict(reversed(demand.items())))


@settings(max_examples=300, deadline=None)
@given(scenario())
def test_a_lower_level_borrows_only_what_higher_levels_leave(sc):
    capacity, shares, demand = sc
    alloc = allocate(capacity, shares, demand)
    for hi in shares:
        unmet = alloc[hi.key] < min(demand[hi.key], hi.limit_bps)
        if not unmet:
            continue
        for lo in shares:
            if lo.priority < hi.priority:
                assert alloc[lo.key] <= min(demand[lo.key], lo.guarantee_bps)


def test_spare_within_a_level_goes_in_proportion_to_guarantees():
    shares = [Share(1, 4 * G, 100 * G, 5), Share(2, 2 * G, 100 * G, 5)]
    alloc = allocate(100 * G, shares, {1: 100 * G, 2: 100 * G})
    assert sum(alloc.values()) == 100 * G
    assert abs(alloc[1] - (4 * G + 94 * G * 2 // 3)) <= 1 and abs(alloc[2] - (2 * G + 94 * G // 3)) <= 1


def test_higher_priority_borrows_first():
    shares = [Share(1, 10 * G, 100 * G, 100), Share(2, 10 * G, 100 * G, 50)]
    assert allocate(100 * G, shares, {1: 100 * G, 2: 100 * G}) == {1: 90 * G, 2: 10 * G}


def test_demand_of_a_saturated_tenant_grows_and_an_unsaturated_one_is_its_own():
    assert estimate_demand(9 * G, 10 * G, 100 * G, 100 * G) == 18 * G
    assert estimate_demand(1 * G, 10 * G, 100 * G, 100 * G) == 1 * G + G // 10
    assert estimate_demand(60 * G, 60 * G, 80 * G, 100 * G) == 80 * G


@pytest.mark.parametrize("backlog, bound", [(True, 7), (False, 12)])
def test_step_converges_to_capacity_within_the_documented_bound(backlog, bound):
    """One tenant alone (1 % guarantee) reaches the spare capacity in <= 7 steps with the backlog signal
    (<= 12 from counters alone); the idle tenant's guarantee stays open meanwhile."""
    cap = 10 * G
    shares = [Share(1, cap // 100, cap, 10), Share(2, cap // 2, cap, 10)]
    s = step(cap, shares, State(), 0.0, {1: 0, 2: 0})
    sent = {1: 0, 2: 0}
    t = 0.0
    for n in range(1, 2 * bound):
        t += 0.02
        # tenant 1 sends as fast as its rate allows, tenant 2 is idle
        sent[1] += s.rates_bps[1] * 0.02 / 8
        s = step(cap, shares, s, t, dict(sent), frozenset({1}) if backlog else frozenset())
        if s.rates_bps[1] >= cap - cap // 2 - 1:  # all but the idle tenant's headroom
            break
    assert n <= bound, (n, s.rates_bps)
    assert s.rates_bps[2] >= cap // 2  # the idle tenant's guarantee is held open
