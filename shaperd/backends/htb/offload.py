"""HTB offload (``tc qdisc ... htb offload``, mlx5): what an HTB plan would lose if offloaded, as data. Pure.

The mlx5 driver's HTB offload (kernel 5.16+) accepts only part of HTB: it
refuses ``prio`` and ``quantum`` on classes, allows at most 256 leaf
classes, and classifies only by skb->priority set before the qdisc (on
clsact egress, which is what the map classifier of issue 11 does) — no
filters on the HTB root. ``verdict`` lists every part of a device plan that
offload cannot express; a plan with any reason stays in software HTB (the
fallback), and the reasons are what the operator is told. Whether the device
offloads at all is probed (kernel/probe.py ``htb_offload``: a veth answers
EOPNOTSUPP, "not supported").
"""

from __future__ import annotations

from dataclasses import dataclass

from .objects import ROOT_CLASS_MINOR, DevicePlan, U32Filter, classid

MLX5_MAX_LEAVES = 256


@dataclass(frozen=True)
class OffloadVerdict:
    device: str
    possible: bool
    reasons: tuple[str, ...] = ()


def verdict(dp: DevicePlan, supported: bool, why_not: str = "") -> OffloadVerdict:
    reasons: list[str] = []
    if not supported:
        reasons.append(f"htb offload not supported on {dp.device}: {why_not or 'the device refuses it'}")
    leaves = [c for c in dp.classes if c.classid != classid(ROOT_CLASS_MINOR)]
    if len({c.prio for c in leaves}) > 1:
        reasons.append("tenant priorities need HTB prio, which mlx5 offload refuses: spare bandwidth would no longer "
                       "go to the higher priority first")
    if len({c.quantum_bytes for c in leaves}) > 1:
        reasons.append("spare shared in proportion to guarantees needs per-class quantum, which mlx5 offload refuses")
    if len(leaves) > MLX5_MAX_LEAVES:
        reasons.append(f"{len(leaves)} leaf classes: mlx5 offload allows {MLX5_MAX_LEAVES}")
    if dp.filters:
        kinds = sorted({"u32" if isinstance(f, U32Filter) else f"cls_bpf {f.kind}" for f in dp.filters})
        reasons.append(f"classification by filters on the HTB root ({', '.join(kinds)}) cannot be offloaded: "
                       "offload classifies by skb->priority set on clsact egress (the map classifier)")
    return OffloadVerdict(dp.device, not reasons, tuple(reasons))
