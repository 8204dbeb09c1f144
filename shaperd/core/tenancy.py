"""Who is who on this node: the uplinks to shape, and which tenant each endpoint belongs to.

The part of planning every backend shares: the devices selected by
``node.interfaces`` (else the default-route devices), host interfaces named
by ``match.interfaces``, each pod's tenant (by labels or namespace), and each
tenant's skb->mark value. Computed once per reconcile, with its warnings, and
handed to every backend's plan. Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from shaperd.core.dataplane import select as select_dataplanes
from shaperd.core.ids import assign_marks, is_ifb_name
from shaperd.core.config import Config
from shaperd.core.inventory import Inventory, Link, Pod
from shaperd.core.podcaps import InvalidAnnotation, PodCap, pod_caps

# Share of a NIC's reported speed shaped when node.capacity is not set (backends/common/classify.py says why).
LINK_SPEED_USABLE = (98, 100)


@dataclass(frozen=True)
class Tenancy:
    # Devices to shape, as selected (before any per-device check).
    uplinks: tuple[Link, ...] = ()
    # ifindex -> (tenant, interface name): host-side interfaces named in match.interfaces.
    interfaces: dict[int, tuple[str, str]] = field(default_factory=dict)
    # pod uid -> tenant, for pods mapped to exactly one tenant.
    pod_tenants: dict[str, str] = field(default_factory=dict)
    # tenant -> skb->mark value inside node.markMask (tenants beyond its capacity are absent).
    marks: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # uplink name -> "htb" | "edt": which backend plans it (backends/edt/select.py; absent = htb).
    dataplanes: dict[str, str] = field(default_factory=dict)
    # pod uid -> its per-pod caps (kubernetes.io/{egress,ingress}-bandwidth, core/podcaps.py); only capped pods.
    pod_caps: dict[str, PodCap] = field(default_factory=dict)
    # Annotation values refused, one entry per pod, key and value (logged once by the engine, and counted).
    invalid_annotations: tuple[InvalidAnnotation, ...] = ()
    # pod uid -> skb->mark value of its own, for pods with an egress cap (so a mark classifies them to their
    # own class, not their tenant's); pods the mask has no value left for are classified without a mark.
    pod_marks: dict[str, int] = field(default_factory=dict)

    def egress_capped(self) -> dict[str, PodCap]:
        """uid -> PodCap of the pods with an egress cap."""
        return {u: c for u, c in self.pod_caps.items() if c.egress_bps is not None}

    @property
    def uplink_names(self) -> set[str]:
        return {l.name for l in self.uplinks}


def tenancy(cfg: Config, inv: Inventory, refused: dict | None = None) -> Tenancy:
    """``refused``: backend name -> {device: (ifindex, reason)} its apply found the kernel refuses (PlanInput.refused)."""
    devices, warnings = select_devices(cfg, inv)
    shaped = {d.name for d in devices}
    ifmap, ifwarn = interface_classes(cfg, inv, shaped)
    warnings.extend(ifwarn)
    by_pod, podwarn = pod_tenants(cfg, inv.pods)
    warnings.extend(podwarn)
    marks = assign_marks([t.name for t in cfg.tenants], cfg.node.mark_mask)
    for t in cfg.tenants:
        if t.name not in marks:
            warnings.append(f"tenant {t.name}: node.markMask 0x{cfg.node.mark_mask:x} has no mark value left; "
                            "its pods are recognised by address and cgroup only")
    for pod in inv.pods:
        for problem in pod.problems:
            if pod.uid in by_pod:
                warnings.append(f"pod {pod.ref} (tenant {by_pod[pod.uid]}): {problem}")
    planes, planewarn = select_dataplanes(cfg, devices, inv.capabilities, (refused or {}).get("edt"))
    warnings.extend(planewarn)
    caps, invalid = pod_caps(inv.pods, by_pod, shaped_capacity_bps(cfg, devices))
    pod_marks = assign_marks([u for u, c in caps.items() if c.egress_bps is not None], cfg.node.mark_mask,
                             frozenset(marks.values()), salt=b"podmark\0")
    return Tenancy(uplinks=tuple(devices), interfaces=ifmap, pod_tenants=by_pod, marks=marks,
                   warnings=tuple(warnings), dataplanes=planes, pod_caps=caps, invalid_annotations=invalid,
                   pod_marks=pod_marks)


def shaped_capacity_bps(cfg: Config, devices: list[Link]) -> int | None:
    """The largest capacity shaped on this node's uplinks (node.capacity, else the usable share of the
    fastest uplink's speed): no per-pod cap can be above it. None where no capacity is known yet."""
    if cfg.node.capacity_bps is not None:
        return cfg.node.capacity_bps
    speeds = [l.speed_bps for l in devices if l.speed_bps]
    return max(speeds) * LINK_SPEED_USABLE[0] // LINK_SPEED_USABLE[1] if speeds else None


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
            or (pod.volcano_queue is not None and pod.volcano_queue in t.match.volcano_queues)
        ]
        if len(hits) == 1:
            out[pod.uid] = hits[0]
        elif len(hits) > 1:
            warnings.append(f"pod {pod.ref} matches tenants {', '.join(hits)}: it goes to neither (default class)")
    return out, warnings


def select_devices(cfg: Config, inv: Inventory) -> tuple[list[Link], list[str]]:
    """Devices to shape: node.interfaces (names or globs), else the default-route devices.

    Never shaperd's own tenant-ingress IFBs (a glob such as '*' would match them): they are fed from an uplink
    and shaped by the ingress backend, not uplinks themselves."""
    warnings: list[str] = []
    if cfg.node.interfaces:
        chosen: list[Link] = []
        for pattern in cfg.node.interfaces:
            hits = [l for l in inv.links if fnmatch.fnmatchcase(l.name, pattern) and l.name != "lo"
                    and not (l.kind == "ifb" and is_ifb_name(l.name))]
            if not hits:
                warnings.append(f"node.interfaces: no device matches {pattern!r} yet; it will be shaped when it appears")
            chosen.extend(h for h in hits if h not in chosen)
        return chosen, warnings
    chosen = [l for name in inv.default_route_devices if (l := inv.link(name)) is not None]
    if not chosen:
        warnings.append("node.interfaces is not set and this node has no default route: nothing to shape")
    return list(dict.fromkeys(chosen)), warnings


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
