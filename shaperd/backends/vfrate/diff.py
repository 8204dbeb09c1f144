"""Diff wanted VF rates against what the PFs report, pure; ownership lives here.

Per PF (one target each): a VF whose reported rates differ gets one
SetVfRate; an in-sync PF gives no operation. A driver that reports only
IFLA_VF_TX_RATE (no minimum) is compared on the maximum alone, so an
unverifiable minimum is never re-sent. VFs no tenant owns are read and left
alone, except those this agent set (``ours``: (PF, VF) -> the rates it
wrote): while they still carry exactly those rates they are reset to 0/0;
once someone else changed them they are not shaperd's any more. A PF that
reports no VF info at all is not written (nothing could be verified).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shaperd.core.protocol import TargetDiff
from shaperd.backends.vfrate.ops import SetVfRate
from shaperd.backends.vfrate.plan import VfPlan


@dataclass
class VfObserved:
    """PF netdev -> its VF rates (kernel.vf.PfVfs: ``reported``, ``vf(n)``), or why it could not be read."""

    pfs: dict[str, Any] = field(default_factory=dict)
    ifindexes: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def diff(desired: VfPlan, observed: VfObserved, ours: dict[tuple[str, int], tuple[int, int]]) -> list[TargetDiff]:
    wanted = {v.key: v for v in desired.vfs}
    pfs = sorted({v.pf for v in desired.vfs} | {pf for pf, _ in ours})
    out = []
    for pf in pfs:
        td = TargetDiff(pf)
        out.append(td)
        if pf in observed.errors:
            td.error = observed.errors[pf]
            continue
        st = observed.pfs.get(pf)
        if st is None:
            if any(v.pf == pf for v in desired.vfs):
                td.error = f"read VF rates on {pf}: the PF is gone"
            continue
        if not st.reported:
            if any(v.pf == pf for v in desired.vfs):
                td.blocked = (f"{pf} reports no VF info (IFLA_VFINFO_LIST): VF rates are not written where they "
                              "cannot be read back")
            continue
        blocked, resets = [], []
        for v in (w for w in desired.vfs if w.pf == pf):
            row = st.vf(v.vf)
            if row is None:
                blocked.append(f"VF {v.vf} ({v.pci}, tenant {v.tenant}) is not among {pf}'s VFs")
                continue
            same_max = row.max_mbps == v.max_mbps
            same_min = row.min_mbps is None or row.min_mbps == v.min_mbps
            if same_max and same_min:
                continue
            was = f"min {row.min_mbps} max {row.max_mbps}" if row.min_mbps is not None else f"max {row.max_mbps}"
            td.ops.append(_op(v.pf, v.pf_ifindex, v.vf, v.min_mbps, v.max_mbps, v.tenant, v.pf_pci, v.driver,
                              f"was {was} Mbit/s"))
        for (opf, n), (lo, hi) in sorted(ours.items()):
            if opf != pf or (pf, n) in wanted:
                continue
            row = st.vf(n)
            if row is None or (lo, hi) == (0, 0):
                continue
            if row.max_mbps == hi and row.min_mbps in (None, lo):
                resets.append(_op(pf, observed.ifindexes.get(pf, 0), n, 0, 0, None, "", "",
                                  "no tenant owns it any more (shaperd set these rates)"))
        td.ops[:0] = resets  # first free what nobody owns (drivers check the sum of minimums against the link)
        if blocked:
            td.blocked = "; ".join(blocked)
    return out


def teardown(observed: VfObserved, ours: dict[tuple[str, int], tuple[int, int]]) -> list[TargetDiff]:
    """Per PF with VFs shaperd set: their resets to 0/0, or the error that PF could not be read with."""
    return diff(VfPlan(), observed, ours)


def _op(pf, ifindex, vf, lo, hi, tenant, pci, driver, reason) -> SetVfRate:
    return SetVfRate(device=pf, ifindex=ifindex, vf=vf, min_mbps=lo, max_mbps=hi, tenant=tenant, pf_pci=pci,
                     driver=driver, reason=reason)
