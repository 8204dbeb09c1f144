"""Plan and diff the mark programs, pure.

Plan: one program per host-side interface that carries a tenant pod's
traffic (not on the uplinks themselves; not where pods of two tenants share
an interface, since only their addresses can tell them apart there). A pod
with an egress cap gets its own mark (Tenancy.pod_marks: its own class)
instead of its tenant's; one the mask has no value left for gets none, and
neither does an interface it shares with other pods.
Diff: set missing or outdated programs, remove shaperd's stale ones.
"""

from __future__ import annotations

from shaperd.core.config import Config
from shaperd.core.inventory import Inventory
from shaperd.core.tenancy import Tenancy
from shaperd.core.protocol import TargetDiff
from shaperd.core.ids import bpf_program_name
from shaperd.backends.marks.objects import TARGET, MarkFilter, MarksObserved, MarksPlan
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.marks.ops import DeleteMark, SetMark


def plan(cfg: Config, inv: Inventory, ten: Tenancy) -> MarksPlan:
    if not inv.capabilities.bpf:
        return MarksPlan()  # the HTB plan warns that pods are recognised by address only
    per_if: dict[int, tuple[int, str, str, str, list[str]]] = {}  # ifindex -> (mark, tenant, pod, ifname, pods)
    conflicts: set[int] = set()
    shaped = ten.uplink_names
    capped = ten.egress_capped()
    for pod in inv.pods:
        if pod.host_network or pod.host_ifindex is None or pod.host_ifname in shaped:
            continue
        tenant = ten.pod_tenants.get(pod.uid)
        if pod.uid in capped:
            # Its own mark (its own class); none left under the mask: no mark at all, or its tenant's would
            # win over its address in the classifier and carry it past its cap (the htb plan warns).
            value, own = ten.pod_marks.get(pod.uid), pod.ref
        else:
            value, own = (ten.marks.get(tenant) if tenant is not None else None), ""
        if value is None:
            if pod.uid in capped:
                conflicts.add(pod.host_ifindex)  # and a tenant-mate on the same interface gets none either
            continue
        have = per_if.setdefault(pod.host_ifindex, (value, tenant or "", own, pod.host_ifname or "", []))
        if have[0] != value:
            conflicts.add(pod.host_ifindex)
        have[4].append(pod.ref)
    out = []
    mask = cfg.node.mark_mask
    for idx, (value, tenant, own, ifname, pods) in sorted(per_if.items()):
        if idx in conflicts:
            continue
        out.append(MarkFilter(idx, ifname, value, mask, bpf_program_name(((value, mask),), "mark"),
                              tenant, tuple(sorted(pods)), pod=own))
    return MarksPlan(marks=tuple(out))


def blocked(desired: MarksPlan, observed: MarksObserved) -> list[TargetDiff]:
    """One target left alone per interface whose ingress hook holds a classic ``ingress`` qdisc: shaperd
    never replaces it (it is someone else's, often the CNI bandwidth plugin's), so that interface's pods are
    recognised on the uplink by address only (not after masquerade or encapsulation)."""
    return [TargetDiff(m.ifname, blocked=(
                f"an ingress qdisc (not clsact) holds the ingress hook of {m.ifname} (the CNI bandwidth plugin's "
                f"egress side puts one there): mark program left unset; pods {', '.join(m.pods) or '-'} are "
                "recognised by address only"))
            for m in desired.marks if m.ifindex in observed.ingress_qdisc and m.ifindex not in observed.clsact]


def diff(desired: MarksPlan, observed: MarksObserved) -> TargetDiff:
    out = TargetDiff(TARGET)
    want = {m.ifindex: m for m in desired.marks
            if m.ifindex not in observed.ingress_qdisc or m.ifindex in observed.clsact}  # blocked() says the rest
    for idx, m in sorted(want.items()):
        have = observed.marks.get(idx)
        if have is not None and have.name == m.name:
            continue
        if idx not in observed.clsact:
            out.ops.append(AddClsact(device=m.ifname, ifindex=idx, reason="missing", tenant=m.tenant))
        why = "missing" if have is None else f"was {have.name}"
        out.ops.append(SetMark(device=m.ifname, ifindex=idx, mark=m, tenant=m.tenant,
                               reason=f"{why}; pods {', '.join(m.pods)}" if m.pods else why))
    for idx, have in sorted(observed.marks.items()):
        if idx not in want:
            out.ops.append(DeleteMark(device=observed.names.get(idx, str(idx)), ifindex=idx, observed=have,
                                      reason="stale"))
    return out
