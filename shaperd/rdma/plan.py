"""Plan each tenant's RDMA settings, pure: its ports, service level, traffic class and NCCL environment.

Devices: the tenant's ``rdma.devices`` (an HCA, an HCA port, or a PCI
function such as an SR-IOV VF) resolved against this node's inventory, plus
the devices the kubelet's pod-resources API says the tenant's pods hold. A
configured device this node does not have is a warning for this node only.

Service level: ``rdma.serviceLevel``, else derived from the priority rank
(largest priority first): rank r gets SL r, so tenants are distinct where
there are enough data VLs, and ranks past the last data VL share it (they
are grouped, never put on VL15). Traffic class: ``rdma.trafficClass``, else
the TOS byte of the rank's DSCP (DSCP_BY_RANK) with ECT(0) set, so RoCE
congestion control (DCQCN) sees ECN marks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from shaperd.core.config import Config, RdmaDeviceRef, Tenant
from shaperd.core.inventory import Inventory, RdmaDevice, RdmaPort
from shaperd.core.tenancy import Tenancy

# Data VLs an SL can be mapped to when the fabric's VL capability is not known (VL0-7; VL15 is management).
DEFAULT_DATA_VLS = 8
# DSCPs by priority rank: AF31 (26, the usual RoCE class), CS3, AF21, CS2, AF11, CS1, then best effort.
DSCP_BY_RANK = (26, 24, 18, 16, 10, 8, 0)
ECT0 = 0b10


@dataclass(frozen=True)
class TenantRdma:
    """What one tenant gets on the RDMA path."""

    tenant: str
    ports: tuple[RdmaPort, ...]  # the ports dedicated to it on this node
    service_level: int
    traffic_class: int  # the RoCE IP TOS byte
    nccl: Mapping[str, str] = field(default_factory=dict)  # passthrough values from the tenants file
    socket_ifname: str | None = None  # NCCL_SOCKET_IFNAME where configured (match.interfaces without globs)
    sl_derived: bool = True
    tc_derived: bool = True

    @property
    def dscp(self) -> int:
        return self.traffic_class >> 2

    @property
    def roce(self) -> bool:
        return any(p.link_layer == "Ethernet" for p in self.ports)


@dataclass(frozen=True)
class RdmaPlan:
    tenants: tuple[TenantRdma, ...] = ()
    # (device, port) -> tenant, for attributing counters.
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    problems: tuple = ()
    warnings: tuple[str, ...] = ()

    def tenant(self, name: str) -> TenantRdma | None:
        return next((t for t in self.tenants if t.tenant == name), None)


def priority_ranks(tenants: tuple[Tenant, ...]) -> dict[str, int]:
    distinct = sorted({t.priority for t in tenants}, reverse=True)
    rank = {p: i for i, p in enumerate(distinct)}
    return {t.name: rank[t.priority] for t in tenants}


def derived_sl(rank: int, data_vls: int = DEFAULT_DATA_VLS) -> int:
    return min(rank, data_vls - 1)


def derived_tc(rank: int) -> int:
    return (DSCP_BY_RANK[min(rank, len(DSCP_BY_RANK) - 1)] << 2) | ECT0


def resolve(ref: RdmaDeviceRef, devices: tuple[RdmaDevice, ...]) -> tuple[RdmaPort, ...] | None:
    """The ports an rdma.devices entry names on this node, or None when the node has no such device."""
    if ref.pci:
        dev = next((d for d in devices if d.pci == ref.pci), None)
    else:
        dev = next((d for d in devices if d.name == ref.name), None)
    if dev is None:
        return None
    if ref.port is None:
        return dev.ports
    port = dev.port(ref.port)
    return (port,) if port is not None else None


def plan(cfg: Config, inv: Inventory, ten: Tenancy, data_vls: int = DEFAULT_DATA_VLS) -> RdmaPlan:
    ranks = priority_ranks(cfg.tenants)
    warnings: list[str] = list(inv.rdma_notes)
    owners: dict[tuple[str, int], str] = {}
    out = []
    pod_ports = _pod_ports(inv, ten)
    for i, t in enumerate(cfg.tenants):
        ports: list[RdmaPort] = []
        for j, ref in enumerate(t.rdma.devices):
            got = resolve(ref, inv.rdma)
            if got is None:
                warnings.append(f"tenants[{i}].rdma.devices[{j}]: {ref} does not exist on this node")
                continue
            ports.extend(got)
        ports.extend(pod_ports.get(t.name, ()))
        uniq: dict[tuple[str, int], RdmaPort] = {}
        for p in ports:
            key = (p.device, p.port)
            other = owners.get(key)
            if other is not None and other != t.name:
                warnings.append(f"{p.ref} is held by tenants {other} and {t.name}: it is attributed to neither")
                owners[key] = ""
                continue
            owners[key] = t.name
            uniq[key] = p
        sl = t.rdma.service_level if t.rdma.service_level is not None else derived_sl(ranks[t.name], data_vls)
        tc = t.rdma.traffic_class if t.rdma.traffic_class is not None else derived_tc(ranks[t.name])
        plain = [n for n in t.match.interfaces if not any(c in n for c in "*?[")]
        out.append(TenantRdma(
            tenant=t.name, ports=tuple(uniq.values()), service_level=sl, traffic_class=tc, nccl=dict(t.rdma.nccl),
            socket_ifname=",".join(plain) or None, sl_derived=t.rdma.service_level is None,
            tc_derived=t.rdma.traffic_class is None,
        ))
    clean = {k: v for k, v in owners.items() if v}
    out = [TenantRdma(**{**t.__dict__, "ports": tuple(p for p in t.ports if clean.get((p.device, p.port)) == t.tenant)})
           for t in out]
    return RdmaPlan(tenants=tuple(out), owners=clean, warnings=tuple(warnings))


def _pod_ports(inv: Inventory, ten: Tenancy) -> dict[str, list[RdmaPort]]:
    """Ports of the RDMA devices the kubelet assigned to each tenant's pods (pod-resources API)."""
    out: dict[str, list[RdmaPort]] = {}
    for pod in inv.pods:
        tenant = ten.pod_tenants.get(pod.uid)
        if tenant is None:
            continue
        for name in pod.rdma_devices:
            dev = inv.rdma_device(name)
            if dev is not None:
                out.setdefault(tenant, []).extend(dev.ports)
    return out
