"""The accounting behind the metrics and `shaperd top` (no root, no kernel)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import generate_latest

from shaperd.report.metrics import Metrics
from shaperd.report.sampler import BELOW_MARGIN, Accumulator, Sampler, Target, accrue
from shaperd.report.top import bar

G = 100_000_000  # 100 Mbit/s guarantee = 12.5 MB/s
WALL = 1_700_000_000.0  # a fixed wall clock: staleness and timestamps do not depend on how slow the test runs


@dataclass(frozen=True)
class C:
    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    qlen: int = 0
    rate_Bps: int = G // 8
    ceil_Bps: int = 4 * G // 8


def test_borrowed_is_what_was_sent_above_the_guarantee_in_the_interval():
    a = accrue(C(bytes=0), C(bytes=20_000_000), 1.0, G)  # 160 Mbit/s for 1 s
    assert a.borrowed_bytes == pytest.approx(7_500_000)
    assert a.below_guarantee_s == 0


def test_no_borrowing_at_or_below_the_guarantee():
    assert accrue(C(), C(bytes=12_500_000), 1.0, G).borrowed_bytes == 0
    assert accrue(C(), C(bytes=1_000), 1.0, G).borrowed_bytes == 0


def test_below_guarantee_needs_a_backlog_that_persists():
    starved = accrue(C(qlen=5, backlog_bytes=9000), C(bytes=1_000_000, qlen=7), 0.5, G)
    assert starved.below_guarantee_s == 0.5
    # Sending little with nothing queued is no demand: not starved.
    assert accrue(C(), C(bytes=1_000_000), 0.5, G).below_guarantee_s == 0
    # One packet caught in the queue at one end only is not a backlog.
    assert accrue(C(qlen=0), C(bytes=1_000_000, qlen=1), 0.5, G).below_guarantee_s == 0
    assert accrue(C(qlen=1), C(bytes=1_000_000, qlen=0), 0.5, G).below_guarantee_s == 0


def test_a_burst_at_the_ceiling_then_silence_is_not_starvation():
    # Throttled (overlimits rose) during a burst, idle after it: below the guarantee on average, no demand left.
    a = accrue(C(overlimits=10), C(bytes=1_000_000, overlimits=40), 0.5, G)
    assert a.below_guarantee_s == 0


def test_backlogged_at_or_above_the_guarantee_is_not_below_it():
    # Pressing on a limit above the guarantee: queue and overlimits, but the guarantee is met.
    assert accrue(C(qlen=9, overlimits=1), C(bytes=25_000_000, qlen=9, overlimits=50), 1.0, G).below_guarantee_s == 0
    # Exactly at a ceiling equal to the guarantee, within the jitter margin.
    just_under = int(12_500_000 * (1 - BELOW_MARGIN / 2))
    assert accrue(C(qlen=9), C(bytes=just_under, qlen=9), 1.0, G).below_guarantee_s == 0


def test_counter_reset_and_stalls_are_skipped():
    assert not accrue(C(bytes=5_000), C(bytes=10, qlen=3), 0.5, G).counted
    assert not accrue(C(qlen=3), C(bytes=10, qlen=3), 60.0, G).counted
    assert not accrue(C(), C(), 0.0, G).counted


@settings(deadline=None)  # a property, not a timing: a busy machine must not fail it
@given(
    chunks=st.lists(st.tuples(st.integers(0, 50_000_000), st.floats(0.05, 2.0), st.booleans()), min_size=1, max_size=40)
)
def test_integrals_are_bounded_by_what_happened(chunks):
    """Borrowed <= total sent; below-guarantee time <= elapsed time; both never decrease."""
    acc = Accumulator()
    key = ("eth0", 0x73680010)
    tgt = {key: Target("a", "eth0", key[1], G, 4 * G)}
    t, b = 0.0, 0
    acc.ingest(t, {key: C()}, tgt)
    last = (0.0, 0.0)
    for sent, dt, queued in chunks:
        t += dt
        b += sent
        acc.ingest(t, {key: C(bytes=b, qlen=int(queued))}, tgt)
        s = acc.series[key]
        assert s.borrowed_bytes <= b + 1e-6
        assert s.below_guarantee_s <= t + 1e-9
        assert s.borrowed_bytes >= last[0] and s.below_guarantee_s >= last[1]
        last = (s.borrowed_bytes, s.below_guarantee_s)


def test_rate_is_over_the_window_and_series_follow_the_targets():
    acc = Accumulator(rate_window_s=2.0)
    key = ("eth0", 0x73680010)
    tgt = {key: Target("a", "eth0", key[1], G, 4 * G)}
    for i in range(9):  # 0.5 s apart, 1 MB per interval = 16 Mbit/s
        acc.ingest(i * 0.5, {key: C(bytes=i * 1_000_000)}, tgt)
    assert acc.series[key].rate_bps == pytest.approx(16_000_000)
    assert acc.series[key].guarantee_bps == G and acc.series[key].limit_bps == 4 * G
    acc.ingest(5.0, {key: C(bytes=9_000_000)}, {})  # tenant removed from the config
    assert acc.view() == ()


def test_kernel_rates_are_used_when_the_target_has_none():
    acc = Accumulator()
    key = ("eth0", 0x73680010)
    acc.ingest(0.0, {key: C()}, {key: Target("a", "eth0", key[1])})
    s = acc.view()[0]
    assert (s.guarantee_bps, s.limit_bps) == (G, 4 * G)


def _scrape(reg) -> dict:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exposition_leaves_unknown_series_out_and_still_succeeds():
    clock = iter(range(100))
    calls = {"n": 0}

    def read():
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("dump classes on eth0: No buffer space available")
        return {("eth0", 0x73680010): C(bytes=calls["n"] * 1000, qlen=0)}

    s = Sampler(read, clock=lambda: float(next(clock)), wall=lambda: WALL)
    m = Metrics(s, CollectorRegistry(), wall=lambda: WALL + 1.0)
    before = _scrape(m.registry)
    assert ("shaperd_scrape_collector_success", (("collector", "tenants"),)) in before
    assert before[("shaperd_scrape_collector_success", (("collector", "tenants"),))] == 0  # nothing sampled yet
    assert not any(k[0].startswith("shaperd_tenant_transmit") for k in before)
    assert not any(k[0] == "shaperd_last_reconcile_success_timestamp_seconds" for k in before)

    s.set_targets({("eth0", 0x73680010): Target("a", "eth0", 0x73680010, G, 4 * G)})
    s.sample_once()
    s.sample_once()
    got = _scrape(m.registry)
    lab = (("device", "eth0"), ("path", "tc"), ("tenant", "a"))
    assert got[("shaperd_tenant_transmit_bytes_total", lab)] == 2000
    assert got[("shaperd_tenant_guarantee_bytes_per_second", lab)] == G / 8
    assert got[("shaperd_scrape_collector_success", (("collector", "tenants"),))] == 1
    s.sample_once()  # fails: old values are kept, the collector says it failed, the scrape works
    got = _scrape(m.registry)
    assert got[("shaperd_tenant_transmit_bytes_total", lab)] == 2000
    assert got[("shaperd_scrape_collector_success", (("collector", "tenants"),))] == 0
    assert got[("shaperd_sampler_samples_total", (("result", "failure"),))] == 1


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_readiness_and_drift_bookkeeping():
    wall = Clock(WALL)
    m = Metrics(None, CollectorRegistry(), wall=wall, monotonic=Clock())
    assert m.ready() == (False, "no tenants file loaded yet") and m.healthy()[0] is True
    m.config_loaded(True)
    assert m.ready() == (False, "no reconcile yet")
    m.reconciled(0.01, set(), ok=True, drift=False)
    assert m.ready() == (True, "ok")
    wall.t += 60
    m.reconciled(0.01, {"kernel_write"}, ok=False, drift=True)
    assert m.ready() == (False, "the last reconcile failed")
    got = _scrape(m.registry)
    assert got[("shaperd_reconciles_total", ())] == 2
    assert got[("shaperd_drift_repairs_total", ())] == 1
    assert got[("shaperd_reconcile_errors_total", (("kind", "kernel_write"),))] == 1
    assert got[("shaperd_reconcile_duration_seconds_count", ())] == 2
    assert got[("shaperd_last_reconcile_success_timestamp_seconds", ())] == WALL  # the failed one did not move it


def test_liveness_is_the_age_of_the_last_loop_tick():
    mono = Clock()
    m = Metrics(None, CollectorRegistry(), monotonic=mono)
    mono.t += 10.0
    assert m.healthy() == (True, "loop last ticked 10.0s ago")
    mono.t += 0.5
    assert m.healthy() == (False, "loop last ticked 10.5s ago")
    m.tick()
    assert m.healthy()[0] is True


def test_a_pod_watch_out_of_sync_turns_unready_only_after_the_grace():
    from shaperd.report.health import K8S_UNSYNCED_GRACE_S

    mono = Clock()
    m = Metrics(None, CollectorRegistry(), monotonic=mono)
    m.config_loaded(True)
    m.reconciled(0.01, set(), ok=True, drift=False)
    m.kubernetes(True, None, {"a": 2})
    m.kubernetes(False, "watch pods: connection refused")
    for _ in range(3):  # the loop reports every tick; the spell started at the first report
        mono.t += K8S_UNSYNCED_GRACE_S / 3
        m.kubernetes(False, "watch pods: connection refused")
    assert m.ready() == (True, "ok")  # exactly at the grace: still ready
    mono.t += 0.1
    assert m.ready() == (False, "pod watch not in sync with the API server: watch pods: connection refused")
    got = _scrape(m.registry)
    assert got[("shaperd_kubernetes_synced", ())] == 0
    assert got[("shaperd_tenant_pods", (("tenant", "a"),))] == 2  # the last known mapping is still reported
    m.kubernetes(True, None)
    assert m.ready() == (True, "ok")
    m.kubernetes(False, None)  # a new spell starts its own grace
    mono.t += K8S_UNSYNCED_GRACE_S
    assert m.ready() == (True, "ok")
    mono.t += 0.1
    assert m.ready() == (False, "pod watch not in sync with the API server: reconnecting")


def test_error_kinds_of_a_report_and_of_an_exception():
    from types import SimpleNamespace as NS

    from shaperd.discovery.kubernetes import TransientKubernetesError
    from shaperd.core.errors import ConfigProblem, KernelError
    from shaperd.report.metrics import exception_kind, report_error_kinds

    dev = lambda error=None, failed=(), blocked=None: NS(error=error, failed=failed, blocked=blocked)  # noqa: E731
    assert report_error_kinds(NS(problems=(), devices=(dev(), dev()))) == set()
    rep = NS(problems=(ConfigProblem("tenants[0]", "too big"),),
             devices=(dev(error="dump classes: ENODEV"), dev(failed=("add class",)), dev(blocked="mq")))
    assert report_error_kinds(rep) == {"plan", "device_read", "kernel_write", "foreign_qdisc"}
    assert exception_kind(KernelError("add", "class 1:10", "eth0", "EPERM")) == "netlink"
    assert exception_kind(TransientKubernetesError("list", "pods", "HTTP 503")) == "discovery"
    assert exception_kind(ValueError("x")) == "internal"


def test_bar_marks_guarantee_and_borrowing():
    assert bar(None, 25, 100, width=8) == "[..|.....]"
    assert bar(50, 25, 100, width=8) == "[##++....]"
    assert bar(10, 50, 100, width=10) == "[#....|....]"
    assert bar(100, 100, 100, width=4) == "[####]"


def _driven(targets: dict, counters: dict):
    """A Sampler on an injected clock, reading whatever ``counters`` holds now."""
    now = [0.0]
    s = Sampler(lambda: dict(counters), clock=lambda: now[0], wall=lambda: WALL + now[0])
    s.set_targets(targets)
    return s, now


def test_pressing_on_the_limit_borrows_what_is_above_the_guarantee():
    """The math of the integration test, exactly: 4 s at a 100 Mbit/s limit with a 50 Mbit/s
    guarantee, queue full, HTB throttling: 25 MB borrowed, no time below the guarantee."""
    key = ("up0", 0x73680030)
    counters = {key: C(rate_Bps=50_000_000 // 8, ceil_Bps=100_000_000 // 8)}
    s, now = _driven({key: Target("capped", "up0", key[1], 50_000_000, 100_000_000)}, counters)
    s.sample_once()
    for i in range(1, 9):  # 0.5 s apart, 100 Mbit/s = 6.25 MB per interval
        now[0] += 0.5
        counters[key] = replace(counters[key], bytes=i * 6_250_000, qlen=40, overlimits=i * 100, drops=i * 3)
        s.sample_once()
    (series,) = s.snapshot.series
    assert series.borrowed_bytes == pytest.approx(25_000_000)
    assert series.below_guarantee_s == 0
    assert series.rate_bps == pytest.approx(100_000_000)
    assert series.drops == 24 and series.overlimits == 800


def test_a_starved_tenant_counts_every_interval_its_queue_stayed_full():
    """Backlogged for 5 s while the device drains at 100 Mbit/s, a quarter of the 400 Mbit/s
    guarantee: 4.5 s below it (the first interval started with an empty queue, so it is not
    demand). An idle tenant on the same device counts nothing."""
    busy, idle = ("up0", 0x73680010), ("up0", 0x73680020)
    counters = {busy: C(), idle: C()}
    s, now = _driven({busy: Target("alpha", "up0", busy[1], 400_000_000, None),
                      idle: Target("beta", "up0", idle[1], 100_000_000, None)}, counters)
    s.sample_once()
    for i in range(1, 11):
        now[0] += 0.5
        counters[busy] = C(bytes=i * 6_250_000, qlen=200, backlog_bytes=280_000)
        s.sample_once()
    got = {x.target.tenant: x for x in s.snapshot.series}
    assert got["alpha"].below_guarantee_s == pytest.approx(4.5)
    assert got["alpha"].borrowed_bytes == 0
    assert got["alpha"].rate_bps == pytest.approx(100_000_000)
    assert got["beta"].below_guarantee_s == 0 and got["beta"].bytes == 0
    assert s.snapshot.taken_at == WALL + 5.0
