"""The /metrics text (Metrics.exposition) is what prometheus_client would write for the same data."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shaperd.report.collectors import TenantCollector
from shaperd.report.exposition import Families
from shaperd.report.metrics import Metrics
from shaperd.report.sampler import Sampler, Snapshot, Target, TenantSeries

DURATION = "shaperd_scrape_collector_duration_seconds"
WALL = 1_700_000_000.0


@dataclass(frozen=True)
class C:
    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    qlen: int = 0
    rate_Bps: int = 125_000_000
    ceil_Bps: int = 6_250_000_000


def parsed(text: str) -> list[tuple]:
    """Families and samples as the Prometheus parser sees them; NaN made comparable."""
    out = []
    for fam in text_string_to_metric_families(text):
        samples = [(s.name, tuple(sorted(s.labels.items())), "NaN" if math.isnan(s.value) else s.value)
                   for s in fam.samples]
        out.append((fam.name, fam.type, fam.documentation, samples))
    return out


def reference(snap: Snapshot) -> str:
    """prometheus_client's rendering of the tenants collector's families for ``snap``."""
    families = []
    try:
        for f in TenantCollector(object()).collect_from(snap):
            families.append(f)
    except Exception:  # noqa: BLE001 - _Unhealthy after the families
        pass
    return generate_latest(Families(families)).decode()


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12) | st.sampled_from(
    ['a"b', "back\\slash", "new\nline", 'all\\"\n', "ünï", "t000"])
numbers = st.integers(0, 2**64) | st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def snapshots(draw):
    series = []
    for i in range(draw(st.integers(0, 6))):
        # a capped pod's own class too (shaperd_pod_transmit_*): "namespace/name"
        tgt = Target(draw(names), draw(names), i, pod=draw(st.sampled_from(["", "team-a/trainer-0", 'n"s/p\\o\nd'])))
        s = TenantSeries(tgt, draw(numbers), draw(numbers), bytes=draw(numbers), packets=draw(numbers),
                         drops=draw(numbers), overlimits=draw(numbers), backlog_bytes=draw(numbers),
                         borrowed_bytes=draw(numbers), below_guarantee_s=draw(numbers),
                         rate_bps=draw(st.none() | numbers))
        series.append(s)
    taken = draw(st.none() | st.floats(0, 2e9))
    return Snapshot(tuple(series), taken, draw(st.booleans()), None, draw(st.floats(0, 10)),
                    draw(st.integers(0, 10**12)), draw(st.integers(0, 10**6)))


@settings(max_examples=300, deadline=None)
@given(snap=snapshots())
def test_tenant_text_is_what_generate_latest_writes(snap):
    text = TenantCollector.render_snapshot(snap)
    assert text == reference(snap)
    assert parsed(text) == parsed(reference(snap))


def _daemon(n_tenants: int = 3, fail_at: int | None = None):
    keys = [(f"eth{d}", 0x10 + t) for d in range(2) for t in range(n_tenants)]
    calls = {"n": 0}

    def read():
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError("dump classes on eth0: No buffer space available")
        return {k: C(bytes=calls["n"] * 12_345_678 + i, packets=calls["n"] * 10 + i, qlen=i % 2)
                for i, k in enumerate(keys)}

    t = iter(range(100))  # one second per sample; a fixed wall clock: nothing depends on how fast the test runs
    s = Sampler(read, clock=lambda: float(next(t)), wall=lambda: WALL)
    s.set_targets({k: Target(f't{k[1]}"x', k[0], k[1], 10**9, None) for k in keys})
    m = Metrics(s, CollectorRegistry(), wall=lambda: WALL + 1.0, monotonic=lambda: 100.0)
    m.config_loaded(True)
    m.reconciled(0.02, {"plan"}, ok=True, drift=False, endpoints={"t16": {"cidr": 1, "interface": 0}})
    return s, m


def _without_durations(fams: list[tuple]) -> list[tuple]:
    """Names, types, help and labels of everything; values except those that change between two renderings
    (collector durations, and the process collector's CPU time, memory and open fds)."""
    return [(n, t, d, [x[:2] for x in samples] if n == DURATION or n.startswith("process_") else samples)
            for n, t, d, samples in fams]


def test_scrape_body_equals_the_registry_rendering_in_every_state():
    s, m = _daemon(fail_at=4)
    for _ in range(5):  # before any sample, first sample, rates known, a failed sample, recovered
        body = m.exposition().decode()
        ref = generate_latest(m.registry).decode()
        assert _without_durations(parsed(body)) == _without_durations(parsed(ref))
        s.sample_once()


def _samples(m) -> dict[tuple, float]:
    return {(n, labels): v for *_, samples in parsed(m.exposition().decode()) for n, labels, v in samples}


def _names(got: dict) -> set[str]:
    return {n for n, _ in got}


def test_missing_data_is_a_missing_series_and_failures_do_not_fail_the_scrape():
    s, m = _daemon()
    ok = {c: ("shaperd_scrape_collector_success", (("collector", c),)) for c in ("tenants", "agent")}
    got = _samples(m)
    assert not {"shaperd_tenant_transmit_bytes_total", "shaperd_sampler_last_success_timestamp_seconds"} & _names(got)
    assert got[ok["tenants"]] == 0 and got[ok["agent"]] == 1
    s.sample_once()
    got = _samples(m)
    assert "shaperd_tenant_transmit_rate_bytes_per_second" not in _names(got)  # one sample: no rate yet
    assert sum(1 for n, _ in got if n == "shaperd_tenant_transmit_bytes_total") == 6
    assert got[ok["tenants"]] == 1

    def broken():
        raise RuntimeError("boom")

    m.collectors.collectors["tenants"].render = broken
    got = _samples(m)
    assert "shaperd_tenant_transmit_bytes_total" not in _names(got) and "shaperd_reconciles_total" in _names(got)
    assert got[ok["tenants"]] == 0 and got[ok["agent"]] == 1


def test_tenant_text_is_rendered_once_per_snapshot():
    s, m = _daemon()
    s.sample_once()
    tc = m.collectors.collectors["tenants"]
    first, _ = tc.render()
    assert tc.render()[0] is first  # same snapshot: the same text, not rendered again
    s.sample_once()
    second, _ = tc.render()
    assert second is not first and second == TenantCollector.render_snapshot(s.snapshot)


@settings(deadline=None)  # a property, not a timing
@given(v=st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
       | st.sampled_from([0, 1, 999_999, 1_000_000, 1_000_001, 10**9, 2**53 - 1, 2**53, 2**53 + 1, 10**16, True]))
def test_value_format_is_floattogostring(v):
    from prometheus_client.utils import floatToGoString

    from shaperd.report.exposition import format_value

    assert format_value(v) == floatToGoString(v)
