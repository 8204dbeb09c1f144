"""The HTB backend's pure planner: (config, inventory, tenancy) -> the desired tree per uplink.

Owns every decision about *what* HTB should hold: class ids, HTB parameter
sizing, priority mapping, the default class, leaf queues and filters (the
shape of a tenant with destination scopes: scopes.py; with capped pods, and
how their rates are shared: pods.py). Which
devices are uplinks and which endpoints belong to which tenant is decided
once for every backend (shaperd/core/tenancy.py). No I/O, no pyroute2; the kernel
side only makes the kernel match what this returns.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

from shaperd.core.config import Config, Tenant, default_reserve_bps
from shaperd.core.errors import ConfigProblem
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.core.tenancy import Tenancy, tenancy
from shaperd.core.ids import assign_minors
from shaperd.backends.common import mapcls  # noqa: F401
from shaperd.backends.common.classify import (  # noqa: F401 - shared with edt
    ETH_HLEN, GSO_MAX_BYTES, LINK_SPEED_USABLE, Classification, cgroup_entries, checked_capacity, classification,
    map_classifier_for,
)
from shaperd.backends.htb import offload_plan
from shaperd.backends.htb.pods import PodClass, beside_default, tree_minors
from shaperd.backends.htb.scopes import scope_minors, scoped_tenant
from shaperd.backends.common.objects import (
    DEFAULT_CLASS_MINOR,
    ETH_P_IP,
    ETH_P_IPV6,
    PRIO_CHAIN_POD_V4,
    PRIO_CHAIN_POD_V6,
    ROOT_CLASS_MINOR,
    ROOT_HANDLE,
    DevicePlan,
    Filter,
    HtbClass,
    HtbRoot,
    LeafQdisc,
    DstScope,
    U32Filter,
    classid,
    src_prefix_keys,
)

# HTB has 8 priority levels (0 = served first). Tenants use 0..6 by rank of
# their priority value; 7 is kept for the default class so any tenant borrows
# spare bandwidth before traffic of no tenant does.
MAX_TENANT_PRIO = 6
DEFAULT_CLASS_PRIO = 7


@dataclass(frozen=True)
class HtbSettings:
    """How HTB parameters are sized from a class's rate. Each default says why."""

    # Token bucket depths as time at the class's rate (burst) and ceil (cburst). tc's default is
    # rate/HZ + MTU, about one frame with today's high-resolution timers: a class can then never
    # send a 64 KiB GSO packet without waiting, and a loaded link ends 5-10 % short of its ceiling.
    # The ceil bucket holds the limit: 1 ms of ceil keeps the link busy across timer slack while
    # the excess any class can take over its limit in a 1 s window stays at 0.1 %.
    cburst_us: int = 1000
    # The rate bucket holds the guarantee. A tenant whose flows pause for a few ms (a sender or
    # receiver waiting for a CPU on a busy node, one TCP flow between window updates) loses what
    # it did not send in that pause to the tenants borrowing, unless its bucket can hold it: with
    # 10 ms it catches up, as fast as its ceil bucket lets it. Eight tenants at 5 Gbit/s beside two
    # busy loops: the worst tenant got 93.4-99.9 % of its guarantee with 1 ms (5 of 18 rounds under
    # 98 %), 98.4-100.1 % with 10 ms (none of 15; BENCHMARKS.md, "Isolation at 1, 5 and 10 Gbit/s").
    # The limit is the ceil bucket's.
    burst_us: int = 10_000
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
class HtbPlan:
    """The HTB backend's desired state: one DevicePlan per shaped uplink."""

    devices: tuple[DevicePlan, ...] = ()
    # Devices that cannot be shaped as configured: skipped, the others go on.
    problems: tuple[ConfigProblem, ...] = ()
    warnings: tuple[str, ...] = ()
    # Selected devices that could not be planned: their current state is kept.
    skipped: tuple[str, ...] = ()
    # Replace a root qdisc shaperd does not own (node.takeOver or --take-over).
    take_over: bool = False
    # tenant -> number of configured source prefixes (metrics: endpoints by kind).
    tenant_cidrs: dict[str, int] = field(default_factory=dict, compare=False)
    # The pods with an egress cap and their class (the same classid on every device; pods.py).
    pods: tuple[PodClass, ...] = field(default=(), compare=False)
    # tenant -> its rest leaf, for tenants made inner by capped pods alone (status labels them).
    rests: dict[str, int] = field(default_factory=dict, compare=False)

    def device(self, name: str) -> DevicePlan | None:
        return next((d for d in self.devices if d.device == name), None)


def htb_prios(tenants: tuple[Tenant, ...]) -> dict[str, int]:
    """Tenant priority value -> HTB prio by rank: the largest value gets 0.

    Equal values share a level (and then share spare bandwidth in proportion
    to their guarantees); ranks past the seventh distinct value all map to 6.
    """
    distinct = sorted({t.priority for t in tenants}, reverse=True)
    rank = {p: min(i, MAX_TENANT_PRIO) for i, p in enumerate(distinct)}
    return {t.name: rank[t.priority] for t in tenants}


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
        cburst_bytes=max(s.min_burst_bytes, ceil_Bps * s.cburst_us // 1_000_000),
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


def plan(cfg: Config, inv: Inventory, settings: HtbSettings = HtbSettings(), ten: Tenancy | None = None,
         take_over: bool = False, offload_refused: dict[tuple[int, str], str] | None = None) -> HtbPlan:
    """The HTB tree for every selected uplink; devices that cannot be planned are skipped with a problem.

    ``offload_refused``: (ifindex, device) -> the kernel's refusal of htb offload there (offload_plan.py)."""
    ten = ten if ten is not None else tenancy(cfg, inv)
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    plans: list[DevicePlan] = []
    skipped: list[str] = []
    pods, rests = pod_classes(cfg, ten)
    for link in sorted(ten.uplinks, key=lambda l: l.name):
        if ten.dataplanes.get(link.name, "htb") != "htb":
            continue  # the edt backend plans it (tenancy.dataplanes); HTB's tree there is garbage
        dp, probs = plan_device(cfg, inv, link, ten.interfaces, settings, ten.pod_tenants, ten.marks, warnings,
                                ten=ten, pods=pods)
        problems.extend(probs)
        if dp is not None:
            plans.append(dp)
        else:
            skipped.append(link.name)
    if ten.interfaces and not inv.capabilities.bpf:
        warnings.append(
            "match.interfaces needs cls_bpf, which this kernel does not offer: interface matches are NOT enforced "
            f"({', '.join(sorted({n for n, _ in ten.interfaces.values()}))})"
        )
    if inv.pods and not inv.capabilities.bpf:
        warnings.append("cls_bpf unavailable: pods are recognised by pod address only (not after masquerade)")
    if plans:
        warnings.extend(pod_warnings(cfg, inv, ten, pods))
    out = HtbPlan(devices=tuple(plans), problems=tuple(problems), warnings=tuple(warnings), skipped=tuple(skipped),
                  take_over=take_over or cfg.node.take_over,
                  tenant_cidrs={t.name: len(t.match.cidrs) for t in cfg.tenants}, pods=pods if plans else (),
                  rests=rests if plans else {})
    return offload_plan.choose(cfg, inv, out, offload_refused or {})  # software or offload shape per uplink


def pod_classes(cfg: Config, ten: Tenancy) -> tuple[tuple[PodClass, ...], dict[str, int]]:
    """The egress-capped pods and their class ids in classid order, and the rest leaves (tenant -> classid)
    of the tenants they make inner without scopes (pods.tree_minors)."""
    capped = ten.egress_capped()
    if not capped:
        return (), {}
    minors = assign_minors([t.name for t in cfg.tenants])
    pminors, rests = tree_minors(cfg.tenants, minors, scope_minors(cfg.tenants, minors), capped)
    out = []
    for uid, c in capped.items():
        ns, _, name = c.ref.partition("/")
        out.append(PodClass(uid, ns, name, c.tenant, c.egress_bps, classid(pminors[uid])))
    return tuple(sorted(out, key=lambda p: p.classid)), {t: classid(m) for t, m in sorted(rests.items())}


def pod_warnings(cfg: Config, inv: Inventory, ten: Tenancy, pods: tuple[PodClass, ...]) -> list[str]:
    """What the plan says about capped pods: a pod with no mark of its own, a tenant whose scopes overlap."""
    out = []
    if inv.capabilities.bpf:
        host_network = {p.uid for p in inv.pods if p.host_network}  # classified by cgroup: no mark needed
        for p in pods:
            if p.uid not in ten.pod_marks and p.uid not in host_network:
                out.append(f"pod {p.ref}: no skb->mark value left under node.markMask for its own class: its cap is "
                           "enforced by its interface and addresses only (not after masquerade or encapsulation)")
    scoped = {t.name for t in cfg.tenants if t.destinations}
    for tenant in sorted({p.tenant for p in pods if p.tenant in scoped}):
        refs = ", ".join(p.ref for p in pods if p.tenant == tenant)
        out.append(f"tenant {tenant} has destination scopes: its capped pods' traffic towards a scoped destination "
                   f"goes to the scope's leaf (the scope's cap holds; the pod's own cap does not count it) ({refs})")
    return out


def plan_device(
    cfg: Config, inv: Inventory, link: Link, ifmap: dict[int, tuple[str, str]], s: HtbSettings,
    by_pod: dict[str, str] | None = None, marks_by_tenant: dict[str, int] | None = None,
    warnings_out: list[str] | None = None, ten: Tenancy | None = None, pods: tuple[PodClass, ...] = (),
) -> tuple[DevicePlan | None, list[ConfigProblem]]:
    """One uplink's tree. ``ten`` and ``pods`` (pod_classes): the capped pods' classes and their marks."""
    problems: list[ConfigProblem] = []
    warnings = warnings_out if warnings_out is not None else []

    def bad(path: str, msg: str) -> None:
        problems.append(ConfigProblem(path, f"{msg} (device {link.name})"))

    capacity = checked_capacity(cfg, link, bad)
    if capacity is None:
        return None, problems

    def make(cid, parent, rate, ceil, prio, name):
        return htb_class(s, cid, parent, rate, ceil, prio, link.mtu, name)

    root_cls = classid(ROOT_CLASS_MINOR)
    reserve = cfg.node.reserve_bps if cfg.node.reserve_bps is not None else default_reserve_bps(capacity)
    minors = assign_minors([t.name for t in cfg.tenants])
    prios = htb_prios(cfg.tenants)
    smins = scope_minors(cfg.tenants, minors)
    capped = ten.egress_capped() if ten is not None else {}
    _, rests = tree_minors(cfg.tenants, minors, smins, capped)
    lone, default_rate = beside_default([p for p in pods if p.tenant is None], reserve, capacity)
    classes = [
        htb_class(s, root_cls, ROOT_HANDLE, capacity, capacity, 0, link.mtu, None),
        htb_class(s, classid(DEFAULT_CLASS_MINOR), root_cls, default_rate, capacity, DEFAULT_CLASS_PRIO, link.mtu,
                  None),
    ]
    classes.extend(make(p.classid, root_cls, rate, ceil, DEFAULT_CLASS_PRIO, None) for p, rate, ceil in lone)
    if lone and default_rate + sum(r for _, r, _ in lone) > reserve:
        _warn(warnings, f"node.reserve {reserve} bit/s cannot give the {len(lone)} capped pods of no tenant and the "
                        "default class HTB's minimum rate each: their rates add up to more than the reserve")
    inner: set[int] = {root_cls}
    scope_filters: list[Filter] = []
    dst_scopes: list = []
    for t in sorted(cfg.tenants, key=lambda t: minors[t.name]):
        tcls = htb_class(
            s, classid(minors[t.name]), root_cls, t.guarantee_bps,
            t.limit_bps if t.limit_bps is not None else capacity, prios[t.name], link.mtu, t.name,
        )
        classes.append(tcls)
        mine = [p for p in pods if p.tenant == t.name]
        if t.destinations or mine:
            # The tenant class becomes inner: a rest leaf, one leaf per scope (scopes.py) and per capped pod (pods.py).
            kids, fl, ds = scoped_tenant(t, tcls, smins, make, pod_leaves=[(p.classid, p.cap_bps) for p in mine],
                                         rest_cid=None if t.destinations else classid(rests[t.name]))
            classes.extend(kids)
            scope_filters.extend(fl)
            dst_scopes.extend(ds)
            if mine and t.destinations and inv.capabilities.bpf_maps:
                # The map classifier resolves the scopes from the pod's class too (scopes.py).
                dst_scopes.extend(DstScope(p.classid, d.prefix, d.classid) for p in mine for d in ds)
            if mine and t.destinations and not inv.capabilities.bpf_maps:
                scope_filters.extend(_chain_pod_filters(inv, tcls.classid, mine))
            inner.add(tcls.classid)
            if sum(c.rate_bps for c in kids) > tcls.rate_bps:
                _warn(warnings, f"tenant {t.name}: its guarantee cannot give its {len(kids)} leaves (rest, scopes, "
                                "capped pods) HTB's minimum rate each: their rates add up to more than the guarantee")
    leaves = [leaf_for(s, c, inv.capabilities) for c in classes if c.classid not in inner]

    who = classification(cfg, inv, ifmap, minors, by_pod, marks_by_tenant,
                         pod_classes=_classified_as(cfg, inv, pods, minors),
                         pod_marks=ten.pod_marks if ten is not None else None,
                         shaped=ten.uplink_names if ten is not None else frozenset())
    src_prefixes = list(who.src_prefixes)
    filters: list[Filter] = list(who.bpf_filters)
    if not inv.capabilities.bpf_maps:
        filters.extend(U32Filter.for_prefix(net, cls) for net, cls in src_prefixes)
    filters.sort(key=lambda f: (f.prio, getattr(f, "protocol", 0), getattr(f, "prefix", "")))
    filters.extend(sorted(scope_filters, key=lambda f: (f.parent, f.prio, f.protocol, f.prefix)))
    dp = DevicePlan(
        device=link.name,
        ifindex=link.ifindex,
        capacity_bps=capacity,
        root=HtbRoot(),
        classes=tuple(classes),
        leaves=tuple(leaves),
        filters=tuple(filters),
        tenant_classes={t.name: classid(minors[t.name]) for t in cfg.tenants},
        dst_scopes=tuple(sorted(dst_scopes, key=lambda d: (d.tenant_classid, str(d.prefix)))),
    )
    if inv.capabilities.bpf_maps:
        # eBPF path: the same decisions as map entries; the root keeps no classifying filter.
        dp = with_map_classifier(dp, cfg.node.mark_mask, warnings, src_prefixes)
    return dp, []


def _warn(warnings: list[str], w: str) -> None:
    if w not in warnings:  # once, not once per device
        warnings.append(w)


def _classified_as(cfg: Config, inv: Inventory, pods: tuple[PodClass, ...], minors: dict[str, int]) -> dict[str, int]:
    """uid -> the minor a capped pod's interface, cgroup, mark and addresses classify it to: its own class;
    on the u32 path, a pod of a scoped tenant goes to its tenant's class, whose chain picks the pod's leaf
    after the scopes (_chain_pod_filters)."""
    scoped = {t.name for t in cfg.tenants if t.destinations}
    out = {}
    for p in pods:
        if p.tenant in scoped and not inv.capabilities.bpf_maps:
            out[p.uid] = minors[p.tenant]
        else:
            out[p.uid] = p.classid & 0xFFFF
    return out


def _chain_pod_filters(inv: Inventory, tenant_cid: int, pods: list[PodClass]) -> list[U32Filter]:
    """u32 path, a scoped tenant's chain: each capped pod's addresses to its leaf, after the scopes, before rest."""
    found = {p.uid: p for p in inv.pods if not p.host_network}
    out = []
    for p in pods:
        for ip in getattr(found.get(p.uid), "ips", ()):
            net = ipaddress.ip_network(ip)
            out.append(U32Filter(prio=PRIO_CHAIN_POD_V4 if net.version == 4 else PRIO_CHAIN_POD_V6,
                                 protocol=ETH_P_IP if net.version == 4 else ETH_P_IPV6, classid=p.classid,
                                 keys=src_prefix_keys(net), prefix=str(net), parent=tenant_cid))
    return out


def with_map_classifier(dp: DevicePlan, mark_mask: int, warnings: list[str], src_prefixes=()) -> DevicePlan:
    """The eBPF path: the classifying filters (and dst scopes) become map entries; the root keeps the rest.

    Built from the filters the u32/classic path would install, so both paths
    make exactly the same decisions (one planner, two realisations).
    """
    mc, rest, warns = map_classifier_for(list(dp.filters), mark_mask, dp.dst_scopes, src_prefixes)
    for w in warns:
        if w not in warnings:
            warnings.append(w)
    return replace(dp, filters=tuple(rest), map_classifier=mc)


