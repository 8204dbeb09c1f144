"""The tenants file's model: what a validated ``traffic-shaping.yaml`` means, as frozen dataclasses.

Owns the normalised config (node, tenants, match, rdma, destinations) and the rules the planner
shares with validation (the default reserve, the guarantee sum). Pure: no I/O, no YAML.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Mapping

from shaperd.core.units import format_rate

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

CONFIGMAP_KEY = "traffic-shaping.yaml"
# The label the source design puts on tenant pods.
DEFAULT_POD_LABEL = "training-tenant"
# Kubernetes label-value syntax, so a tenant name can be used as a label value.
NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
IFNAME_GLOB_RE = re.compile(r"^[A-Za-z0-9_.:@*?\[\]-]{1,15}$")


@dataclass(frozen=True)
class Match:
    """How a tenant's packets are recognised on the uplink."""

    cidrs: tuple[IPNetwork, ...] = ()
    # Host-side interface names or globs ("cali*"): traffic that entered the node there.
    interfaces: tuple[str, ...] = ()
    # Kubernetes and bare-metal selectors, used by discovery (None = default label).
    pod_labels: Mapping[str, str] | None = None
    namespaces: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()
    # Volcano queues: a pod in one of them (through its PodGroup) is this tenant's.
    volcano_queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class Destination:
    """A destination scope (``tenants[].destinations[]``): the tenant's traffic towards ``cidrs`` has its own cap.

    The scope's limit caps that traffic; the tenant's other traffic keeps the
    tenant's own limit, and the tenant's limit caps both together.
    """

    cidrs: tuple[IPNetwork, ...]
    limit_bps: int
    # Where it came from: "tenants file" or "CiliumNetworkPolicy <ns>/<name>" (check-config, logs).
    origin: str = field(default="tenants file", compare=False)


@dataclass(frozen=True)
class RdmaDeviceRef:
    """One entry of ``rdma.devices``: an HCA with an optional port ("mlx5_0:1"), or a PCI function."""

    name: str | None = None  # RDMA device name (mlx5_0), when given by name
    port: int | None = None  # None: every port of the device
    pci: str | None = None  # "0000:3b:00.2", when given by PCI address

    def __str__(self) -> str:
        if self.pci:
            return self.pci
        return f"{self.name}:{self.port}" if self.port is not None else str(self.name)


@dataclass(frozen=True)
class Rdma:
    """A tenant's RDMA settings (``tenants[].rdma``). None fields: derived from the priority rank."""

    devices: tuple[RdmaDeviceRef, ...] = ()
    service_level: int | None = None  # InfiniBand SL 0-14 (15 is the management VL's)
    traffic_class: int | None = None  # RoCE IP TOS byte, DSCP << 2
    nccl: Mapping[str, str] = field(default_factory=dict)  # passed through to the tenant's NCCL environment


@dataclass(frozen=True)
class Ingress:
    """A tenant's inbound share (``tenants[].ingress``): what arrives over the shaped uplinks towards its
    pods and addresses, shaped on an IFB device fed from the uplink's ingress (backends/ingress/).

    None fields: no guarantee (the tenant takes what is left over, at the lowest rate HTB allows), or no
    limit (it may take the whole capacity). Shaping at the receiver only works where the sender backs off
    (TCP); docs/configuration.md says what it cannot promise.
    """

    guarantee_bps: int | None = None
    limit_bps: int | None = None


@dataclass(frozen=True)
class Tenant:
    name: str
    guarantee_bps: int
    # None: may borrow up to the device's capacity.
    limit_bps: int | None
    # Larger is more important (source design: 100 over 50).
    priority: int
    match: Match = field(default_factory=Match)
    rdma: Rdma = field(default_factory=Rdma)
    destinations: tuple[Destination, ...] = ()
    # "volcanoQueue": the priority follows the weight of the tenant's Volcano queue (when known).
    priority_from: str | None = None
    # Inbound shaping (tenants[].ingress); None: its inbound traffic is not shaped (the IFB's default class).
    ingress: Ingress | None = None

    def effective_pod_labels(self) -> Mapping[str, str]:
        return self.match.pod_labels if self.match.pod_labels is not None else {DEFAULT_POD_LABEL: self.name}


@dataclass(frozen=True)
class Node:
    # Names or globs of devices to shape; empty = the device of the default route.
    interfaces: tuple[str, ...] = ()
    # None = the link speed the kernel reports (required where none is, e.g. veth).
    capacity_bps: int | None = None
    # Guaranteed to traffic of no tenant (kubelet, DNS, ssh). None = the default,
    # 1 % of capacity (default_reserve_bps below).
    reserve_bps: int | None = None
    # Replace a root qdisc shaperd does not own (anything but a kernel default).
    take_over: bool = False
    # skb->mark bits shaperd may write on pod traffic (contiguous). The default,
    # the low 7 bits, avoids the bits kube-proxy (0xc000), Calico (0xffff0000),
    # Cilium (0x0f00 and the upper half) and the AWS VPC CNI (0x80) use.
    mark_mask: int = 0x7F
    # Which data plane enforces the uplinks: "htb", "edt" (mq + sch_fq + the
    # EDT stamper, shaperd/backends/edt/) or "auto" (shaperd/core/dataplane.py).
    dataplane: str = "htb"
    # HTB offload (``htb offload``, mlx5): "auto" (where the device probe says it can and the plan
    # can be expressed), "on" (try wherever the plan can be expressed; the kernel decides), "off".
    htb_offload: str = "auto"


DATAPLANES = ("htb", "edt", "auto")
HTB_OFFLOAD_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Config:
    node: Node
    tenants: tuple[Tenant, ...]
    source: str = "<memory>"
    # Documents of a multi-document file that shaperd does not use, one line each (shaperd/core/config/manifests.py).
    ignored: tuple[str, ...] = ()

    def tenant(self, name: str) -> Tenant:
        return next(t for t in self.tenants if t.name == name)



# A default class that is never starved: unless the operator sets node.reserve,
# 1 % of capacity is kept for traffic of no tenant (kubelet, DNS, ssh).
DEFAULT_RESERVE_FRACTION = (1, 100)


def default_reserve_bps(capacity_bps: int) -> int:
    num, den = DEFAULT_RESERVE_FRACTION
    return max(1, capacity_bps * num // den)


def check_guarantee_sum(capacity_bps: int, reserve_bps: int | None, tenants, bad, where: str) -> None:
    """Σ guarantees + reserve must fit in capacity; shared by config and planner."""
    reserve = reserve_bps if reserve_bps is not None else default_reserve_bps(capacity_bps)
    total = sum(t.guarantee_bps for t in tenants)
    if total + reserve > capacity_bps:
        how = "node.reserve" if reserve_bps is not None else "the default reserve (1 % of capacity)"
        bad(
            "tenants",
            f"the sum of guarantees {format_rate(total)} plus {how} {format_rate(reserve)} is above "
            f"{where} {format_rate(capacity_bps)}; expected at most the capacity",
        )


def check_ingress_sum(capacity_bps: int, reserve_bps: int | None, tenants, bad, where: str) -> None:
    """Σ ingress guarantees + reserve must fit in capacity, as on egress (the same reserve is kept inbound)."""
    reserve = reserve_bps if reserve_bps is not None else default_reserve_bps(capacity_bps)
    total = sum(t.ingress.guarantee_bps or 0 for t in tenants if t.ingress is not None)
    if total and total + reserve > capacity_bps:
        how = "node.reserve" if reserve_bps is not None else "the default reserve (1 % of capacity)"
        bad(
            "tenants[].ingress.bandwidthGuarantee",
            f"the sum of ingress guarantees {format_rate(total)} plus {how} {format_rate(reserve)} is above "
            f"{where} {format_rate(capacity_bps)}; expected at most the capacity",
        )

