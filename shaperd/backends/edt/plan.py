"""The edt backend's pure planner: (config, inventory, tenancy) -> mq + sch_fq + stamper per edt uplink.

Owns every decision about what the edt data plane holds: which uplinks
(those tenancy.dataplanes gives to edt), the root (mq with one sch_fq per TX
queue; sch_fq alone on a single-queue device), how sch_fq and the stamper's
horizon are sized for the rates, and what the rate controller is told about
each tenant (its map key = its HTB class minor, the id the map classifier
writes into skb->priority), and each capped pod's key (its own class minor,
backends/common/classify.capped_pod_minors), parent and static rate. No I/O.

Sizing (README, "EDT data plane"):

- stamper horizon H = 100 ms: a packet finding its tenant's backlog (clock
  - now) beyond H is dropped by the stamper, so H is each tenant's queue
  limit in time, and also how long packets stamped at an old rate keep
  leaving after the controller lowered it (the first QEMU runs with a 2 s
  horizon let a tenant overshoot its new rate for seconds). H covers five
  controller steps of 20 ms and a descheduled sender;
- sch_fq horizon = 1.25 x (H + one 64 KiB GSO packet at the smallest
  guaranteed rate), at most 10 s (fq's default), with horizon_drop: a
  backstop only (a slow tenant's one large packet may be stamped beyond H),
  so fq never drops what the stamper admitted;
- sch_fq flow_limit = clamp(256-byte packets the fastest tenant's limit
  sends in H, 100, 10000) and limit = clamp(256-byte packets the queue's
  share of capacity sends in H, 10000, 100000): one flow may hold what the
  stamper admitted even in small packets (sized for full frames, 64-byte
  datagrams overflowed the flow limit in the QEMU CPU run), and a queue's
  memory stays bounded (100000 packets).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shaperd.core.config import Config, default_reserve_bps
from shaperd.core.errors import ConfigProblem
from shaperd.core.inventory import Inventory, Link
from shaperd.core.tenancy import Tenancy
from shaperd.backends.common.classify import (
    GSO_MAX_BYTES, capped_pod_minors, checked_capacity, classification, map_classifier_for,
)
from shaperd.core.ids import assign_minors
from shaperd.backends.edt import controller
from shaperd.backends.edt.objects import (
    DEFAULT_KEY, FQ_MAJOR_BASE, ROOT_HANDLE, EdtDevicePlan, EdtPodKey, EdtShareSpec, FqQdisc, Stamper, stamper_name,
)

STAMPER_HORIZON_NS = 100_000_000
FQ_HORIZON_MAX_NS = 10_000_000_000
FQ_HORIZON_MARGIN = (5, 4)
FLOW_LIMIT_RANGE = (100, 10_000)
SIZING_PACKET_BYTES = 256
QUEUE_LIMIT_RANGE = (10_000, 100_000)


@dataclass(frozen=True)
class EdtPlan:
    devices: tuple[EdtDevicePlan, ...] = ()
    problems: tuple[ConfigProblem, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    # Uplinks HTB plans now: where an edt root is found there, HTB replaces it (edt only removes its stamper).
    htb_devices: tuple[str, ...] = ()
    take_over: bool = False
    tenant_keys: dict[str, int] = field(default_factory=dict, compare=False)
    # Uplinks on htb because applying edt there failed (backends/edt/refusals.py): device -> why.
    refused: dict[str, str] = field(default_factory=dict, compare=False)

    def device(self, name: str) -> EdtDevicePlan | None:
        return next((d for d in self.devices if d.device == name), None)


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def fq_horizon_ns(h_ns: int, min_rate_bps: int) -> int:
    one_gso_ns = GSO_MAX_BYTES * 8 * 1_000_000_000 // max(min_rate_bps, 1)
    return min(FQ_HORIZON_MAX_NS, (h_ns + one_gso_ns) * FQ_HORIZON_MARGIN[0] // FQ_HORIZON_MARGIN[1])


def fq_sizing(capacity_bps: int, tx_queues: int, max_limit_bps: int, h_ns: int, mtu: int,
              min_rate_bps: int) -> tuple[int, int, int]:
    """(limit, flow_limit, horizon_us) for each sch_fq (see the module docstring)."""
    frame_bits = SIZING_PACKET_BYTES * 8
    flow = _clamp(-(-max_limit_bps * h_ns // (1_000_000_000 * frame_bits)), *FLOW_LIMIT_RANGE)
    per_queue = capacity_bps // max(tx_queues, 1)
    limit = _clamp(-(-per_queue * h_ns // (1_000_000_000 * frame_bits)), *QUEUE_LIMIT_RANGE)
    return limit, flow, fq_horizon_ns(h_ns, min_rate_bps) // 1000


def plan(cfg: Config, inv: Inventory, ten: Tenancy, take_over: bool = False,
         refused: dict[str, tuple[int, str]] | None = None) -> EdtPlan:
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    devices: list[EdtDevicePlan] = []
    skipped: list[str] = []
    minors = assign_minors([t.name for t in cfg.tenants])
    capped = ten.egress_capped()
    pod_keys = capped_pod_minors(cfg, minors, capped)
    for link in sorted(ten.uplinks, key=lambda l: l.name):
        if ten.dataplanes.get(link.name) != "edt":
            continue
        dp, probs = plan_device(cfg, link, minors)
        problems.extend(probs)
        if dp is None:
            skipped.append(link.name)
        else:
            devices.append(replace(dp, map_classifier=_map_classifier(cfg, inv, link, ten, minors, pod_keys, warnings),
                                   pods=pod_plans(dp, capped, pod_keys, minors)))
    htb = tuple(sorted(l.name for l in ten.uplinks if ten.dataplanes.get(l.name, "htb") == "htb"))
    why = {l.name: refused[l.name][1] for l in ten.uplinks
           if l.name in (refused or {}) and refused[l.name][0] == l.ifindex and ten.dataplanes.get(l.name) == "htb"}
    return EdtPlan(tuple(devices), tuple(problems), tuple(warnings), tuple(skipped), htb, take_over or cfg.node.take_over,
                   {t.name: minors[t.name] for t in cfg.tenants}, why)


def _map_classifier(cfg: Config, inv: Inventory, link: Link, ten: Tenancy, minors: dict[str, int],
                    pod_keys: dict[str, int], warnings: list[str]):
    """The map classifier for this uplink (the same who-is-who as HTB's, common/classify.py), or None
    without eBPF maps. Without destination scopes: the stamper keys packets by tenant class minor, and a
    scope's class id (written into skb->priority by the scope LPM) would be no tenant's key, so the
    tenant's traffic towards a scope would leave unpaced. It is paced as the tenant's instead, and the
    operator is told the scope's own limit is not enforced there."""
    if not inv.capabilities.bpf_maps:
        return None
    who = classification(cfg, inv, ten.interfaces, minors, ten.pod_tenants, ten.marks, pod_classes=pod_keys,
                         pod_marks=ten.pod_marks, shaped=ten.uplink_names)
    mc, _rest, warns = map_classifier_for(list(who.bpf_filters), cfg.node.mark_mask, (), who.src_prefixes)
    scoped = sorted(t.name for t in cfg.tenants if t.destinations)
    if scoped:
        warns = [*warns, f"destination scopes of {', '.join(scoped)} are not enforced on {link.name} (dataplane edt): "
                 "their traffic is paced at the tenant's own rate and limit; use dataplane htb for per-destination limits"]
    for w in warns:
        if w not in warnings:
            warnings.append(w)
    return mc


def plan_device(cfg: Config, link: Link, minors: dict[str, int]) -> tuple[EdtDevicePlan | None, list[ConfigProblem]]:
    problems: list[ConfigProblem] = []

    def bad(path: str, msg: str) -> None:
        problems.append(ConfigProblem(path, f"{msg} (device {link.name}, dataplane edt)"))

    capacity = checked_capacity(cfg, link, bad)
    if capacity is None:
        return None, problems
    reserve = cfg.node.reserve_bps if cfg.node.reserve_bps is not None else default_reserve_bps(capacity)
    lowest = min((t.priority for t in cfg.tenants), default=0) - 1
    shares = [EdtShareSpec(DEFAULT_KEY, None, reserve, capacity, lowest)]
    for t in sorted(cfg.tenants, key=lambda t: minors[t.name]):
        shares.append(EdtShareSpec(minors[t.name], t.name, t.guarantee_bps,
                                   t.limit_bps if t.limit_bps is not None else capacity, t.priority))
    floors = [s.guarantee_bps for s in shares if s.guarantee_bps > 0] or [capacity]
    h = STAMPER_HORIZON_NS
    limit, flow, h_us = fq_sizing(capacity, link.tx_queues, max(s.limit_bps for s in shares), h, link.mtu,
                                  min(floors))
    if link.tx_queues > 1:
        kind = "mq"
        fqs = tuple(FqQdisc(parent=ROOT_HANDLE | q, handle=(FQ_MAJOR_BASE + q) << 16, limit_packets=limit,
                            flow_limit_packets=flow, horizon_us=h_us) for q in range(1, link.tx_queues + 1))
    else:
        kind = "fq"
        fqs = (FqQdisc(parent=0xFFFFFFFF, handle=ROOT_HANDLE, limit_packets=limit, flow_limit_packets=flow,
                       horizon_us=h_us),)
    return EdtDevicePlan(
        device=link.name, ifindex=link.ifindex, capacity_bps=capacity, tx_queues=link.tx_queues, root_kind=kind,
        fqs=fqs, stamper=Stamper(stamper_name(h), h), shares=tuple(shares),
        tenant_keys={t.name: minors[t.name] for t in cfg.tenants},
    ), []


def pod_plans(dp: EdtDevicePlan, capped, pod_keys: dict[str, int], minors: dict[str, int]) -> tuple[EdtPodKey, ...]:
    """Each egress-capped pod's key on ``dp``: its parent is its tenant's key (the default key for a pod of no
    tenant) and its rate min(cap, the tenant's limit on this device, the capacity), in the stamper's unit as
    the controller converts (``ns_per_byte_q16``). Static: the backend writes it, the controller never does."""
    limits = {s.key: s.limit_bps for s in dp.shares}
    out = []
    for uid, cap in capped.items():
        parent = minors[cap.tenant] if cap.tenant is not None else DEFAULT_KEY
        rate = min(cap.egress_bps, limits.get(parent, dp.capacity_bps), dp.capacity_bps)
        out.append(EdtPodKey(pod_keys[uid], parent, rate, controller.ns_per_byte_q16(rate), uid=uid, ref=cap.ref,
                             tenant=cap.tenant, cap_bps=cap.egress_bps))
    return tuple(sorted(out, key=lambda p: p.key))


def controller_shares(dp: EdtDevicePlan) -> list[controller.Share]:
    """The controller's tenants on ``dp``: the shares only; a capped pod's key is never one (its rate is static)."""
    return [controller.Share(s.key, s.guarantee_bps, s.limit_bps, s.priority) for s in dp.shares]


def initial_q16(dp: EdtDevicePlan) -> tuple[tuple[int, int], ...]:
    """The first rates (before the controller's first step): everyone may take everything, by priority; each
    capped pod's key its static rate."""
    shares = controller_shares(dp)
    alloc = controller.allocate(dp.capacity_bps, shares, {s.key: s.limit_bps for s in shares})
    first = {k: controller.ns_per_byte_q16(r) for k, r in controller.rates(shares, alloc).items()}
    first.update({p.key: p.ns_per_byte_q16 for p in dp.pods})
    return tuple(sorted(first.items()))


def initial_parents(dp: EdtDevicePlan) -> tuple[tuple[int, int], ...]:
    """pod key -> parent key of each capped pod, for a fresh stamper's maps."""
    return tuple((p.key, p.parent) for p in dp.pods)
