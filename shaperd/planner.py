"""The pure planner: (config, inventory) -> the desired tc state per device.

Owns every decision about *what* the kernel should hold: which devices are
shaped, class ids, HTB parameter sizing, priority mapping, the default class,
leaf queues and filters. It must not do I/O or import pyroute2; the kernel
side only makes the kernel match what this returns.

Other enforcement backends (SR-IOV VF rates, NIC traffic classes for RDMA)
plug in beside ``plan_device``: they take the same config and inventory and
return their own desired objects; nothing here needs rewriting.
"""

from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
from dataclasses import dataclass, field

from .config import Config, Tenant, check_guarantee_sum, default_reserve_bps
from .errors import ConfigProblem
from .inventory import Capabilities, Inventory, Link, Pod
from .state import (
    DEFAULT_CLASS_MINOR,
    HANDLE_MAJOR,
    PRIO_BPF_CGROUP,
    PRIO_BPF_IFINDEX,
    PRIO_BPF_MARK,
    ROOT_CLASS_MINOR,
    ROOT_HANDLE,
    TENANT_MINOR_FIRST,
    TENANT_MINOR_LAST,
    BpfFilter,
    DevicePlan,
    Filter,
    HtbClass,
    HtbRoot,
    LeafQdisc,
    MarkFilter,
    U32Filter,
    classid,
)
from .units import format_rate

# HTB has 8 priority levels (0 = served first). Tenants use 0..6 by rank of
# their priority value; 7 is kept for the default class so any tenant borrows
# spare bandwidth before traffic of no tenant does.
MAX_TENANT_PRIO = 6
DEFAULT_CLASS_PRIO = 7
# Share of a NIC's reported speed shaperd shapes to when node.capacity is not
# set. tc counts Ethernet frames without preamble, FCS and inter-frame gap (24
# bytes, 1.6 % of a 1514-byte frame); shaping at the full speed would let the
# queue form in the NIC's shared ring instead of in the tenants' classes
# (bench/isolation.py: at 100 % the bottleneck dropped; at 99 % it never did).
LINK_SPEED_USABLE = (98, 100)
# Ethernet header on top of the MTU: what one full-size frame costs HTB.
ETH_HLEN = 14
GSO_MAX_BYTES = 65536


@dataclass(frozen=True)
class HtbSettings:
    """How HTB parameters are sized from a class's rate. Each default says why."""

    # Token bucket depth as time at the class's rate. tc's default burst is
    # rate/HZ + MTU, about one frame with today's high-resolution timers: a
    # class can then never send a 64 KiB GSO packet without waiting, and a
    # loaded link ends 5-10 % short of its ceiling. 1 ms of rate keeps the
    # link busy across timer slack while the excess any class can take in a
    # 1 s window stays at 0.1 %.
    burst_us: int = 1000
    # ...but never less than two GSO super-packets, or a slow class stalls.
    min_burst_bytes: int = 2 * GSO_MAX_BYTES
    # DRR quantum of classes at the same priority, proportional to rate so
    # spare bandwidth is shared in proportion to guarantees (tc's default
    # rate/r2q is clamped to 200000 bytes, which flattens 40 vs 20 Gbit).
    quantum_us: int = 100
    # A quantum below one frame makes HTB warn and loop; above 2^31 overflows.
    max_quantum_bytes: int = 1 << 30
    # Leaf queue sized in time at the class ceiling, not in packets: pfifo's
    # 1000 x 64 KiB GSO packets is 64 MB, seconds of queue at low rates.
    leaf_queue_us: int = 5000
    min_leaf_bytes: int = 4 * GSO_MAX_BYTES


@dataclass(frozen=True)
class Plan:
    devices: tuple[DevicePlan, ...] = ()
    # Devices that cannot be shaped as configured: skipped, the others go on.
    problems: tuple[ConfigProblem, ...] = ()
    warnings: tuple[str, ...] = ()
    # Selected devices that could not be planned: their current state is kept.
    skipped: tuple[str, ...] = ()
    # Marks on host-side pod interfaces (node-wide, not per uplink).
    marks: tuple[MarkFilter, ...] = ()
    # pod uid -> tenant for pods mapped to exactly one tenant.
    pod_tenants: dict[str, str] = field(default_factory=dict, compare=False)

    def device(self, name: str) -> DevicePlan | None:
        return next((d for d in self.devices if d.device == name), None)


def assign_minors(names: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Class minor per tenant, derived from its name (stable across restarts).

    A hash of the name picks the slot; collisions are resolved by probing in
    name order, so the result depends only on the set of names. The root
    handle's major is skipped because leaf qdisc majors equal class minors.
    """
    span = TENANT_MINOR_LAST - TENANT_MINOR_FIRST + 1
    taken = {HANDLE_MAJOR}
    out: dict[str, int] = {}
    for name in sorted(names):
        h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % span
        minor = TENANT_MINOR_FIRST + h
        while minor in taken:
            minor = TENANT_MINOR_FIRST + (minor - TENANT_MINOR_FIRST + 1) % span
        taken.add(minor)
        out[name] = minor
    return out


def htb_prios(tenants: tuple[Tenant, ...]) -> dict[str, int]:
    """Tenant priority value -> HTB prio by rank: the largest value gets 0.

    Equal values share a level (and then share spare bandwidth in proportion
    to their guarantees); ranks past the seventh distinct value all map to 6.
    """
    distinct = sorted({t.priority for t in tenants}, reverse=True)
    rank = {p: min(i, MAX_TENANT_PRIO) for i, p in enumerate(distinct)}
    return {t.name: rank[t.priority] for t in tenants}


def bpf_program_name(mapping: tuple[tuple[int, ...], ...], kind: str = "") -> str:
    """Stable BPF object name (<= 15 chars) identifying a generated program's content."""
    digest = hashlib.sha256((kind + repr(sorted(mapping))).encode()).hexdigest()[:10]
    return f"shpd{kind[:1]}_{digest}"[:15]


def assign_marks(names: list[str] | tuple[str, ...], mask: int) -> dict[str, int]:
    """skb->mark value per tenant inside ``mask``, derived from the name like class minors.

    Tenants beyond the mask's capacity get no mark (the planner warns).
    """
    shift = (mask & -mask).bit_length() - 1
    span = mask >> shift  # values 1..span (0 means "no tenant")
    out: dict[str, int] = {}
    taken: set[int] = set()
    for name in sorted(names):
        if len(taken) >= span:
            break
        v = 1 + int.from_bytes(hashlib.sha256(b"mark\0" + name.encode()).digest()[:4], "big") % span
        while v in taken:
            v = 1 + v % span
        taken.add(v)
        out[name] = v << shift
    return out


def pod_tenants(cfg: Config, pods: tuple[Pod, ...]) -> tuple[dict[str, str], list[str]]:
    """pod uid -> tenant. A pod matched by two tenants goes to neither (a warning says so)."""
    out: dict[str, str] = {}
    warnings: list[str] = []
    for pod in pods:
        labels = dict(pod.labels)
        hits = [
            t.name for t in cfg.tenants
            if all(labels.get(k) == v for k, v in t.effective_pod_labels().items())
            or pod.namespace in t.match.namespaces
        ]
        if len(hits) == 1:
            out[pod.uid] = hits[0]
        elif len(hits) > 1:
            warnings.append(f"pod {pod.ref} matches tenants {', '.join(hits)}: it goes to neither (default class)")
    return out, warnings


def htb_class(
    s: HtbSettings, cid: int, parent: int, rate_bps: int, ceil_bps: int, prio: int, mtu: int, tenant: str | None
) -> HtbClass:
    frame = mtu + ETH_HLEN
    rate_Bps, ceil_Bps = rate_bps // 8, ceil_bps // 8
    return HtbClass(
        classid=cid,
        parent=parent,
        rate_bps=rate_bps,
        ceil_bps=ceil_bps,
        burst_bytes=max(s.min_burst_bytes, rate_Bps * s.burst_us // 1_000_000),
        cburst_bytes=max(s.min_burst_bytes, ceil_Bps * s.burst_us // 1_000_000),
        quantum_bytes=min(s.max_quantum_bytes, max(frame, rate_Bps * s.quantum_us // 1_000_000)),
        prio=prio,
        tenant=tenant,
    )


def leaf_for(s: HtbSettings, cls: HtbClass, caps: Capabilities) -> LeafQdisc:
    minor = cls.classid & 0xFFFF
    if "fq_codel" in caps.leaf_kinds:
        # Flow-fair with AQM; its own 5 ms target bounds the queue in time.
        return LeafQdisc(parent=cls.classid, handle=minor << 16, kind="fq_codel", limit=10240)
    limit = max(s.min_leaf_bytes, (cls.ceil_bps // 8) * s.leaf_queue_us // 1_000_000)
    return LeafQdisc(parent=cls.classid, handle=minor << 16, kind="bfifo", limit=limit)


def select_devices(cfg: Config, inv: Inventory) -> tuple[list[Link], list[str]]:
    """Devices to shape: node.interfaces (names or globs), else the default-route devices."""
    warnings: list[str] = []
    if cfg.node.interfaces:
        chosen: list[Link] = []
        for pattern in cfg.node.interfaces:
            hits = [l for l in inv.links if fnmatch.fnmatchcase(l.name, pattern) and l.name != "lo"]
            if not hits:
                warnings.append(f"node.interfaces: no device matches {pattern!r} yet; it will be shaped when it appears")
            chosen.extend(h for h in hits if h not in chosen)
        return chosen, warnings
    chosen = [l for name in inv.default_route_devices if (l := inv.link(name)) is not None]
    if not chosen:
        warnings.append("node.interfaces is not set and this node has no default route: nothing to shape")
    return list(dict.fromkeys(chosen)), warnings


def plan(cfg: Config, inv: Inventory, settings: HtbSettings = HtbSettings()) -> Plan:
    devices, warnings = select_devices(cfg, inv)
    problems: list[ConfigProblem] = []
    plans: list[DevicePlan] = []
    shaped = {d.name for d in devices}
    ifmap, ifwarn = interface_classes(cfg, inv, shaped)
    warnings.extend(ifwarn)
    by_pod, podwarn = pod_tenants(cfg, inv.pods)
    warnings.extend(podwarn)
    marks_by_tenant = assign_marks([t.name for t in cfg.tenants], cfg.node.mark_mask)
    for t in cfg.tenants:
        if t.name not in marks_by_tenant:
            warnings.append(f"tenant {t.name}: node.markMask 0x{cfg.node.mark_mask:x} has no mark value left; "
                            "its pods are recognised by address and cgroup only")
    marks = plan_marks(cfg, inv, by_pod, marks_by_tenant, shaped)
    for pod in inv.pods:
        for problem in pod.problems:
            if pod.uid in by_pod:
                warnings.append(f"pod {pod.ref} (tenant {by_pod[pod.uid]}): {problem}")
    skipped: list[str] = []
    for link in sorted(devices, key=lambda l: l.name):
        dp, probs = plan_device(cfg, inv, link, ifmap, settings, by_pod, marks_by_tenant)
        problems.extend(probs)
        if dp is not None:
            plans.append(dp)
        else:
            skipped.append(link.name)
    if ifmap and not inv.capabilities.bpf:
        warnings.append(
            "match.interfaces needs cls_bpf, which this kernel does not offer: interface matches are NOT enforced "
            f"({', '.join(sorted({n for n, _ in ifmap.values()}))})"
        )
    if inv.pods and not inv.capabilities.bpf:
        warnings.append("cls_bpf unavailable: pod traffic is recognised by pod address only (not after masquerade)")
    return Plan(
        devices=tuple(plans), problems=tuple(problems), warnings=tuple(warnings), skipped=tuple(skipped),
        marks=marks if inv.capabilities.bpf else (), pod_tenants=by_pod,
    )


def plan_marks(
    cfg: Config, inv: Inventory, by_pod: dict[str, str], marks_by_tenant: dict[str, int], shaped: set[str]
) -> tuple[MarkFilter, ...]:
    """One mark program per host-side interface that carries a tenant pod's traffic."""
    per_if: dict[int, tuple[str, str, list[str]]] = {}
    conflicts: set[int] = set()
    for pod in inv.pods:
        tenant = by_pod.get(pod.uid)
        if tenant is None or pod.host_network or pod.host_ifindex is None or pod.host_ifname in shaped:
            continue
        if tenant not in marks_by_tenant:
            continue
        have = per_if.setdefault(pod.host_ifindex, (tenant, pod.host_ifname or "", []))
        if have[0] != tenant:
            conflicts.add(pod.host_ifindex)
        have[2].append(pod.ref)
    out = []
    mask = cfg.node.mark_mask
    for idx, (tenant, ifname, pods) in sorted(per_if.items()):
        if idx in conflicts:
            continue  # two tenants' pods behind one interface: only their addresses can tell them apart
        value = marks_by_tenant[tenant]
        out.append(MarkFilter(idx, ifname, value, mask, bpf_program_name(((value, mask),), "mark"),
                              tenant, tuple(sorted(pods))))
    return tuple(out)


def cgroup_entries(
    cfg: Config, inv: Inventory, by_pod: dict[str, str], minors: dict[str, int], endpoints: dict[str, int]
) -> tuple[tuple[tuple[int, int, int], ...], tuple[str, ...]]:
    """(level, cgroup id, classid) for hostNetwork pods and match.cgroups, labels for rendering."""
    entries: dict[tuple[int, int], tuple[int, str]] = {}
    refs = {c.path: c for c in inv.cgroups}
    for t in cfg.tenants:
        for path in t.match.cgroups:
            ref = refs.get(path)
            if ref is not None:
                entries.setdefault((ref.level, ref.id), (classid(minors[t.name]), path))
                endpoints[t.name] += 1
    for pod in inv.pods:
        tenant = by_pod.get(pod.uid)
        if tenant is not None and pod.host_network and pod.cgroup is not None:
            entries.setdefault((pod.cgroup.level, pod.cgroup.id), (classid(minors[tenant]), f"pod {pod.ref}"))
    out = tuple(sorted((lvl, cid, cls) for (lvl, cid), (cls, _) in entries.items()))
    return out, tuple(sorted(label for _, label in entries.values()))


def interface_classes(cfg: Config, inv: Inventory, shaped: set[str]) -> tuple[dict[int, tuple[str, str]], list[str]]:
    """ifindex -> (tenant, interface name) for host-side interfaces named in match.interfaces."""
    out: dict[int, tuple[str, str]] = {}
    warnings: list[str] = []
    claimed: dict[int, list[str]] = {}
    for t in cfg.tenants:
        for link in inv.links:
            if link.name in shaped or link.name == "lo":
                continue
            if any(fnmatch.fnmatchcase(link.name, p) for p in t.match.interfaces):
                claimed.setdefault(link.ifindex, []).append(t.name)
                out[link.ifindex] = (t.name, link.name)
    for idx, owners in claimed.items():
        if len(owners) > 1:
            warnings.append(
                f"interface {out[idx][1]} matches tenants {', '.join(owners)}: it goes to neither (default class)"
            )
            del out[idx]
    return out, warnings


def plan_device(
    cfg: Config, inv: Inventory, link: Link, ifmap: dict[int, tuple[str, str]], s: HtbSettings,
    by_pod: dict[str, str] | None = None, marks_by_tenant: dict[str, int] | None = None,
) -> tuple[DevicePlan | None, list[ConfigProblem]]:
    problems: list[ConfigProblem] = []

    def bad(path: str, msg: str) -> None:
        problems.append(ConfigProblem(path, f"{msg} (device {link.name})"))

    capacity = cfg.node.capacity_bps
    if capacity is None and link.speed_bps:
        capacity = link.speed_bps * LINK_SPEED_USABLE[0] // LINK_SPEED_USABLE[1]
    if capacity is None:
        bad("node.capacity", f"required: the kernel reports no link speed for {link.kind or 'this'} device {link.name}")
        return None, problems
    for i, t in enumerate(cfg.tenants):
        if t.limit_bps is not None and t.limit_bps > capacity:
            bad(f"tenants[{i}].bandwidthLimit", f"limit {format_rate(t.limit_bps)} is above capacity {format_rate(capacity)}")
    check_guarantee_sum(capacity, cfg.node.reserve_bps, cfg.tenants, bad, where="capacity")
    if problems:
        return None, problems

    root_cls = classid(ROOT_CLASS_MINOR)
    reserve = cfg.node.reserve_bps if cfg.node.reserve_bps is not None else default_reserve_bps(capacity)
    minors = assign_minors([t.name for t in cfg.tenants])
    prios = htb_prios(cfg.tenants)
    classes = [
        htb_class(s, root_cls, ROOT_HANDLE, capacity, capacity, 0, link.mtu, None),
        htb_class(s, classid(DEFAULT_CLASS_MINOR), root_cls, reserve, capacity, DEFAULT_CLASS_PRIO, link.mtu, None),
    ]
    for t in sorted(cfg.tenants, key=lambda t: minors[t.name]):
        classes.append(
            htb_class(
                s, classid(minors[t.name]), root_cls, t.guarantee_bps,
                t.limit_bps if t.limit_bps is not None else capacity, prios[t.name], link.mtu, t.name,
            )
        )
    leaves = [leaf_for(s, c, inv.capabilities) for c in classes if c.classid != root_cls]

    filters: list[Filter] = []
    by_pod = by_pod or {}
    marks_by_tenant = marks_by_tenant or {}
    endpoints = {t.name: 0 for t in cfg.tenants}
    if inv.capabilities.bpf:
        mapping = tuple(sorted((idx, classid(minors[tenant])) for idx, (tenant, _) in ifmap.items()))
        if mapping:
            filters.append(
                BpfFilter(
                    prio=PRIO_BPF_IFINDEX, name=bpf_program_name(mapping), mapping=mapping,
                    interfaces=tuple(sorted(name for _, name in ifmap.values())),
                )
            )
        for tenant, _ in ifmap.values():
            endpoints[tenant] += 1
        cg_entries, cg_labels = cgroup_entries(cfg, inv, by_pod, minors, endpoints)
        if cg_entries:
            filters.append(BpfFilter(prio=PRIO_BPF_CGROUP, name=bpf_program_name(cg_entries, "cgroup"),
                                     mapping=cg_entries, interfaces=cg_labels, kind="cgroup"))
        mark_map = tuple(sorted(
            (marks_by_tenant[t.name], cfg.node.mark_mask, classid(minors[t.name]))
            for t in cfg.tenants if t.name in marks_by_tenant
        ))
        if mark_map:
            filters.append(BpfFilter(prio=PRIO_BPF_MARK, name=bpf_program_name(mark_map, "classmark"),
                                     mapping=mark_map, interfaces=tuple(f"mark 0x{v:x}" for v, _, _ in mark_map),
                                     kind="mark"))
    claimed: set = set()
    for t in cfg.tenants:
        for net in t.match.cidrs:
            filters.append(U32Filter.for_prefix(net, classid(minors[t.name])))
            claimed.add(net)
            endpoints[t.name] += 1
    for pod in inv.pods:
        tenant = by_pod.get(pod.uid)
        if tenant is None:
            continue
        if not pod.host_network:
            for ip in pod.ips:
                net = ipaddress.ip_network(ip)
                if net not in claimed:  # a configured prefix of the same length wins
                    claimed.add(net)
                    filters.append(U32Filter.for_prefix(net, classid(minors[tenant])))
        endpoints[tenant] += 1
    filters.sort(key=lambda f: (f.prio, getattr(f, "protocol", 0), getattr(f, "prefix", "")))
    return (
        DevicePlan(
            device=link.name,
            ifindex=link.ifindex,
            capacity_bps=capacity,
            root=HtbRoot(),
            classes=tuple(classes),
            leaves=tuple(leaves),
            filters=tuple(filters),
            tenant_classes={t.name: classid(minors[t.name]) for t in cfg.tenants},
            tenant_endpoints=endpoints,
        ),
        [],
    )
