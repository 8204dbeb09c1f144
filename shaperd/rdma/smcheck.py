"""Compare what the subnet manager programmed on this node's HCA ports with what the tenants file renders; pure.

Owns the comparison and its records: per port, either "not verified: why"
or a list of mismatches (which table, which SL or entry, expected and
observed), and the metric samples they give. The tables are read by
``kernel.ib_smp.read_port`` (passed in as ``read``); this module never reads
or writes a port, and shaperd never writes these tables from a node: only
the SM does.

What a CA port should hold is the ``ca`` set of ``opensm.render``: its
SL2VL row, and of each VLArb table the entries OpenSM programs for the
port's capacity (the first min(cap, 32), then cap % 32 of the second block),
the rest of the template's 64 entries being 0:0. An entry with weight 0 is
skipped by the port whatever its VL, so such entries compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from shaperd.core.config import Config
from shaperd.core.errors import ShaperdError
from shaperd.core.inventory import Inventory, RdmaPort
from shaperd.rdma.opensm import DEFAULT_MAX_VLS, NUM_SLS, OpenSmConfigError, QosTables, render
from shaperd.rdma.plan import RdmaPlan

BLOCK = 32  # VLArb entries per SMP block
TEMPLATE = 64
TABLES = ("sl2vl", "vlarb_high", "vlarb_low")


class ObservedVlArb(Protocol):
    low_cap: int
    high_cap: int
    low: Sequence[tuple[int, int]]
    high: Sequence[tuple[int, int]]


class ObservedPort(Protocol):
    sl2vl: Sequence[int]
    vlarb: ObservedVlArb


@dataclass(frozen=True)
class Mismatch:
    table: str  # "sl2vl", "vlarb_high", "vlarb_low"
    index: int  # the SL, or the arbitration table entry
    expected: object  # a VL, or (VL, weight)
    observed: object

    def __str__(self) -> str:
        if self.table == "sl2vl":
            return f"SL{self.index} -> VL{self.observed}, expected VL{self.expected}"
        ev, ew = self.expected
        ov, ow = self.observed
        return f"{self.table} entry {self.index}: {ov}:{ow}, expected {ev}:{ew}"


@dataclass(frozen=True)
class PortCheck:
    device: str
    port: int
    verified: bool
    reason: str | None = None  # why not verified
    mismatches: tuple[Mismatch, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def ok(self) -> bool:
        return self.verified and not self.mismatches

    def describe(self) -> str:
        if not self.verified:
            return f"{self.ref}: not verified: {self.reason}"
        if not self.mismatches:
            return f"{self.ref}: SL2VL and VL arbitration as the tenants file renders them"
        return f"{self.ref}: {len(self.mismatches)} mismatch(es): " + "; ".join(map(str, self.mismatches))


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def port_entries(template: Sequence[tuple[int, int]], cap: int) -> tuple[tuple[int, int], ...]:
    """The entries OpenSM programs on a port of this capacity (osm_qos.c vlarb_update)."""
    padded = list(template[:TEMPLATE]) + [(0, 0)] * (TEMPLATE - min(len(template), TEMPLATE))
    out = padded[:min(cap, BLOCK)]
    if cap > BLOCK:
        out += padded[BLOCK:BLOCK + cap % BLOCK]
    return tuple(out)


def _norm(entry: tuple[int, int]) -> tuple[int, int]:
    vl, w = entry
    return (vl, w) if w else (0, 0)


def compare(device: str, port: int, expected: QosTables, observed: ObservedPort) -> PortCheck:
    mismatches = [Mismatch("sl2vl", sl, expected.sl2vl[sl], observed.sl2vl[sl])
                  for sl in range(NUM_SLS) if expected.sl2vl[sl] != observed.sl2vl[sl]]
    arb = observed.vlarb
    for table, template, cap, got in (("vlarb_high", expected.vlarb_high, arb.high_cap, arb.high),
                                      ("vlarb_low", expected.vlarb_low, arb.low_cap, arb.low)):
        want = port_entries(template, cap)
        for i, (w, o) in enumerate(zip(want, got)):
            if _norm(w) != _norm(o):
                mismatches.append(Mismatch(table, i, w, o))
    return PortCheck(device=device, port=port, verified=True, mismatches=tuple(mismatches))


def check_ports(ports: Iterable[RdmaPort], expected: QosTables | str,
                read: Callable[[str, int], ObservedPort]) -> tuple[PortCheck, ...]:
    """One check per InfiniBand port (RoCE ports have no SM tables). ``expected`` as a str: why there is none.

    A port that is not ACTIVE or has no LID is not queried: the SM has not
    (yet) swept it, so its tables say nothing about the tenants file."""
    out = []
    for p in ports:
        if p.link_layer != "InfiniBand":
            continue
        if isinstance(expected, str):
            out.append(PortCheck(p.device, p.port, verified=False, reason=expected))
            continue
        if p.state and p.state != "ACTIVE":
            out.append(PortCheck(p.device, p.port, verified=False,
                                 reason=f"port is {p.state}; the SM programs active ports"))
            continue
        if not p.lid:
            out.append(PortCheck(p.device, p.port, verified=False,
                                 reason="no LID assigned; the SM has not swept this port"))
            continue
        try:
            observed = read(p.device, p.port)
        except ShaperdError as e:
            out.append(PortCheck(p.device, p.port, verified=False, reason=str(e)))
            continue
        out.append(compare(p.device, p.port, expected, observed))
    return tuple(out)


def node_checks(cfg: Config, inv: Inventory, rplan: RdmaPlan, read: Callable[[str, int], ObservedPort],
                max_vls: int | Mapping[str, int] = DEFAULT_MAX_VLS) -> tuple[PortCheck, ...]:
    """Check every InfiniBand port of this node against the ``ca`` set the tenants file renders."""
    try:
        expected: QosTables | str = render(cfg, rplan, max_vls).tables("ca")
    except OpenSmConfigError as e:
        expected = f"no expected tables: {e.problems[0]}"
    ports = [p for d in inv.rdma for p in d.ports]
    return check_ports(ports, expected, read)


def metric_samples(checks: Iterable[PortCheck]) -> list[Sample]:
    """Series only for ports whose tables were read: shaperd_rdma_sm_tables_verified 1 (as rendered) or 0
    (mismatches), and the mismatch count per table. A port that could not be read has none (no fake 0/1)."""
    out = []
    for c in checks:
        if not c.verified:
            continue
        labels = {"device": c.device, "port": str(c.port)}
        out.append(Sample("shaperd_rdma_sm_tables_verified", labels, 1.0 if c.ok else 0.0))
        for table in TABLES:
            n = sum(1 for m in c.mismatches if m.table == table)
            out.append(Sample("shaperd_rdma_sm_table_mismatches", {**labels, "table": table}, float(n)))
    return out
