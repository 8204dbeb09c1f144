"""Plan each tenant's SR-IOV VF rates, pure: which VFs, on which PF, with which min/max in Mbit/s.

A tenant's VFs are the devices of its RDMA ports (backends/rdma/plan.py:
``rdma.devices`` and the VFs the kubelet gave its pods) that are SR-IOV VFs
with a known place on their PF (discovery: virtfnN, the PF's netdev and
driver). The split, per tenant and node, over its n usable VFs:

- min_tx_rate = floor(floor(guarantee in Mbit/s) / n): equal shares, rounded
  down to whole Mbit/s, so the VFs' minimums never sum above the guarantee;
- max_tx_rate = floor(floor(limit in Mbit/s) / n), at least 1 (0 would mean
  "no cap"): the VFs' caps sum to at most the limit, so the tenant cannot
  exceed it on this node by spreading over VFs. The cost: an idle VF's share
  is not lent to a busy one (an aggregate needs devlink rate groups). No
  limit: max 0, the VF may use the link, as the tenant may borrow up to
  capacity on the tc path.

guarantee <= limit (config) gives min <= max per VF. Where a PF's driver
refused a minimum before (``refused_min``), its VFs get min 0 (limit only);
where it refused VF rates altogether (``unsupported``), its VFs are left
out. Both with a warning. Sorted by (PF, VF): input order does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shaperd.core.config import Config
from shaperd.core.inventory import Inventory, RdmaDevice
from shaperd.rdma.plan import RdmaPlan

MBIT = 1_000_000
U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True)
class VfTarget:
    """One VF's wanted rates (Mbit/s) and where it is."""

    tenant: str
    pf: str  # the PF's netdev
    pf_ifindex: int
    pf_pci: str
    driver: str
    vf: int  # its number on the PF
    pci: str
    device: str  # its RDMA device
    min_mbps: int
    max_mbps: int  # 0: no cap
    wanted_min_mbps: int  # before any degrade

    @property
    def key(self) -> tuple[str, int]:
        return (self.pf, self.vf)


@dataclass(frozen=True)
class VfPlan:
    vfs: tuple[VfTarget, ...] = ()
    # PF netdev -> why its VFs get no minimum (the driver refused one) / no rates at all.
    degraded: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    problems: tuple = ()
    warnings: tuple[str, ...] = ()

    @property
    def pfs(self) -> tuple[str, ...]:
        return tuple(sorted({v.pf for v in self.vfs}))


def split(guarantee_bps: int, limit_bps: int | None, n: int) -> tuple[int, int]:
    """(min, max) Mbit/s of each of n VFs; n >= 1."""
    lo = min(guarantee_bps // MBIT // n, U32_MAX)
    hi = 0 if limit_bps is None else min(max(1, limit_bps // MBIT // n), U32_MAX)
    return lo, hi


def plan(cfg: Config, inv: Inventory, rdma: RdmaPlan, refused_min: dict[tuple[str, str], str] | None = None,
         unsupported: dict[tuple[str, str], str] | None = None) -> VfPlan:
    """``refused_min``/``unsupported``: (PF PCI, driver) -> the kernel's answer, as the backend recorded it."""
    refused_min, unsupported = refused_min or {}, unsupported or {}
    ifindex = {l.name: l.ifindex for l in inv.links}
    warnings: list[str] = []
    out: list[VfTarget] = []
    degraded: dict[str, str] = {}
    skipped: dict[str, str] = {}
    by_name = {d.name: d for d in inv.rdma}
    for tr in sorted(rdma.tenants, key=lambda t: t.tenant):
        t = cfg.tenant(tr.tenant)
        vfs: dict[str, RdmaDevice] = {}
        for p in tr.ports:
            d = by_name.get(p.device)
            if d is not None and d.is_vf and d.pci:
                vfs[d.pci] = d
        usable = []
        for pci, d in sorted(vfs.items()):
            why = _unplaceable(d, ifindex)
            if why:
                warnings.append(f"tenant {t.name}: VF {pci} ({d.name}) gets no rates: {why}")
                continue
            usable.append(d)
        if not usable:
            continue
        lo, hi = split(t.guarantee_bps, t.limit_bps, len(usable))
        if t.limit_bps is not None and t.limit_bps // MBIT // len(usable) == 0:
            warnings.append(f"tenant {t.name}: limit under 1 Mbit/s per VF over {len(usable)} VFs: each is capped "
                            "at 1 Mbit/s (max_tx_rate 0 would mean no cap)")
        for d in usable:
            key = (d.pf_pci or "", d.pf_driver or "")
            if key in unsupported:
                skipped[d.pf_netdev] = unsupported[key]
                continue
            got_lo = lo
            if lo and key in refused_min:
                got_lo = 0
                degraded[d.pf_netdev] = refused_min[key]
            out.append(VfTarget(tenant=t.name, pf=d.pf_netdev, pf_ifindex=ifindex[d.pf_netdev], pf_pci=d.pf_pci or "",
                                driver=d.pf_driver or "", vf=d.vf_index, pci=d.pci, device=d.name, min_mbps=got_lo,
                                max_mbps=hi, wanted_min_mbps=lo))
    for pf, why in sorted(degraded.items()):
        warnings.append(f"VF rates on {pf}: limit only (min_tx_rate 0), the driver refused a minimum: {why}")
    for pf, why in sorted(skipped.items()):
        warnings.append(f"VF rates on {pf}: not set, the driver refused VF rates: {why}")
    return VfPlan(vfs=tuple(sorted(out, key=lambda v: v.key)), degraded=degraded, unsupported=skipped,
                  warnings=tuple(warnings))


def _unplaceable(d: RdmaDevice, ifindex: dict[str, int]) -> str | None:
    if d.vf_index is None:
        return f"its number on PF {d.pf_pci} is unknown (no virtfnN there points at it)"
    if not d.pf_netdev:
        return f"PF {d.pf_pci} has no netdev (sysfs net/)"
    if d.pf_netdev not in ifindex:
        return f"PF netdev {d.pf_netdev} is not in this network namespace"
    return None
