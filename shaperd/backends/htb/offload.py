"""HTB offload (``tc qdisc ... htb offload``, mlx5): what an HTB plan would lose if offloaded, as data. Pure.

Facts from the sources (Linux 6.18):

- net/sched/sch_htb.c (offload since 5.12): ``htb_init`` accepts the
  TCA_HTB_OFFLOAD flag only on the root ("HTB must be the root qdisc to use
  offload") and only where tc_can_offload(dev), i.e. NETIF_F_HW_TC ("hw-tc-
  offload ethtool feature flag must be on"), both EOPNOTSUPP; then
  ndo_setup_tc(TC_HTB_CREATE) with defcls. ``htb_change_class`` refuses
  overhead and mpu under offload (EINVAL; shaperd never sets either) and
  since 6.3 passes prio and quantum to the driver. The offloaded root is
  TCQ_F_MQROOT: each leaf's queue sits on its own TX queue and htb_enqueue
  never runs, so filters on the HTB root never classify anything.
- mlx5 (en/qos.c, en/htb.c, en/selq.c): refuses a non-zero prio or quantum
  (mlx5e_htb_setup_tc, 6.3+: EOPNOTSUPP "prio and quantum parameters are not
  supported by device with HTB offload enabled."); at most MLX5E_QOS_MAX_LEAF_NODES = 256 leaves ("Maximum amount
  of leaf classes is reached.", ENOSPC); picks the TX queue from
  skb->priority (major = the HTB handle: that class; else defcls), so the
  classifier must set skb->priority before the qdisc, on clsact egress,
  which is what the eBPF map classifier of issue 11 does;
  ``mlx5e_htb_convert_rate`` makes each class's rate a DWRR weight
  ``bw_share`` = rate as a whole percent (1..100) of the parent's ceil, and
  the ceil a whole Mbit/s. Spare bandwidth is therefore shared in proportion
  to rate in hardware, without quantum: what shaperd's software HTB does
  with its rate-proportional quantum (plan.HtbSettings.quantum_us), so one
  priority level loses nothing; different priority levels do (the higher
  would no longer be served first).

``verdict`` lists every part of a device plan that offload cannot express; a
plan with any reason stays in software HTB (the fallback), and the reasons
are what the operator is told.
"""

from __future__ import annotations

from dataclasses import dataclass

from shaperd.core.units import format_rate
from shaperd.backends.common.objects import ROOT_HANDLE, DevicePlan, U32Filter, fmt_handle

MLX5_MAX_LEAVES = 256
BYTES_IN_MBIT = 125_000  # mlx5 en/qos.h
# A guarantee is kept where hardware's whole-percent weights still give it this share of its rate with
# every sibling busy (the isolation benchmark's own target: guarantee >= 98 %).
GUARANTEE_KEPT = (98, 100)


@dataclass(frozen=True)
class OffloadVerdict:
    device: str
    possible: bool
    reasons: tuple[str, ...] = ()


def mlx5_bw_share(rate_bps: int, parent_ceil_bps: int) -> int:
    """mlx5e_htb_convert_rate: the class's DWRR weight, its rate in whole percent of the parent's ceil."""
    parent_mbit = max(1, (parent_ceil_bps // 8) // BYTES_IN_MBIT)  # mlx5e_htb_convert_ceil: at least 1
    share = ((rate_bps // 8) * 100 // BYTES_IN_MBIT) // parent_mbit
    return 1 if share == 0 else 0 if share > 100 else share


def weight_shortfalls(dp: DevicePlan) -> list[str]:
    """Classes whose guarantee hardware's whole-percent weights would not keep with all siblings busy."""
    by_id = {c.classid: c for c in dp.classes}
    siblings: dict[int, list] = {}
    for c in dp.classes:
        if c.parent != ROOT_HANDLE and c.parent in by_id:
            siblings.setdefault(c.parent, []).append(c)
    out = []
    for parent, kids in sorted(siblings.items()):
        ceil = by_id[parent].ceil_bps
        weights = {c.classid: mlx5_bw_share(c.rate_bps, ceil) for c in kids}
        total = sum(weights.values())
        for c in kids:
            got = ceil * weights[c.classid] // total if total else 0
            if got * GUARANTEE_KEPT[1] < c.rate_bps * GUARANTEE_KEPT[0]:
                who = f" (tenant {c.tenant})" if c.tenant else ""
                out.append(f"class {fmt_handle(c.classid)}{who}: mlx5 weighs siblings in whole percent of the "
                           f"parent's ceil, so its guarantee {format_rate(c.rate_bps)} would get "
                           f"{format_rate(got)} with every sibling busy")
    return out


def verdict(dp: DevicePlan, supported: bool, why_not: str = "") -> OffloadVerdict:
    """What offload cannot express in ``dp`` (the software-shaped plan); ``supported``: the device side."""
    reasons: list[str] = []
    if not supported:
        reasons.append(f"htb offload not supported on {dp.device}: {why_not or 'the device refuses it'}")
    if dp.map_classifier is None:
        reasons.append("offload classifies by skb->priority set on clsact egress: the eBPF map classifier is "
                       "required and this node has none (capabilities.bpf_maps is false)")
    prios = sorted({c.prio for c in dp.classes if c.tenant is not None})
    if len(prios) > 1:
        reasons.append(f"tenants on {len(prios)} priority levels need HTB prio, which mlx5 offload refuses: spare "
                       "bandwidth would no longer go to the higher priority first")
    if len(dp.leaves) > MLX5_MAX_LEAVES:
        reasons.append(f"{len(dp.leaves)} leaf classes: mlx5 offload allows {MLX5_MAX_LEAVES}")
    if dp.filters:
        kinds = sorted({"u32" if isinstance(f, U32Filter) else f"cls_bpf {f.kind}" for f in dp.filters})
        reasons.append(f"classification by filters in the HTB tree ({', '.join(kinds)}) cannot be offloaded: "
                       "offload classifies by skb->priority set on clsact egress (the map classifier)")
    reasons.extend(weight_shortfalls(dp))
    return OffloadVerdict(dp.device, not reasons, tuple(reasons))
