"""Plan and diff the mark programs, pure.

Plan: one program per host-side interface that carries a tenant pod's
traffic (not on the uplinks themselves; not where pods of two tenants share
an interface, since only their addresses can tell them apart there).
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
    per_if: dict[int, tuple[str, str, list[str]]] = {}
    conflicts: set[int] = set()
    shaped = ten.uplink_names
    for pod in inv.pods:
        tenant = ten.pod_tenants.get(pod.uid)
        if tenant is None or pod.host_network or pod.host_ifindex is None or pod.host_ifname in shaped:
            continue
        if tenant not in ten.marks:
            continue
        have = per_if.setdefault(pod.host_ifindex, (tenant, pod.host_ifname or "", []))
        if have[0] != tenant:
            conflicts.add(pod.host_ifindex)
        have[2].append(pod.ref)
    out = []
    mask = cfg.node.mark_mask
    for idx, (tenant, ifname, pods) in sorted(per_if.items()):
        if idx in conflicts:
            continue
        value = ten.marks[tenant]
        out.append(MarkFilter(idx, ifname, value, mask, bpf_program_name(((value, mask),), "mark"),
                              tenant, tuple(sorted(pods))))
    return MarksPlan(marks=tuple(out))


def diff(desired: MarksPlan, observed: MarksObserved) -> TargetDiff:
    out = TargetDiff(TARGET)
    want = {m.ifindex: m for m in desired.marks}
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
