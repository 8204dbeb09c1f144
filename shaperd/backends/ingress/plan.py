"""The tenant-ingress planner, pure: (config, inventory, tenancy) -> an IFB and its HTB tree per shaped uplink.

Only where a tenant has an ``ingress`` block; then on every shaped uplink (Tenancy.uplinks, either data
plane). Per uplink:

- admission: a capacity is known (node.capacity, else the usable share of the link speed, as on egress),
  no ingress limit is above it, and the ingress guarantees plus the reserve fit in it
  (config.check_ingress_sum); otherwise a problem naming the field, and the uplink keeps what it has;
- the tree: root 7369:1 at the capacity; per tenant with an ingress block a class at its own minor
  (rate = its ingress guarantee, or HTB's least rate, MIN_RATE_BPS, when it has none; ceil = its
  ingress limit, or the capacity), prio by the rank of its priority as on egress; the default class
  7369:2 for everything else (rate = capacity minus the ingress guarantees, at least the reserve;
  ceil = capacity; the lowest prio, so tenants borrow first); a leaf queue under every leaf class;
- classification on the destination: each such tenant's match.cidrs and the addresses of its pods
  (Tenancy.pod_tenants, not hostNetwork: those share the node's address) -> its class, longest prefix
  first, a configured prefix winning over a pod address of the same length. The eBPF map classifier's
  destination-keyed variant where the kernel has eBPF maps, else u32 destination filters.

HTB sizing follows the htb backend's (burst 1 ms of rate, at least two GSO packets; quantum 100 us of
rate; leaf queues 5 ms at the ceiling), restated here because no backend imports another.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from shaperd.backends.common.mapcls import build_dst
from shaperd.backends.common.objects import (
    ETH_P_IP, ETH_P_IPV6, HtbClass, LeafQdisc, U32Filter, dst_prefix_keys, prefix_prio,
)
from shaperd.backends.ingress.objects import (
    INGRESS_DEFAULT_CLASS, INGRESS_MAJOR, INGRESS_ROOT, INGRESS_ROOT_CLASS, IfbPlan, IngressPlan, TenantIngress,
    ingress_classid, ingress_root,
)
from shaperd.core.config import Config, Tenant, check_ingress_sum, default_reserve_bps
from shaperd.core.errors import ConfigProblem
from shaperd.core.ids import assign_minors, ifb_name, is_ifb_name
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.core.tenancy import LINK_SPEED_USABLE, Tenancy
from shaperd.core.units import format_rate

ETH_HLEN = 14
GSO_MAX_BYTES = 65536
# HTB needs a rate above 0. 8 kbit/s is the least whose burst (two GSO packets, 128 KiB) still fits in
# HTB's 32-bit buffer of psched ticks (128 KiB at 8 kbit/s is 2.1e9 ticks of 64 ns).
MIN_RATE_BPS = 8_000
MAX_TENANT_PRIO = 6
DEFAULT_CLASS_PRIO = 7


@dataclass(frozen=True)
class IngressSettings:
    """HTB sizing on the IFB: the htb backend's defaults (its HtbSettings says why each is what it is)."""

    burst_us: int = 1000
    min_burst_bytes: int = 2 * GSO_MAX_BYTES
    quantum_us: int = 100
    max_quantum_bytes: int = 1 << 30
    leaf_queue_us: int = 5000
    min_leaf_bytes: int = 4 * GSO_MAX_BYTES


def wanted(cfg: Config) -> bool:
    """Whether the tenants file asks for tenant ingress at all."""
    return any(t.ingress is not None for t in cfg.tenants)


def ingress_minors(cfg: Config) -> dict[str, int]:
    """Every tenant's class minor on the IFB: its egress minor (from all tenant names, as htb derives them),
    with the IFB's own handle major kept free (a leaf qdisc's major is its class's minor)."""
    return assign_minors([t.name for t in cfg.tenants], frozenset({INGRESS_MAJOR}))


def prios(tenants: tuple[Tenant, ...]) -> dict[str, int]:
    """Tenant priority value -> HTB prio by rank (the largest value 0), as the htb backend ranks them."""
    distinct = sorted({t.priority for t in tenants}, reverse=True)
    rank = {p: min(i, MAX_TENANT_PRIO) for i, p in enumerate(distinct)}
    return {t.name: rank[t.priority] for t in tenants}


def htb_class(s: IngressSettings, cid: int, parent: int, rate_bps: int, ceil_bps: int, prio: int, mtu: int,
              tenant: str | None) -> HtbClass:
    frame = mtu + ETH_HLEN
    return HtbClass(
        classid=cid, parent=parent, rate_bps=rate_bps, ceil_bps=ceil_bps,
        burst_bytes=max(s.min_burst_bytes, rate_bps // 8 * s.burst_us // 1_000_000),
        cburst_bytes=max(s.min_burst_bytes, ceil_bps // 8 * s.burst_us // 1_000_000),
        quantum_bytes=min(s.max_quantum_bytes, max(frame, rate_bps // 8 * s.quantum_us // 1_000_000)),
        prio=prio, tenant=tenant,
    )


def leaf_for(s: IngressSettings, cls: HtbClass, caps: Capabilities) -> LeafQdisc:
    minor = cls.classid & 0xFFFF
    if "fq_codel" in caps.leaf_kinds:
        return LeafQdisc(parent=cls.classid, handle=minor << 16, kind="fq_codel", limit=10240)
    limit = max(s.min_leaf_bytes, (cls.ceil_bps // 8) * s.leaf_queue_us // 1_000_000)
    return LeafQdisc(parent=cls.classid, handle=minor << 16, kind="bfifo", limit=limit)


def destinations(cfg: Config, inv: Inventory, ten: Tenancy, classes: dict[str, int]) -> dict:
    """Destination network -> classid for the tenants with an ingress block (``classes``: tenant -> classid):
    their configured prefixes first (a pod address of the same prefix does not replace one), then their
    pods' addresses (hostNetwork pods have none of their own)."""
    out: dict = {}
    for t in cfg.tenants:
        if t.name in classes:
            for net in t.match.cidrs:
                out.setdefault(net, classes[t.name])
    for pod in inv.pods:
        tenant = ten.pod_tenants.get(pod.uid)
        if tenant not in classes or pod.host_network:
            continue
        for ip in pod.ips:
            out.setdefault(ipaddress.ip_network(ip), classes[tenant])
    return out


def capacity_of(cfg: Config, link: Link, bad) -> int | None:
    """The capacity shaped inbound on ``link`` (node.capacity, else the usable share of its speed), with the
    admission checks; None, after ``bad(path, message)`` calls, when one fails."""
    failed: list[str] = []

    def note(path: str, msg: str) -> None:
        failed.append(path)
        bad(path, msg)

    capacity = cfg.node.capacity_bps
    if capacity is None and link.speed_bps:
        capacity = link.speed_bps * LINK_SPEED_USABLE[0] // LINK_SPEED_USABLE[1]
    if capacity is None:
        note("node.capacity", f"required: the kernel reports no link speed for {link.kind or 'this'} device "
             f"{link.name}")
        return None
    for i, t in enumerate(cfg.tenants):
        if t.ingress is not None and t.ingress.limit_bps is not None and t.ingress.limit_bps > capacity:
            note(f"tenants[{i}].ingress.bandwidthLimit",
                 f"limit {format_rate(t.ingress.limit_bps)} is above capacity {format_rate(capacity)}")
    check_ingress_sum(capacity, cfg.node.reserve_bps, cfg.tenants, note, where="capacity")
    return None if failed else capacity


def plan(cfg: Config, inv: Inventory, ten: Tenancy, settings: IngressSettings = IngressSettings()) -> IngressPlan:
    """An IFB and its tree for every shaped uplink, when a tenant has an ingress block; uplinks that fail
    admission are skipped with a problem (and keep what they have)."""
    if not wanted(cfg):
        return IngressPlan()
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    plans: list[IfbPlan] = []
    skipped: list[str] = []
    for link in sorted(ten.uplinks, key=lambda l: l.name):
        if link.kind == "ifb" and is_ifb_name(link.name):
            continue  # never an uplink (tenancy.select_devices): said here should one come through anyway

        def bad(path: str, msg: str, dev: str = link.name) -> None:
            problems.append(ConfigProblem(path, f"{msg} (device {dev}, ingress)"))

        capacity = capacity_of(cfg, link, bad)
        if capacity is None:
            skipped.append(link.name)
            continue
        plans.append(plan_uplink(cfg, inv, ten, link, capacity, settings))
    shaped = {t.name for t in cfg.tenants if t.ingress is not None}
    host = sorted(p.ref for p in inv.pods if p.host_network and ten.pod_tenants.get(p.uid) in shaped)
    if host and plans:
        warnings.append(f"tenant ingress: hostNetwork pods share the node's address, so what they receive is in the "
                        f"IFB's default class, not their tenant's ({', '.join(host)})")
    return IngressPlan(devices=tuple(plans), problems=tuple(problems), warnings=tuple(warnings),
                       skipped=tuple(skipped))


def plan_uplink(cfg: Config, inv: Inventory, ten: Tenancy, link: Link, capacity: int,
                s: IngressSettings) -> IfbPlan:
    reserve = cfg.node.reserve_bps if cfg.node.reserve_bps is not None else default_reserve_bps(capacity)
    minors = ingress_minors(cfg)
    ranks = prios(cfg.tenants)
    shaped = sorted((t for t in cfg.tenants if t.ingress is not None), key=lambda t: minors[t.name])
    guarantees = sum(t.ingress.guarantee_bps or 0 for t in shaped)
    classes = [
        htb_class(s, INGRESS_ROOT_CLASS, INGRESS_ROOT, capacity, capacity, 0, link.mtu, None),
        htb_class(s, INGRESS_DEFAULT_CLASS, INGRESS_ROOT_CLASS, max(reserve, capacity - guarantees), capacity,
                  DEFAULT_CLASS_PRIO, link.mtu, None),
    ]
    by_tenant: dict[str, int] = {}
    for t in shaped:
        cid = ingress_classid(minors[t.name])
        by_tenant[t.name] = cid
        classes.append(htb_class(s, cid, INGRESS_ROOT_CLASS, t.ingress.guarantee_bps or MIN_RATE_BPS,
                                 t.ingress.limit_bps or capacity, ranks[t.name], link.mtu, t.name))
    leaves = tuple(leaf_for(s, c, inv.capabilities) for c in classes if c.classid != INGRESS_ROOT_CLASS)
    dests = destinations(cfg, inv, ten, by_tenant)
    counts = {cid: 0 for cid in by_tenant.values()}
    for cid in dests.values():
        counts[cid] += 1
    tenants = tuple(TenantIngress(t.name, by_tenant[t.name], t.ingress.guarantee_bps, t.ingress.limit_bps,
                                  counts[by_tenant[t.name]]) for t in shaped)
    filters: tuple[U32Filter, ...] = ()
    mc = None
    if inv.capabilities.bpf_maps:
        mc = build_dst(dests)
    else:
        filters = tuple(sorted((dst_filter(net, cid) for net, cid in dests.items()),
                               key=lambda f: (f.prio, f.protocol, f.prefix)))
    return IfbPlan(uplink=link.name, uplink_ifindex=link.ifindex, ifb=ifb_name(link.name), capacity_bps=capacity,
                   root=ingress_root(), classes=tuple(classes), leaves=leaves, filters=filters, map_classifier=mc,
                   tenants=tenants)


def dst_filter(net, cid: int) -> U32Filter:
    """The u32 path: packets towards ``net`` to class ``cid``, on the IFB's root, longest prefix first."""
    return U32Filter(prio=prefix_prio(net), protocol=ETH_P_IP if net.version == 4 else ETH_P_IPV6, classid=cid,
                     keys=dst_prefix_keys(net), prefix=f"dst {net}", parent=INGRESS_ROOT)
