"""Eight tenants at once: every guarantee held while the link is full, whatever each one's flows.

Owns: the eight tenants (guarantees 5-20 % of the link summing to 90 %, limits open to the whole
capacity, priorities 10-100, flows 1-8 so that priority and flow count disagree), one
measurement of all of them sending at once in a mode (``none``: the kernel default, where flow
count decides; ``shaperd``), and the figures: each tenant's steady wire rate against its
guarantee (its *attainment*), the worst attainment, and the link's utilisation against a single
unshaped tenant's.

Must not: assert anything (bench/many_tenants.py prints the figures; targets are judged there and
recorded in BENCHMARKS.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .parse import IperfResult, mean_rate
from .scenarios import Counters, Settings, Shaper, measure_counted
from .topology import TenantSpec
from .traffic import TcpLoad, measure

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Bed

# (guarantee fraction, priority, flows): the low-priority 1-flow tenants sit beside 8-flow
# high-priority ones, the case where a flow-fair link starves them.
EIGHT: tuple[tuple[float, int, int], ...] = (
    (0.05, 10, 8), (0.05, 20, 1), (0.10, 30, 4), (0.10, 40, 1),
    (0.10, 50, 8), (0.15, 60, 2), (0.15, 70, 8), (0.20, 100, 2),
)


def eight_tenants() -> tuple[TenantSpec, ...]:
    """The bed's tenants ``t0``..``t7`` (pods 198.18.11-18.0/24); limits are the whole link."""
    return tuple(TenantSpec(f"tenant-{i}", f"t{i}", 11 + i, g, 1.0, prio, 5211 + i)
                 for i, (g, prio, _) in enumerate(EIGHT))


def flows_of(short: str) -> int:
    return EIGHT[int(short[1:])][2]


@dataclass
class Outcome:
    """One measurement of all eight in one mode."""

    mode: str
    tenants: dict[str, dict]     # short -> guarantee_bps, flows, priority, wire_bps, attainment, sent/cpu
    cpu: dict
    uplink_drops: int | None = None   # in the node's qdiscs (the shaper's leaves)
    wire_drops: int | None = None     # in the wire's TBF (the emulated NIC's queue overflowed)

    @property
    def worst(self) -> tuple[str, float] | None:
        got = [(k, t["attainment"]) for k, t in self.tenants.items() if t.get("attainment") is not None]
        return min(got, key=lambda kv: kv[1]) if got else None

    @property
    def total_goodput_bps(self) -> float:
        return sum(t["goodput_bps"] for t in self.tenants.values())

    def to_dict(self) -> dict:
        return {"mode": self.mode, "tenants": self.tenants, "cpu": self.cpu, "uplink_drops": self.uplink_drops,
                "wire_drops": self.wire_drops, "worst": self.worst, "total_goodput_bps": self.total_goodput_bps}


def figures(bed: "Bed", results: dict[str, IperfResult], warmup_s: float) -> dict[str, dict]:
    """Per tenant: steady wire rate (after *warmup_s*) against its guarantee."""
    out = {}
    for t in bed.config.tenants:
        r = results[t.short]
        steady = mean_rate(r.samples, skip=warmup_s)
        wire = r.wire_bps(steady) if steady else r.wire_bps()
        g = t.guarantee * bed.link_bps
        out[t.short] = {"guarantee_bps": g, "priority": t.priority, "flows": r.streams,
                        "goodput_bps": r.received_bps, "wire_bps": wire, "attainment": wire / g,
                        "sent_bps": r.sent_bps, "sender_cpu_percent": r.sender_cpu_percent}
    return out


def run(bed: "Bed", mode: str, *, duration_s: float, warmup_s: float = 0.5, capacity_bps: float | None = None,
        reserve_bps: float | None = 10e6) -> Outcome:
    """All eight send at once for *duration_s* in *mode* (``none`` or ``shaperd``), limits raised to capacity."""
    q = Counters()
    with Shaper().mode(bed, mode, Settings(capacity_bps=capacity_bps, reserve_bps=reserve_bps), raised=True):
        res = measure_counted(bed, [TcpLoad(t.short, flows_of(t.short), duration_s, interval=0.1)
                                    for t in bed.config.tenants], f"eight-{mode}", q)
    return Outcome(mode, figures(bed, res, warmup_s), q.cpu, q.qdiscs.get("uplink", {}).get("drops"),
                   q.qdiscs.get("wire", {}).get("drops"))


def single_unshaped(bed: "Bed", duration_s: float) -> float:
    """Goodput of one tenant alone on the unshaped link (8 flows): the utilisation reference."""
    bed.clear_node_shaping()
    short = bed.config.tenants[0].short
    r = measure(bed, [TcpLoad(short, flows_of(short), duration_s, interval=0.1)], name="eight-alone")
    return r[short].received_bps  # type: ignore[union-attr]
