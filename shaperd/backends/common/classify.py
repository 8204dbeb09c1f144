"""Who is who on an uplink: the classification rules htb and edt share, before either realises them.

The tenants' interfaces, cgroups, marks and source prefixes as class ids (``classification``), the
eBPF map classifier built from them (``map_classifier_for``), and the capacity every data plane
shapes to (``checked_capacity``). One planner, two realisations: htb installs the result in an HTB
tree, edt in its stamper's maps. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from shaperd.backends.common import mapcls
from shaperd.backends.common.objects import (
    ETH_P_IP,
    PRIO_BPF_CGROUP,
    PRIO_BPF_IFINDEX,
    PRIO_BPF_MARK,
    PRIO_U32_V4_BASE,
    PRIO_U32_V6_BASE,
    BpfFilter,
    Filter,
    U32Filter,
    classid,
)
from shaperd.core.config import Config, check_guarantee_sum
from shaperd.core.ids import assign_minors, bpf_program_name, pod_class_name
from shaperd.core.inventory import Inventory, Link
from shaperd.core.units import format_rate
from shaperd.core import tenancy as tenancy_mod

# Share of a NIC's reported speed shaperd shapes to when node.capacity is not
# set. tc counts Ethernet frames without preamble, FCS and inter-frame gap (24
# bytes, 1.6 % of a 1514-byte frame); shaping at the full speed would let the
# queue form in the NIC's shared ring instead of in the tenants' classes
# (bench/isolation.py: at 100 % the bottleneck dropped; at 99 % it never did).
LINK_SPEED_USABLE = tenancy_mod.LINK_SPEED_USABLE
# Ethernet header on top of the MTU: what one full-size frame costs HTB.
ETH_HLEN = 14
GSO_MAX_BYTES = 65536


def checked_capacity(cfg: Config, link: Link, bad) -> int | None:
    """The capacity shaped on ``link`` (node.capacity, else LINK_SPEED_USABLE of its speed), with the
    checks every data plane needs (a capacity exists, no limit above it, guarantees fit); None, after
    ``bad(path, message)`` calls, when one fails. Shared by the htb and edt planners."""
    failed: list[str] = []

    def note(path: str, msg: str) -> None:
        failed.append(path)
        bad(path, msg)

    capacity = cfg.node.capacity_bps
    if capacity is None and link.speed_bps:
        capacity = link.speed_bps * LINK_SPEED_USABLE[0] // LINK_SPEED_USABLE[1]
    if capacity is None:
        note("node.capacity", f"required: the kernel reports no link speed for {link.kind or 'this'} device {link.name}")
        return None
    for i, t in enumerate(cfg.tenants):
        if t.limit_bps is not None and t.limit_bps > capacity:
            note(f"tenants[{i}].bandwidthLimit", f"limit {format_rate(t.limit_bps)} is above capacity {format_rate(capacity)}")
    check_guarantee_sum(capacity, cfg.node.reserve_bps, cfg.tenants, note, where="capacity")
    return None if failed else capacity


def pod_minors(capped_uids, taken: set[int] | frozenset[int]) -> dict[str, int]:
    """uid -> class minor of each pod with an egress cap, derived from its uid (ids.pod_class_name), never a
    tenant's or a scope leaf's (``taken``). Shared by htb (a class) and edt (a stamper key), so the map
    classifier's entries mean the same on both data planes."""
    uids = sorted(capped_uids)
    if not uids:
        return {}
    m = assign_minors([pod_class_name(u) for u in uids], frozenset(taken))
    return {u: m[pod_class_name(u)] for u in uids}


def scope_leaf_names(tenants) -> list[str]:
    """The identities of every scoped tenant's leaves, as htb names them (backends/htb/scopes.py
    ``scope_names``: "<tenant>\\0rest", then "<tenant>\\0dst\\0<prefixes>" per destination; a unit test keeps
    the two equal). Here so a data plane without scopes (edt) can still take their minors."""
    out: list[str] = []
    for t in tenants:
        if t.destinations:
            out.append(f"{t.name}\0rest")
            out.extend(f"{t.name}\0dst\0" + ",".join(sorted(map(str, d.cidrs))) for d in t.destinations)
    return out


def capped_pod_minors(cfg: Config, tenant_minors: dict[str, int], capped_uids) -> dict[str, int]:
    """``pod_minors`` with every tenant minor and every scope leaf minor taken, as both data planes take them,
    so a capped pod's class id is the same whichever plane its uplink is on."""
    names = scope_leaf_names(cfg.tenants)
    tenant_taken = frozenset(tenant_minors.values())
    scopes = assign_minors(names, tenant_taken) if names else {}
    return pod_minors(capped_uids, tenant_taken | frozenset(scopes.values()))


def cgroup_entries(
    cfg: Config, inv: Inventory, by_pod: dict[str, str], minors: dict[str, int],
    pod_classes: dict[str, int] | None = None,
) -> tuple[tuple[tuple[int, int, int], ...], tuple[str, ...]]:
    """(level, cgroup id, classid) for hostNetwork pods and match.cgroups, labels for rendering.

    ``pod_classes``: uid -> minor of capped pods: a capped hostNetwork pod's cgroup maps to its own class."""
    entries: dict[tuple[int, int], tuple[int, str]] = {}
    refs = {c.path: c for c in inv.cgroups}
    pod_classes = pod_classes or {}
    for pod in inv.pods:  # a capped pod's own class first: more specific than its tenant's cgroups
        if pod.uid in pod_classes and pod.host_network and pod.cgroup is not None:
            entries.setdefault((pod.cgroup.level, pod.cgroup.id), (classid(pod_classes[pod.uid]), f"pod {pod.ref}"))
    for t in cfg.tenants:
        for path in t.match.cgroups:
            ref = refs.get(path)
            if ref is not None:
                entries.setdefault((ref.level, ref.id), (classid(minors[t.name]), path))
    for pod in inv.pods:
        tenant = by_pod.get(pod.uid)
        if tenant is not None and pod.host_network and pod.cgroup is not None:
            entries.setdefault((pod.cgroup.level, pod.cgroup.id), (classid(minors[tenant]), f"pod {pod.ref}"))
    out = tuple(sorted((lvl, cid, cls) for (lvl, cid), (cls, _) in entries.items()))
    return out, tuple(sorted(label for _, label in entries.values()))


@dataclass(frozen=True)
class Classification:
    """Who is who on an uplink, before any classifier realises it (one input for the htb and edt planners).

    ``bpf_filters``: the interface, cgroup and mark mappings as cls_bpf filters
    (empty without cls_bpf); ``src_prefixes``: (network, classid) for every
    configured source prefix and every non-hostNetwork pod address, in plan
    order (a configured prefix of the same length wins over a pod's).
    """

    bpf_filters: tuple[BpfFilter, ...] = ()
    src_prefixes: tuple[tuple[object, int], ...] = ()


def classification(
    cfg: Config, inv: Inventory, ifmap: dict[int, tuple[str, str]], minors: dict[str, int],
    by_pod: dict[str, str] | None = None, marks_by_tenant: dict[str, int] | None = None,
    pod_classes: dict[str, int] | None = None, pod_marks: dict[str, int] | None = None,
    shaped: set[str] | frozenset[str] = frozenset(),
) -> Classification:
    """``pod_classes``: uid -> class minor of each pod with an egress cap (pod_minors): its host interface
    (where no other pod shares it), cgroup, own mark (``pod_marks``: uid -> mark) and addresses map to that
    class instead of its tenant's.
    ``shaped``: the uplinks' names (a pod whose host interface is an uplink gets no interface entry)."""
    filters: list[BpfFilter] = []
    by_pod = by_pod or {}
    marks_by_tenant = marks_by_tenant or {}
    pod_classes = pod_classes or {}
    pod_marks = pod_marks or {}
    if inv.capabilities.bpf:
        by_ifindex = {idx: (classid(minors[tenant]), name) for idx, (tenant, name) in ifmap.items()}
        sharing = _pods_per_interface(inv)
        for pod in inv.pods:  # a capped pod's own host interface (routed veth): skb->ingress_ifindex
            if (pod.uid in pod_classes and not pod.host_network and pod.host_ifindex is not None
                    and pod.host_ifname not in shaped and sharing[pod.host_ifindex] == 1):
                by_ifindex[pod.host_ifindex] = (classid(pod_classes[pod.uid]), pod.host_ifname or str(pod.host_ifindex))
        mapping = tuple(sorted((idx, cls) for idx, (cls, _) in by_ifindex.items()))
        if mapping:
            filters.append(
                BpfFilter(
                    prio=PRIO_BPF_IFINDEX, name=bpf_program_name(mapping), mapping=mapping,
                    interfaces=tuple(sorted(name for _, name in by_ifindex.values())),
                )
            )
        cg_entries, cg_labels = cgroup_entries(cfg, inv, by_pod, minors, pod_classes)
        if cg_entries:
            filters.append(BpfFilter(prio=PRIO_BPF_CGROUP, name=bpf_program_name(cg_entries, "cgroup"),
                                     mapping=cg_entries, interfaces=cg_labels, kind="cgroup"))
        mark_map = tuple(sorted(
            [(marks_by_tenant[t.name], cfg.node.mark_mask, classid(minors[t.name]))
             for t in cfg.tenants if t.name in marks_by_tenant]
            + [(pod_marks[u], cfg.node.mark_mask, classid(m)) for u, m in pod_classes.items() if u in pod_marks]
        ))
        if mark_map:
            filters.append(BpfFilter(prio=PRIO_BPF_MARK, name=bpf_program_name(mark_map, "classmark"),
                                     mapping=mark_map, interfaces=tuple(f"mark 0x{v:x}" for v, _, _ in mark_map),
                                     kind="mark"))
    claimed: set = set()
    src_prefixes: list = []
    for t in cfg.tenants:
        for net in t.match.cidrs:
            src_prefixes.append((net, classid(minors[t.name])))
            claimed.add(net)
    for pod in inv.pods:
        tenant = by_pod.get(pod.uid)
        if pod.host_network or (tenant is None and pod.uid not in pod_classes):
            continue
        cls = classid(pod_classes[pod.uid]) if pod.uid in pod_classes else classid(minors[tenant])
        for ip in pod.ips:
            net = ipaddress.ip_network(ip)
            if net not in claimed:  # a configured prefix of the same length wins
                claimed.add(net)
                src_prefixes.append((net, cls))
    return Classification(tuple(filters), tuple(src_prefixes))


def _pods_per_interface(inv: Inventory) -> dict[int, int]:
    """host ifindex -> how many pods enter the node through it: an interface is a capped pod's own only
    where it carries that pod alone (else its tenant-mates' packets would land in the pod's class)."""
    out: dict[int, int] = {}
    for pod in inv.pods:
        if not pod.host_network and pod.host_ifindex is not None:
            out[pod.host_ifindex] = out.get(pod.host_ifindex, 0) + 1
    return out


def _is_source_prefix(f: U32Filter) -> bool:
    if f.mark is not None or not f.prefix:
        return False
    if f.protocol == ETH_P_IP:
        return PRIO_U32_V4_BASE <= f.prio <= PRIO_U32_V4_BASE + 32 and all(k.offset == 12 for k in f.keys)
    return PRIO_U32_V6_BASE <= f.prio <= PRIO_U32_V6_BASE + 128 and all(8 <= k.offset < 24 for k in f.keys)


def map_classifier_for(filters: list[Filter], mark_mask: int, dst_scopes=(), src_prefixes=()) -> tuple[
        mapcls.MapClassifier, list[Filter], list[str]]:
    """The classifying filters as eBPF map entries: (classifier, filters that stay, warnings)."""
    ifindex: dict[int, int] = {}
    cgroups: list[tuple[int, int, int]] = []
    marks: dict[int, int] = {}
    prefixes: dict = {}
    for net, cls in src_prefixes:  # the planner's own (network, classid) pairs: no U32Filter built
        prefixes.setdefault(net, cls)
    rest: list[Filter] = []
    for f in filters:
        if isinstance(f, BpfFilter) and f.kind == "ifindex":
            ifindex.update(dict(f.mapping))
        elif isinstance(f, BpfFilter) and f.kind == "cgroup":
            cgroups.extend(f.mapping)
        elif isinstance(f, BpfFilter) and f.kind == "mark":
            marks.update({value: cls for value, _mask, cls in f.mapping})
        elif isinstance(f, U32Filter) and _is_source_prefix(f):
            prefixes.setdefault(ipaddress.ip_network(f.prefix), f.classid)
        else:
            rest.append(f)
    mc, warnings = mapcls.build(mark_mask, ifindex, tuple(cgroups), marks, prefixes, tuple(dst_scopes))
    return mc, rest, warnings
