"""Diff the planned pod ingress caps against the root qdiscs found, pure: per interface, the writes in order.

Ownership, in one place:
- a root qdisc of kind tbf with handle 7368: is shaperd's: kept when its rate, burst and limit are the
  plan's, changed in place when not (same handle and kind: the kernel changes it, its counters go on),
  removed when no capped pod is on its interface any more (the kernel puts its default root back);
- a kernel default root (noqueue on a veth, pfifo_fast, fq_codel ...: backends/common/objects.py) is
  replaced;
- any other root qdisc (the CNI bandwidth plugin's tbf 1:, an operator's) is someone else's: the interface
  is left alone with the reason, and the pod's cap is not enforced, unless the operator asked to take over;
- the ``ingress`` qdisc and whatever its filters redirect to (the CNI plugin's ``bwp*`` IFB, which shapes
  what the pod sends) is said in a note and never touched, nor is any other interface's state.

An in-sync interface yields no TargetDiff at all, so a resync of a node in sync sends no write.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff
from shaperd.core.units import format_rate
from shaperd.backends.common.objects import DEFAULT_ROOT_KINDS, fmt_handle
from shaperd.backends.podingress.objects import (NODE_TARGET, NS_PER_TICK, CniEgress, ObservedRoot, PodIngress,
                                                 PodIngressObserved, PodIngressPlan, TbfSpec)
from shaperd.backends.podingress.ops import DeletePodTbf, SetPodTbf

TAKE_OVER_HINT = "set node.takeOver or pass --take-over to replace it"


def burst_bytes(tbf) -> float:
    """The bucket a dumped tbf holds, in bytes (the kernel dumps it as ticks of time at its rate)."""
    return tbf.buffer_ticks * NS_PER_TICK * tbf.rate_Bps / 1e9


def in_sync(want: TbfSpec, have) -> bool:
    """Whether a dumped tbf (kernel.rtnl_rows.TbfParams) is ``want``. The kernel keeps the bucket as time
    (ns from TCA_TBF_BURST, dumped in 64 ns ticks), so the burst read back is ``want`` within the rounding
    of one tick plus 0.1 %."""
    if have is None or have.rate_Bps != want.rate_Bps or have.limit_bytes != want.limit_bytes:
        return False
    if have.peakrate_Bps or have.mtu_ticks:
        return False
    slack = want.burst_bytes / 1000 + 2 * want.rate_Bps * NS_PER_TICK / 1e9 + 1
    return abs(burst_bytes(have) - want.burst_bytes) <= slack


def describe_root(root: ObservedRoot) -> str:
    return f"root qdisc {root.kind} {fmt_handle(root.handle)}"


def replaceable(root: ObservedRoot | None) -> bool:
    return root is None or root.kind in DEFAULT_ROOT_KINDS


def cni_note(p: PodIngress, cni: CniEgress | None) -> str | None:
    """The one line for the CNI plugin's egress side on the pod's interface (None where there is none)."""
    if cni is None:
        return None
    where = f"pod {p.ref}: {p.ifname} has an ingress qdisc"
    if cni.error:
        return f"{where} (its filters could not be read: {cni.error}); left alone"
    to = f" redirecting to {', '.join(cni.ifbs)}" if cni.ifbs else ""
    return (f"{where}{to} (the CNI bandwidth plugin's shaping of what the pod sends); left alone. It holds the "
            "ingress hook shaperd's mark program needs (no clsact can be added): the pod is recognised by its "
            "addresses only")


def diff_pod(p: PodIngress, root: ObservedRoot | None, cni: CniEgress | None, take_over: bool) -> TargetDiff:
    td = TargetDiff(p.ifname, note=cni_note(p, cni))
    kw = dict(device=p.ifname, ifindex=p.ifindex, tenant=p.tenant, pod=p)
    if root is not None and root.owned:
        if in_sync(p.tbf, root.tbf):
            return td
        have = root.tbf
        was = ("was unreadable" if have is None else
               f"was rate {format_rate(have.rate_Bps * 8)} burst {burst_bytes(have):.0f}b limit {have.limit_bytes}b")
        td.ops.append(SetPodTbf(reason=was, **kw))
    elif replaceable(root):
        td.ops.append(SetPodTbf(reason=f"replacing default root qdisc {root.kind if root else 'none'}", **kw))
    elif take_over:
        td.ops.append(SetPodTbf(reason=f"taking over {describe_root(root)} (take-over requested)", **kw))
    else:
        td.blocked = (f"pod {p.ref}: {describe_root(root)} is not shaperd's; left alone, its ingress cap "
                      f"{format_rate(p.cap_bps)} is not enforced ({TAKE_OVER_HINT})")
    return td


def diff(desired: PodIngressPlan, observed: PodIngressObserved) -> list[TargetDiff]:
    """Per interface with something to do or to say; none for an interface in sync."""
    if observed.error:
        return [TargetDiff(NODE_TARGET, error=observed.error)]
    out = []
    for p in desired.pods:
        td = diff_pod(p, observed.roots.get(p.ifindex), observed.ingress.get(p.ifindex), desired.take_over)
        if td.ops or td.blocked or td.note:
            out.append(td)
    keep = {p.ifindex for p in desired.pods} | {h.ifindex for h in desired.held}
    out.extend(_stale(observed, keep, "no capped pod on it any more"))
    return out


def _stale(observed: PodIngressObserved, keep: set[int], reason: str) -> list[TargetDiff]:
    out = []
    for idx, root in sorted(observed.roots.items()):
        if root.owned and idx not in keep:
            dev = observed.names.get(idx, str(idx))
            out.append(TargetDiff(dev, ops=[DeletePodTbf(device=dev, ifindex=idx, reason=reason)]))
    return out


def teardown(observed: PodIngressObserved) -> list[TargetDiff]:
    """Every interface with shaperd's tbf, with its removal; the read error where the node could not be read."""
    if observed.error:
        return [TargetDiff(NODE_TARGET, error=observed.error)]
    return _stale(observed, set(), "teardown")
