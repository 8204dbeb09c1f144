"""The seven isolation scenarios (plus the hand-written-tc baseline).

Each scenario runs real traffic through a built :class:`~.topology.Bed` under
one *mode*:

* ``none``    - the uplink carries no shaping (kernel default),
* ``shaperd`` - the node is programmed through :func:`~.shaping.program_node`
                (shaperd's CLI; the hook can be replaced, e.g. in tests),
* ``hand-tc`` - the operator's manual HTB set-up (:func:`~.shaping.hand_tc_commands`).

Scenarios (tenant A: guarantee 40 %, limit 60 %, priority 100; tenant B:
20 %/40 %, priority 50; B uses 8x A's flows where both are TCP):

1. ``alone``     each tenant alone (run in ``none`` and in the shaped modes,
                 where it checks "a tenant alone reaches >= 97 % of its limit").
2. ``together``  A (2 flows) and B (16 flows) at once; ``none`` is row 2 of the
                 source table, the shaped modes are row 3.
4. ``pressure``  limits raised to the whole (configured) capacity; A floods with
                 16 flows, B (2 flows) must still get its guarantee.
5. ``udp``       A sends a UDP flood at 2x the link rate (limits raised as in 4);
                 B's TCP must still get its guarantee.
6. ``converge``  limits raised; A (16 flows) saturates alone, B (2 flows) joins;
                 seconds until B reaches its guarantee (0.1 s samples).
7. ``latency``   A (16 flows) saturates within its normal limit; B only sends a
                 light ping; RTT percentiles (plus an idle RTT reference).

Rates are judged the way tc accounts them (L2 "wire" rate, see
:mod:`.parse`); goodput is reported beside it.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from . import cpustat, shaping
from .parse import (IperfResult, RttStats, convergence_time, first_reach, max_window_rate, mean_rate)
from .traffic import FloodResult, RttProbe, TcpLoad, UdpFlood, measure

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Bed

log = logging.getLogger(__name__)

MODES = ("none", "shaperd", "hand-tc")
SCENARIOS = ("alone", "together", "pressure", "udp", "converge", "latency")
SHAPED_MODES = ("shaperd", "hand-tc")


@dataclass
class Settings:
    """Knobs for one run of the scenarios (demo defaults: short)."""

    duration: float = 3.0          # seconds of traffic per measurement
    interval: float = 0.1          # iperf3 reporting interval (s)
    flows_a: int = 2               # scenarios 1-3
    flows_b: int = 16              # 8x A's
    flood_flows: int = 16          # the flooding/saturating tenant in 4, 6, 7
    victim_flows: int = 2          # the other tenant in 4, 5, 6
    udp_factor: float = 2.0        # scenario 5 offered UDP load, x link rate
    converge_lead: float = 2.0     # scenario 6: seconds A runs alone first
    converge_after: float = 3.0    # scenario 6: seconds B runs
    probe_every: float = 0.02      # scenario 7 ping interval (s)
    warmup: float = 0.5            # seconds left out of steady-state figures
    capacity_bps: float | None = None  # shaperd node.capacity (None: link rate)
    reserve_bps: float | None = 10e6   # shaperd node.reserve
    limit_window: float = 1.0      # window for "no tenant exceeds its limit"


@dataclass
class TenantFigure:
    """One tenant's measured outcome in one scenario."""

    tenant: str
    protocol: str
    streams: int
    goodput_bps: float              # receiver goodput (iperf3 end.sum_received / sink)
    wire_bps: float                 # same, as tc accounts it (L2)
    steady_wire_bps: float | None   # wire rate after warm-up
    max_window_wire_bps: float | None  # highest 1 s window (wire), after warm-up
    guarantee_bps: float | None
    limit_bps: float | None
    wants_guarantee: bool
    sent_bps: float | None = None
    retransmits: int | None = None
    samples: list = field(default_factory=list)
    sender_cpu_percent: float | None = None  # iperf3's own figure for the sending process (% of one CPU)

    def pct_of_guarantee(self, steady: bool = True) -> float | None:
        v = self.steady_wire_bps if steady and self.steady_wire_bps else self.wire_bps
        return 100.0 * v / self.guarantee_bps if self.guarantee_bps else None

    def pct_of_limit(self, steady: bool = True) -> float | None:
        v = self.steady_wire_bps if steady and self.steady_wire_bps else self.wire_bps
        return 100.0 * v / self.limit_bps if self.limit_bps else None

    def limit_excess_pct(self) -> float | None:
        if not self.limit_bps or self.max_window_wire_bps is None:
            return None
        return 100.0 * (self.max_window_wire_bps / self.limit_bps - 1.0)


@dataclass
class ScenarioResult:
    scenario: str
    mode: str
    title: str
    link_bps: float
    tenants: dict[str, TenantFigure]
    extra: dict[str, Any] = field(default_factory=dict)
    shaping: Any = None               # config dict or tc command lines
    elapsed_s: float = 0.0
    started_monotonic: float = 0.0    # CLOCK_MONOTONIC at its start: joins bench/class_sampler.py's samples
    error: str | None = None
    qdiscs: dict[str, Any] = field(default_factory=dict)  # uplink/wire counter deltas
    cpu: dict[str, Any] = field(default_factory=dict)  # cpustat.delta over the measurement(s): per CPU and "cpu"

    @property
    def key(self) -> str:
        return f"{self.scenario}/{self.mode}"

    @property
    def total_goodput_bps(self) -> float:
        return sum(t.goodput_bps for t in self.tenants.values())

    @property
    def total_wire_bps(self) -> float:
        return sum(t.wire_bps for t in self.tenants.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_goodput_bps"] = self.total_goodput_bps
        d["total_wire_bps"] = self.total_wire_bps
        for k, t in self.tenants.items():
            d["tenants"][k]["pct_of_guarantee"] = t.pct_of_guarantee()
            d["tenants"][k]["pct_of_limit"] = t.pct_of_limit()
            d["tenants"][k]["limit_excess_pct"] = t.limit_excess_pct()
        return d


# ---------------------------------------------------------------- shaping
@dataclass
class Shaper:
    """Applies a mode to the node; the shaperd hook is replaceable."""

    program_node: Callable[["Bed", dict], None] = shaping.program_node
    unprogram_node: Callable[["Bed"], None] = shaping.unprogram_node

    @contextlib.contextmanager
    def mode(self, bed: "Bed", mode: str, settings: Settings, raised: bool = False) -> Iterator[Any]:
        """Shape the node for the duration of the block; yields what was applied."""
        limits = None
        cap = settings.capacity_bps or bed.link_bps
        if raised:
            limits = {t.short: cap for t in bed.config.tenants}
        bed.clear_node_shaping()
        if mode == "none":
            yield None
            return
        if mode == "hand-tc":
            hand_limits = {t.short: bed.link_bps for t in bed.config.tenants} if raised else None
            cmds = shaping.hand_tc_commands(bed, hand_limits)
            shaping.program_hand_tc(bed, hand_limits)
            try:
                yield [" ".join(c[:1] + c[1:]) for c in cmds]
            finally:
                shaping.unprogram_hand_tc(bed)
            return
        if mode == "shaperd":
            cfg = shaping.shaperd_config(bed, capacity_bps=cap, reserve_bps=settings.reserve_bps,
                                         limits=limits)
            self.program_node(bed, cfg)
            try:
                yield cfg
            finally:
                self.unprogram_node(bed)
            return
        raise ValueError(f"unknown mode {mode!r}")


@dataclass
class Counters:
    """What a scenario's measurements leave beside the traffic figures.

    ``qdiscs``: the uplink and wire qdiscs' counter deltas, summed over its measurements;
    ``cpu``: :func:`.cpustat.delta` of its last measurement (the one with every tenant sending).
    """

    qdiscs: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)


def measure_counted(bed: "Bed", loads, name: str, q: Counters) -> dict:
    """measure() plus where the queue formed (uplink vs wire qdisc counters) and where the CPU went."""
    before = shaping.qdisc_counters(bed)
    c0 = cpustat.snapshot()
    r = measure(bed, loads, name=name)
    q.cpu = cpustat.delta(c0, cpustat.snapshot())
    after = shaping.qdisc_counters(bed)
    for dev, c in shaping.counters_delta(before, after).items():
        acc = q.qdiscs.setdefault(dev, {"kind": c["kind"], "bytes": 0, "packets": 0, "drops": 0, "overlimits": 0})
        for f in ("bytes", "packets", "drops", "overlimits"):
            acc[f] += c[f]
    return r


# ---------------------------------------------------------------- figures
def _figure(bed: "Bed", short: str, res: IperfResult | FloodResult, settings: Settings,
            limits: dict[str, float] | None, wants: bool, shaped: bool, offset: float = 0.0) -> TenantFigure:
    t = bed.tenant(short)
    g = t.guarantee * bed.link_bps if shaped else None
    lim = (limits or {}).get(short, t.limit * bed.link_bps) if shaped else None
    if isinstance(res, IperfResult):
        samples = res.samples
        factor = res.wire_bps(1.0)
        proto, streams, goodput = res.protocol, res.streams, res.received_bps
        sent, retr, cpu = res.sent_bps, res.retransmits, res.sender_cpu_percent
    else:
        cpu = None
        samples = res.samples
        factor = (1448 + 42) / 1448
        proto, streams, goodput, sent, retr = "UDP", 1, res.received_bps, res.sent_bps, None
    steady = mean_rate(samples, skip=settings.warmup + offset)
    mx = max_window_rate(samples, settings.limit_window, skip=settings.warmup)
    return TenantFigure(
        tenant=short, protocol=proto, streams=streams, goodput_bps=goodput, wire_bps=goodput * factor,
        steady_wire_bps=steady * factor if steady else None,
        max_window_wire_bps=mx * factor if mx else None,
        guarantee_bps=g, limit_bps=lim, wants_guarantee=wants, sent_bps=sent, retransmits=retr,
        samples=[[round(s.start, 3), round(s.end, 3), round(s.bps)] for s in samples], sender_cpu_percent=cpu,
    )


def _limits_for(bed: "Bed", settings: Settings, raised: bool) -> dict[str, float] | None:
    if not raised:
        return None
    cap = settings.capacity_bps or bed.link_bps
    return {t.short: cap for t in bed.config.tenants}


# --------------------------------------------------------------- scenarios
def run_alone(bed: "Bed", mode: str, s: Settings, shaper: Shaper) -> ScenarioResult:
    figs: dict[str, TenantFigure] = {}
    q = Counters()
    flows = {"a": s.flows_a, "b": s.flows_b}
    with shaper.mode(bed, mode, s) as applied:
        for t in bed.config.tenants:
            r = measure_counted(bed, [TcpLoad(t.short, flows.get(t.short, 4), s.duration, interval=s.interval)],
                         f"alone-{t.short}-{mode}", q)
            figs[t.short] = _figure(bed, t.short, r[t.short], s, None, False, mode != "none")
    return ScenarioResult("alone", mode, "each tenant alone", bed.link_bps, figs, shaping=applied,
                          qdiscs=q.qdiscs, cpu=q.cpu)


def run_together(bed: "Bed", mode: str, s: Settings, shaper: Shaper) -> ScenarioResult:
    q = Counters()
    with shaper.mode(bed, mode, s) as applied:
        r = measure_counted(bed, [TcpLoad("a", s.flows_a, s.duration, interval=s.interval),
                          TcpLoad("b", s.flows_b, s.duration, interval=s.interval)], f"together-{mode}", q)
    shaped = mode != "none"
    figs = {k: _figure(bed, k, r[k], s, None, True, shaped) for k in ("a", "b")}
    return ScenarioResult("together", mode, "together, B with 8x A's flows", bed.link_bps, figs,
                          shaping=applied, qdiscs=q.qdiscs, cpu=q.cpu)


def run_pressure(bed: "Bed", mode: str, s: Settings, shaper: Shaper) -> ScenarioResult:
    limits = _limits_for(bed, s, True)
    q = Counters()
    with shaper.mode(bed, mode, s, raised=True) as applied:
        r = measure_counted(bed, [TcpLoad("a", s.flood_flows, s.duration, interval=s.interval),
                          TcpLoad("b", s.victim_flows, s.duration, interval=s.interval)], f"pressure-{mode}", q)
    shaped = mode != "none"
    figs = {k: _figure(bed, k, r[k], s, limits, True, shaped) for k in ("a", "b")}
    return ScenarioResult("pressure", mode, "limits = capacity; A floods with many flows", bed.link_bps,
                          figs, shaping=applied, qdiscs=q.qdiscs, cpu=q.cpu)


def run_udp(bed: "Bed", mode: str, s: Settings, shaper: Shaper) -> ScenarioResult:
    limits = _limits_for(bed, s, True)
    rate = s.udp_factor * bed.link_bps
    q = Counters()
    with shaper.mode(bed, mode, s, raised=True) as applied:
        r = measure_counted(bed, [UdpFlood("a", rate, s.duration, interval=s.interval),
                          TcpLoad("b", s.victim_flows, s.duration, interval=s.interval)], f"udp-{mode}", q)
    shaped = mode != "none"
    figs = {"a": _figure(bed, "a", r["a-udp"], s, limits, False, shaped),
            "b": _figure(bed, "b", r["b"], s, limits, True, shaped)}
    return ScenarioResult("udp", mode, f"A floods UDP at {s.udp_factor:g}x link; B TCP", bed.link_bps, figs,
                          extra={"udp_offered_bps": rate, "udp_sent_bps": r["a-udp"].sent_bps},
                          shaping=applied, qdiscs=q.qdiscs, cpu=q.cpu)


def run_converge(bed: "Bed", mode: str, s: Settings, shaper: Shaper) -> ScenarioResult:
    limits = _limits_for(bed, s, True)
    total = s.converge_lead + s.converge_after
    q = Counters()
    with shaper.mode(bed, mode, s, raised=True) as applied:
        r = measure_counted(bed, [TcpLoad("a", s.flood_flows, total, interval=s.interval),
                          TcpLoad("b", s.victim_flows, s.converge_after, start=s.converge_lead,
                                  interval=s.interval)], f"converge-{mode}", q)
    shaped = mode != "none"
    b = r["b"]
    g = bed.tenant("b").guarantee * bed.link_bps
    factor = b.wire_bps(1.0)
    reach = first_reach(b.samples, 0.98 * g / factor)
    settle = convergence_time(b.samples, 0.95 * g / factor, hold=0.5)
    figs = {"a": _figure(bed, "a", r["a"], s, limits, True, shaped),
            "b": _figure(bed, "b", b, s, limits, True, shaped)}
    # A's figures are dominated by its solo lead; report its rate while B runs too
    a = r["a"]
    start_b = b.offset - a.offset
    a_during = mean_rate(a.samples, skip=start_b + s.warmup)
    return ScenarioResult("converge", mode, "A saturates alone, B joins", bed.link_bps, figs,
                          extra={"reach_s": reach, "settle_s": settle, "newcomer": "b",
                                 "threshold_reach": "first 0.1 s sample >= 98 % of guarantee (wire)",
                                 "threshold_settle": "from then on every 0.5 s average >= 95 % (wire)",
                                 "a_wire_bps_while_b": a_during * factor if a_during else None,
                                 "b_start_offset_s": start_b},
                          shaping=applied, qdiscs=q.qdiscs, cpu=q.cpu)


def run_latency(bed: "Bed", mode: str, s: Settings, shaper: Shaper, idle: RttStats | None = None
                ) -> ScenarioResult:
    q = Counters()
    with shaper.mode(bed, mode, s) as applied:
        r = measure_counted(bed, [TcpLoad("a", s.flood_flows, s.duration, interval=s.interval),
                           RttProbe("b", s.duration - 0.5, start=0.5, every=s.probe_every)],
                     f"latency-{mode}", q)
    shaped = mode != "none"
    figs = {"a": _figure(bed, "a", r["a"], s, None, False, shaped)}
    extra = {"rtt": r["b-ping"].to_dict()}
    if idle is not None:
        extra["idle_rtt"] = idle.to_dict()
    return ScenarioResult("latency", mode, "B's ping RTT while A saturates", bed.link_bps, figs,
                          extra=extra, shaping=applied, qdiscs=q.qdiscs, cpu=q.cpu)


def idle_rtt(bed: "Bed", s: Settings, seconds: float = 1.0) -> RttStats:
    bed.clear_node_shaping()
    r = measure(bed, [RttProbe("b", seconds, every=s.probe_every)], name="idle-rtt")
    return r["b-ping"]  # type: ignore[return-value]


RUNNERS: dict[str, Callable[..., ScenarioResult]] = {
    "alone": run_alone, "together": run_together, "pressure": run_pressure,
    "udp": run_udp, "converge": run_converge, "latency": run_latency,
}

# which modes each scenario is run in by default
DEFAULT_PLAN: dict[str, tuple[str, ...]] = {
    "alone": ("none", "shaperd", "hand-tc"),
    "together": ("none", "shaperd", "hand-tc"),
    "pressure": ("none", "shaperd", "hand-tc"),
    "udp": ("none", "shaperd", "hand-tc"),
    "converge": ("none", "shaperd", "hand-tc"),
    "latency": ("none", "shaperd", "hand-tc"),
}


def run_all(bed: "Bed", settings: Settings | None = None, *, scenarios: tuple[str, ...] = SCENARIOS,
            modes: tuple[str, ...] = MODES, shaper: Shaper | None = None,
            progress: Callable[[str], None] | None = None, keep_going: bool = True) -> list[ScenarioResult]:
    """Run the selected scenarios in the selected modes; returns every result.

    A failing shaped mode (e.g. shaperd's CLI missing) is recorded as an error
    on that result and the run goes on when *keep_going*.
    """
    s = settings or Settings()
    shaper = shaper or Shaper()
    out: list[ScenarioResult] = []
    idle = None
    for sc in scenarios:
        for mode in DEFAULT_PLAN[sc]:
            if mode not in modes:
                continue
            if progress:
                progress(f"{sc} [{mode}]")
            t0 = time.monotonic()
            try:
                if sc == "latency":
                    if idle is None:
                        idle = idle_rtt(bed, s)
                    res = run_latency(bed, mode, s, shaper, idle)
                else:
                    res = RUNNERS[sc](bed, mode, s, shaper)
            except (shaping.ShaperdError, shaping.CommandError, RuntimeError) as e:
                if not keep_going:
                    raise
                log.warning("%s [%s] failed: %s", sc, mode, e)
                res = ScenarioResult(sc, mode, sc, bed.link_bps, {}, error=str(e))
                bed.clear_node_shaping()
            res.elapsed_s = time.monotonic() - t0
            res.started_monotonic = t0
            out.append(res)
    return out
