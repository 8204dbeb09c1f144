"""The edt rate controller, pure: per-tenant byte counters in, per-tenant departure rates out.

One step (every ``interval_s``, 10-50 ms; shaperd/backends/edt/loop.py runs it):

1. measured rate per tenant = bytes counted by the stamper over the last
   ``WINDOW_S`` (100 ms, several steps) / elapsed time (the clock is the caller's);
2. demand: a tenant that is backlogged (its stamper clock is ahead of now:
   packets wait for their departure time) or sends at >= ``SATURATED`` of its
   rate is pressing against it, so its demand is estimated at twice that
   (plus 1/32 of capacity, so a small tenant ramps fast), capped at its
   limit; a tenant below that sends what it wants: demand = measured + 10 %;
3. ``allocate``: each tenant first gets min(demand, guarantee); the spare
   capacity goes to priority levels in order (largest priority value first),
   within a level in proportion to guarantees (water-filling: a tenant whose
   demand or limit is reached drops out and its share goes to the others),
   never above a tenant's limit;
4. ``rates``: the rate written for each tenant is max(allocation, guarantee)
   (capped at its limit): headroom, so an idle tenant that wakes up sends at
   its guarantee at once, before the next step has seen it;
5. the caller writes the rates into the stamper's map.

Convergence: a backlogged tenant's estimate doubles per step from the rate
it has, so it goes from its guarantee g to a spare capacity S in at most
ceil(log2(S / g)) steps, and in at most 32 steps whatever g (the additive
1/32 of capacity); with 20 ms steps and g >= 1 % of capacity that is at most
7 steps, 140 ms. From the byte counters alone (no backlog signal) the
100 ms window lags the rate: 11 steps (220 ms) for g = 1 % (the unit test). A tenant that stops is seen at the next step: its
allocation falls to its measured rate + 10 % and the others take the rest one
step later. The allocation is a pure function of (capacity, shares, demands):
same inputs, same rates, in any order of tenants.

Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

SATURATED = 0.9
GROWTH = 2
GROWTH_CAPACITY_DIVISOR = 32
UNSATURATED_MARGIN = 10  # percent above measured


@dataclass(frozen=True)
class Share:
    """What one tenant is promised on one device. ``key``: its stamper map key (the class id)."""

    key: int
    guarantee_bps: int
    limit_bps: int
    priority: int = 0


def ns_per_byte_q16(rate_bps: int) -> int:
    """The stamper's rate unit: nanoseconds per byte in 16.16 fixed point (8e9 / rate, times 65536), at least 1."""
    return max(1, (8 * 1_000_000_000 << 16) // max(rate_bps, 1))


def rate_bps_of_q16(ns_per_byte_q16: int) -> int:
    """The inverse of ``ns_per_byte_q16`` (what a rate in the stamper's map means in bit/s; 0 = no rate set).

    Exact to within one Q16 step: ``ns_per_byte_q16`` rounds down, so a rate reads back slightly above
    what was written (300 Mbit/s as 300.000114 Mbit/s, 40 Gbit/s as 40.0006 Gbit/s; 1 Gbit/s exactly)."""
    return 0 if ns_per_byte_q16 <= 0 else (8 * 1_000_000_000 << 16) // ns_per_byte_q16


def _want(s: Share, demand: int, capacity_bps: int) -> int:
    return max(0, min(demand, s.limit_bps, capacity_bps))


def allocate(capacity_bps: int, shares: list[Share] | tuple[Share, ...], demand_bps: Mapping[int, int]) -> dict[int, int]:
    """key -> allocated bit/s: guarantees first, then spare by priority level, by guarantee within a level.

    Never above a limit or a demand; the sum never above capacity; if any
    tenant wants more than it got, the whole capacity is handed out.
    """
    ordered = sorted(shares, key=lambda s: s.key)
    want = {s.key: _want(s, demand_bps.get(s.key, 0), capacity_bps) for s in ordered}
    alloc = {s.key: min(want[s.key], s.guarantee_bps) for s in ordered}
    spare = capacity_bps - sum(alloc.values())
    if spare <= 0:
        # Guarantees over capacity (config validation prevents it): scale the base down, in key order.
        return _scale_down(ordered, alloc, capacity_bps)
    for level in sorted({s.priority for s in ordered}, reverse=True):
        members = [s for s in ordered if s.priority == level and want[s.key] > alloc[s.key]]
        spare = _water_fill(members, want, alloc, spare)
        if spare <= 0:
            break
    return alloc


def _water_fill(members: list[Share], want: dict[int, int], alloc: dict[int, int], spare: int) -> int:
    """Hand ``spare`` to ``members`` in proportion to guarantees, up to what each wants; returns what is left."""
    while spare > 0 and members:
        weights = {s.key: max(s.guarantee_bps, 1) for s in members}
        total = sum(weights.values())
        given = 0
        still = []
        for s in members:
            room = want[s.key] - alloc[s.key]
            part = min(room, spare * weights[s.key] // total)
            alloc[s.key] += part
            given += part
            if alloc[s.key] < want[s.key]:
                still.append(s)
        spare -= given
        if len(still) == len(members):
            # Nobody reached its want: every proportional part was handed out; only rounding is left.
            for s in still:
                if spare <= 0:
                    break
                if alloc[s.key] < want[s.key]:
                    alloc[s.key] += 1
                    spare -= 1
            return spare
        members = still
    return spare


def _scale_down(ordered: list[Share], alloc: dict[int, int], capacity_bps: int) -> dict[int, int]:
    total = sum(alloc.values())
    if total <= capacity_bps or total == 0:
        return alloc
    return {k: v * capacity_bps // total for k, v in alloc.items()}


def rates(shares: list[Share] | tuple[Share, ...], alloc: Mapping[int, int]) -> dict[int, int]:
    """key -> the departure rate to write: the allocation, raised to the guarantee (headroom), within the limit."""
    return {s.key: max(1, min(s.limit_bps, max(alloc.get(s.key, 0), s.guarantee_bps))) for s in shares}


def estimate_demand(measured_bps: int, rate_bps: int, limit_bps: int, capacity_bps: int,
                    backlogged: bool = False, current_bps: int | None = None) -> int:
    """What a tenant would send if it could: see the module docstring, step 2.

    ``backlogged``: the tenant's clock in the stamper is ahead of now, i.e. it has packets waiting for their
    departure time: it is held back by its rate whatever the (quantised) byte count of one window says, so
    it grows from the rate it has now (``current_bps``), not from the lagging measurement.
    """
    if backlogged or (rate_bps > 0 and measured_bps >= SATURATED * rate_bps):
        base = max(measured_bps, current_bps if current_bps is not None else rate_bps) if backlogged else measured_bps
        return min(limit_bps, max(GROWTH * base, base + capacity_bps // GROWTH_CAPACITY_DIVISOR))
    return min(limit_bps, measured_bps + measured_bps * UNSATURATED_MARGIN // 100)


# The measured rate is over the last WINDOW_S at least (several steps): at low rates a 20 ms step sees
# zero or one large packet, which would make the demand estimate flap.
WINDOW_S = 0.1
HISTORY = 16


@dataclass(frozen=True)
class State:
    """What one step leaves for the next: recent (time, byte totals) samples and the rates written."""

    at_s: float | None = None
    bytes_total: Mapping[int, int] = field(default_factory=dict)
    rates_bps: Mapping[int, int] = field(default_factory=dict)
    measured_bps: Mapping[int, int] = field(default_factory=dict)
    # (time, byte totals, rates written then), newest last: the measurement window.
    history: tuple[tuple[float, Mapping[int, int], Mapping[int, int]], ...] = ()


def _window(state: State, now_s: float):
    """(the history, its samples from the measurement's base on): the base is the newest sample at least
    WINDOW_S old, else the oldest kept."""
    hist = state.history or ((state.at_s, state.bytes_total, state.rates_bps),)
    start = 0
    for i in range(len(hist) - 1, -1, -1):
        if now_s - hist[i][0] >= WINDOW_S:
            start = i
            break
    return hist, hist[start:]


def measured_bps(state: State, now_s: float, bytes_total: Mapping[int, int], keys) -> dict[int, int]:
    """key -> bit/s over the measurement window ending at ``now_s`` (the one ``step`` uses), for any key whose
    byte total is counted: the tenants', and the capped pods' (which are measured, never controlled). A
    counter that went backwards (program replaced) counts from here; no earlier sample: empty."""
    if state.at_s is None or now_s <= state.at_s:
        return {}
    _hist, window = _window(state, now_s)
    base_t, base = window[0][0], window[0][1]
    dt = now_s - base_t
    return {k: int(max(0, bytes_total.get(k, 0) - base.get(k, 0)) * 8 / dt) for k in keys}


def step(capacity_bps: int, shares: list[Share] | tuple[Share, ...], state: State, now_s: float,
         bytes_total: Mapping[int, int], backlogged: frozenset[int] | set[int] = frozenset()) -> State:
    """One controller step: byte totals (monotonic per key) at ``now_s`` -> the new rates (in the returned state).

    The first step (no previous sample) assumes every tenant wants everything: guarantees, then the spare by
    priority. ``backlogged``: keys whose stamper clock is ahead of now (packets waiting).
    """
    if state.at_s is None or now_s <= state.at_s:
        demand = {s.key: s.limit_bps for s in shares}  # unknown: assume everyone wants everything
        alloc = allocate(capacity_bps, shares, demand)
        first = rates(shares, alloc)
        return State(now_s, dict(bytes_total), first, {}, ((now_s, dict(bytes_total), first),))
    hist, window = _window(state, now_s)
    measured = measured_bps(state, now_s, bytes_total, [s.key for s in shares])
    demand = {}
    for s in shares:
        # a tenant is compared with the smallest rate it had over that window (what it could send)
        had = min(h[2].get(s.key, s.guarantee_bps) for h in window)
        demand[s.key] = estimate_demand(measured[s.key], had, s.limit_bps, capacity_bps, s.key in backlogged,
                                        state.rates_bps.get(s.key, s.guarantee_bps))
    alloc = allocate(capacity_bps, shares, demand)
    new_rates = rates(shares, alloc)
    kept = tuple(h for h in hist if now_s - h[0] <= 2 * WINDOW_S)[-HISTORY:]
    return State(now_s, dict(bytes_total), new_rates, measured, kept + ((now_s, dict(bytes_total), new_rates),))
