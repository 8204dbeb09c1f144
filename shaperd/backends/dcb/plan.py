"""Plan the RoCE DCB configuration of each RoCE uplink, pure: DSCP -> priority -> TC, ETS shares, max rates.

Which netdevs: the RoCE ports of the tenants' RDMA devices (the RDMA plan,
backends/rdma/plan.py), through ``RdmaPort.netdevs``. A VF's DCB lives on its
PF, so a VF's port is replaced by the PF's port of the same number. DCB is
per netdev and shared by every tenant on it.

The chain, per netdev:

- DSCP: the tenant's ``TenantRdma.dscp`` (its trafficClass >> 2, derived
  from the priority rank unless configured).
- TC: TC0 carries traffic of no tenant (and DSCP 0); its share is what the
  guarantees leave of the capacity (at least the node reserve, config.py
  checks that). The tenants on the netdev are ranked by priority among
  themselves (``priority_ranks``, the SL logic): rank r gets TC 1 + r; ranks
  from 6 on share TC7 (tenants outnumbering the TCs are grouped with the
  lowest-priority ones, never with the default traffic).
- priority: 802.1p priority p goes to TC p (``prio_tc`` is the identity), so a
  tenant's DSCP maps, in the APP table (selector 5), to the priority equal
  to its TC. Two tenants with one DSCP but different TCs: the higher-ranked
  one wins and a warning says so. DSCP 0 (best effort) is never mapped: it is
  everyone's default, so such a tenant stays in TC0, with a warning.
- ETS: every TC is ETS (no strict TC can starve the others). Shares in
  integer percent from the TCs' guarantees over the capacity, by largest
  remainder: each used TC first gets max(1, floor(exact)); if that is
  above 100 the largest shares give one point back (largest first, lower TC
  on ties) until 100; if below, the largest remainders get one more (lower
  TC on ties). Every TC in use, so every tenant with a guarantee, has >= 1;
  unused TCs get 0; the sum is exactly 100.
- max rate (kbit/s, IEEE_MAXRATE): a TC's tenants' limits summed (floor to
  kbit/s); 0 (unlimited) for TC0, for a TC with a tenant without limit and
  when the sum reaches the capacity. A max rate below the TC's ETS share of
  the capacity (possible only by the 1 % rounding) is raised to it, with a
  warning: a cap below the share would contradict the guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass

from shaperd.core.config import Config, Tenant
from shaperd.core.errors import ConfigProblem
from shaperd.core.inventory import Inventory, RdmaPort
from shaperd.core.units import format_rate
from shaperd.rdma.plan import TenantRdma, priority_ranks

MAX_TCS = 8
DEFAULT_TC = 0
TSA_ETS = 2  # IEEE_8021QAZ_TSA_ETS
SEL_DSCP = 5  # IEEE_8021QAZ_APP_SEL_DSCP
IDENTITY_PRIO_TC = tuple(range(MAX_TCS))


@dataclass(frozen=True)
class TenantTc:
    """One tenant on one netdev: its TC and what that TC gets (shared with the TC's other tenants)."""

    tenant: str
    netdev: str
    dscp: int
    tc: int
    priority: int
    share_pct: int
    maxrate_kbps: int  # 0: unlimited


@dataclass(frozen=True)
class NetdevDcb:
    """The desired IEEE DCB state of one netdev."""

    netdev: str
    capacity_bps: int
    tc_bw_pct: tuple[int, ...]
    tc_tsa: tuple[int, ...] = (TSA_ETS,) * MAX_TCS
    prio_tc: tuple[int, ...] = IDENTITY_PRIO_TC
    maxrate_kbps: tuple[int, ...] = (0,) * MAX_TCS
    dscp_prio: tuple[tuple[int, int], ...] = ()  # (dscp, priority), sorted by dscp
    tenants: tuple[TenantTc, ...] = ()

    @property
    def key(self) -> tuple:
        """What the netdev is asked for: a write that did not stick is not re-sent until this changes."""
        return (self.tc_bw_pct, self.tc_tsa, self.prio_tc, self.maxrate_kbps, self.dscp_prio)


@dataclass(frozen=True)
class DcbPlan:
    netdevs: tuple[NetdevDcb, ...] = ()
    problems: tuple[ConfigProblem, ...] = ()
    warnings: tuple[str, ...] = ()

    def netdev(self, name: str) -> NetdevDcb | None:
        return next((n for n in self.netdevs if n.netdev == name), None)


def uplink_ports(t: TenantRdma, inv: Inventory, warnings: list[str] | None = None) -> list[RdmaPort]:
    """The tenant's RoCE ports, a VF's replaced by its PF's port (DCB is configured on the PF's netdev).

    Software RoCE (rxe: a device with a parent netdev) has no DCB: skipped, with a warning."""
    out = []
    for p in t.ports:
        if p.link_layer != "Ethernet":
            continue
        dev = inv.rdma_device(p.device)
        if dev is not None and dev.parent:
            if warnings is not None:
                warnings.append(f"DCB: {dev.name} of tenant {t.tenant} is software RoCE on {dev.parent}: no DCB there")
            continue
        if dev is not None and dev.is_vf and dev.pf_pci:
            pf = next((d for d in inv.rdma if d.pci == dev.pf_pci), None)
            pp = pf.port(p.port) if pf is not None else None
            if pp is not None:
                p = pp
        out.append(p)
    return out


def shares(weights: dict[int, int]) -> dict[int, int]:
    """Integer percents summing to exactly 100, each used TC >= 1 (the rounding in the module docstring)."""
    if not weights:
        return {}
    total = sum(weights.values())
    exact = {tc: (100 * w / total if total else 100 / len(weights)) for tc, w in weights.items()}
    out = {tc: max(1, int(e)) for tc, e in exact.items()}
    while sum(out.values()) > 100:
        tc = max((tc for tc in out if out[tc] > 1), key=lambda tc: (out[tc], -tc))
        out[tc] -= 1
    for tc in sorted(out, key=lambda tc: (-(exact[tc] - int(exact[tc])), tc))[: 100 - sum(out.values())]:
        out[tc] += 1
    while sum(out.values()) < 100:  # only when there are more points to give than TCs: the largest first
        out[max(out, key=lambda tc: (exact[tc], -tc))] += 1
    return out


def tc_of_rank(rank: int) -> int:
    return 1 + min(rank, MAX_TCS - 2)


def plan(cfg: Config, inv: Inventory, rdma: tuple[TenantRdma, ...]) -> DcbPlan:
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    by_name = {t.name: t for t in cfg.tenants}
    on: dict[str, list[TenantRdma]] = {}
    for t in rdma:
        for p in uplink_ports(t, inv, warnings):
            for nd in p.netdevs:
                lst = on.setdefault(nd, [])
                if t not in lst:
                    lst.append(t)
    out = []
    for nd in sorted(on):
        tenants = sorted(on[nd], key=lambda t: t.tenant)
        got = _netdev(cfg, inv, nd, tenants, by_name, problems, warnings)
        if got is not None:
            out.append(got)
    return DcbPlan(tuple(out), tuple(problems), tuple(warnings))


def _capacity(cfg: Config, inv: Inventory, nd: str, tenants: list[TenantRdma]) -> int | None:
    if cfg.node.capacity_bps is not None:
        return cfg.node.capacity_bps
    link = next((l for l in inv.links if l.name == nd), None)
    if link is not None and link.speed_bps:
        return link.speed_bps
    rates = [p.rate_gbps for d in inv.rdma for p in d.ports if nd in p.netdevs and p.rate_gbps]
    return int(max(rates) * 1e9) if rates else None


def _netdev(cfg: Config, inv: Inventory, nd: str, tenants: list[TenantRdma], by_name: dict[str, Tenant],
            problems: list, warnings: list) -> NetdevDcb | None:
    capacity = _capacity(cfg, inv, nd, tenants)
    if capacity is None:
        problems.append(ConfigProblem("node.capacity", f"required for DCB on {nd}: neither the kernel nor the RDMA "
                                      "port reports its speed"))
        return None
    ranks = priority_ranks(tuple(by_name[t.tenant] for t in tenants))
    tc_of: dict[str, int] = {}
    dscp_tc: dict[int, tuple[int, str]] = {}
    for t in sorted(tenants, key=lambda t: (ranks[t.tenant], t.tenant)):
        tc = tc_of_rank(ranks[t.tenant])
        if t.dscp == 0:
            warnings.append(f"DCB on {nd}: tenant {t.tenant} has DSCP 0 (best effort), which is never mapped: its "
                            f"RoCE traffic stays in TC{DEFAULT_TC} with traffic of no tenant")
            tc = DEFAULT_TC
        elif t.dscp in dscp_tc and dscp_tc[t.dscp][0] != tc:
            first_tc, first = dscp_tc[t.dscp]
            warnings.append(f"DCB on {nd}: tenants {first} and {t.tenant} share DSCP {t.dscp}; it maps to TC{first_tc}"
                            f" ({first}, higher priority), so {t.tenant} is in TC{first_tc} too")
            tc = first_tc
        else:
            dscp_tc.setdefault(t.dscp, (tc, t.tenant))
        tc_of[t.tenant] = tc
    members: dict[int, list[Tenant]] = {DEFAULT_TC: []}
    for t in tenants:
        members.setdefault(tc_of[t.tenant], []).append(by_name[t.tenant])
    guaranteed = {tc: sum(t.guarantee_bps for t in ts) for tc, ts in members.items() if tc != DEFAULT_TC}
    weights = dict(guaranteed)
    weights[DEFAULT_TC] = max(0, capacity - sum(guaranteed.values()))
    pct = shares(weights)
    bw = tuple(pct.get(tc, 0) for tc in range(MAX_TCS))
    maxrate = [0] * MAX_TCS
    for tc, ts in members.items():
        if tc == DEFAULT_TC or not ts or any(t.limit_bps is None for t in ts):
            continue
        limit = sum(t.limit_bps for t in ts)
        if limit >= capacity:
            continue
        kbps = max(1, limit // 1000)
        floor_kbps = -(-pct[tc] * capacity // 100_000)  # the TC's share of the capacity, in kbit/s, rounded up
        if kbps < floor_kbps:
            warnings.append(f"DCB on {nd}: TC{tc} max rate {format_rate(kbps * 1000)} is below its ETS share "
                            f"{pct[tc]} % of {format_rate(capacity)}: raised to {format_rate(floor_kbps * 1000)}")
            kbps = floor_kbps
        maxrate[tc] = kbps
    apps = tuple(sorted((dscp, tc) for dscp, (tc, _) in dscp_tc.items()))
    tts = tuple(TenantTc(t.tenant, nd, t.dscp, tc_of[t.tenant], tc_of[t.tenant], bw[tc_of[t.tenant]],
                         maxrate[tc_of[t.tenant]]) for t in tenants)
    return NetdevDcb(nd, capacity, bw, maxrate_kbps=tuple(maxrate), dscp_prio=apps, tenants=tts)
