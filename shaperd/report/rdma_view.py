"""The RDMA path beside the tc figures in ``shaperd status`` and ``shaperd top``: who owns which port, what it sent.

``RdmaWatch`` discovers the node's RDMA devices once (sysfs), works out the
owner of each port from the tenants file (the RDMA plan, pure), and on each
``sample(t)`` reads the ports' counters (sysfs) into the same accounting the
daemon's metrics use (report/rdma_accounting.py). ``t`` comes from the
caller's clock, so status and top sample both paths at the same instants.

Without a readable tenants file no port has an owner; ports are still
shown. Owners come from ``rdma.devices`` in the tenants file: which pod
holds which VF is known to the daemon (pod-resources), not to this view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shaperd.rdma.plan import RdmaPlan, plan
from shaperd.core.config import Config, load_file
from shaperd.discovery import rdma as rdma_discovery
from shaperd.discovery import rdma_counters
from shaperd.core.errors import ConfigError
from shaperd.core.inventory import Inventory, RdmaDevice
from shaperd.core.roots import DEFAULT, Roots
from shaperd.core.tenancy import tenancy
from shaperd.core.units import format_rate
from shaperd.report.rdma_accounting import PortTarget, RdmaAccumulator, RdmaPortSeries
from shaperd.report.rdma_sampler import targets_of


def load_config(path: str | None) -> Config | None:
    if not path:
        return None
    try:
        return load_file(path)
    except ConfigError:
        return None


def rdma_plan(cfg: Config | None, devices: tuple[RdmaDevice, ...], notes: tuple[str, ...]) -> RdmaPlan | None:
    if cfg is None:
        return None
    inv = Inventory(rdma=devices, rdma_notes=notes)
    return plan(cfg, inv, tenancy(cfg, inv))


@dataclass
class RdmaWatch:
    roots: Roots = DEFAULT
    config: Config | None = None
    rate_window_s: float = 2.0
    devices: tuple[RdmaDevice, ...] = ()
    notes: tuple[str, ...] = ()
    plan: RdmaPlan | None = None
    targets: dict[tuple[str, int], PortTarget] = field(default_factory=dict)
    acc: RdmaAccumulator | None = None

    @classmethod
    def open(cls, roots: Roots = DEFAULT, config_path: str | None = None, rate_window_s: float = 2.0) -> "RdmaWatch":
        w = cls(roots, load_config(config_path), rate_window_s)
        w.devices, w.notes = rdma_discovery.discover(roots)
        w.plan = rdma_plan(w.config, w.devices, w.notes)
        w.targets = targets_of(w.devices, w.plan.owners if w.plan else {})
        w.acc = RdmaAccumulator(rate_window_s)
        return w

    def sample(self, t: float) -> None:
        self.acc.ingest(t, rdma_counters.read_ports(self.roots, sorted(self.targets)), self.targets)

    def view(self) -> tuple[RdmaPortSeries, ...]:
        return self.acc.view() if self.acc else ()


def tenant_rows(series: Iterable[RdmaPortSeries]) -> list[dict]:
    """status --json: one row per RDMA port, beside the tc classes."""
    out = []
    for s in series:
        row = {"path": "rdma", "tenant": s.target.tenant, "device": s.target.device, "port": s.target.port,
               "link_layer": s.target.link_layer, "readable": s.readable}
        if s.readable:
            row.update(bytes=s.bytes_total, packets=s.packets_total, xmit_wait=s.wait_total, rate_bps=s.rate_bps,
                       hw_counters=dict(s.hw_totals), saturated=list(s.saturated))
        row["notes"] = list(s.notes)
        out.append(row)
    return out


def _n(v) -> str:
    return "-" if v is None else str(v)


def render_table(series: tuple[RdmaPortSeries, ...], congestion: bool = True) -> str:
    """The RDMA ports as a table: '-' where a figure is unknown (no counters/, saturated, unreadable)."""
    head = ("TENANT", "DEVICE", "PORT", "LINK", "RATE", "BYTES", "PACKETS", "XMIT WAIT") + (("CNP SENT",) if congestion else ())
    lines = [head]
    notes: list[str] = []
    for s in series:
        rate = "-" if s.rate_bps is None else format_rate(int(s.rate_bps))
        cells = (s.target.tenant or "(none)", s.target.device, str(s.target.port), s.target.link_layer or "?", rate,
                 _n(s.bytes_total), _n(s.packets_total), _n(s.wait_total))
        if congestion:
            cells += (_n(s.hw_totals.get("np_cnp_sent")),)
        lines.append(cells)
        notes.extend(s.notes)
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)
    return text + "".join(f"\nnote: {n}" for n in dict.fromkeys(notes))
