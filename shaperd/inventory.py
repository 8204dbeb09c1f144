"""What is on the node, as plain data: the planners' second input.

Discovery fills these in (links from netlink, speeds from sysfs, probed
kernel capabilities); tests build them by hand. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Link:
    name: str
    ifindex: int
    kind: str = ""  # rtnetlink IFLA_INFO_KIND: "veth", "bridge", "" for physical NICs
    speed_bps: int | None = None  # what the kernel reports; None where it reports none
    mtu: int = 1500
    up: bool = True


@dataclass(frozen=True)
class Capabilities:
    """What this kernel can do, probed once at start."""

    htb: bool = True
    u32: bool = True
    bpf: bool = False
    # Leaf qdisc kinds available, in order of preference among those we use.
    leaf_kinds: frozenset[str] = frozenset({"bfifo"})
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CgroupRef:
    """A cgroup v2 directory: its id (inode) and depth below the cgroup2 root."""

    path: str
    level: int
    id: int


@dataclass(frozen=True)
class Pod:
    """A pod on this node, as discovery found it (API facts plus resolved kernel handles)."""

    uid: str
    namespace: str
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    ips: tuple[str, ...] = ()
    host_network: bool = False
    # Where its traffic enters the node (routed veth, or bridge port); None if not found (yet).
    host_ifindex: int | None = None
    host_ifname: str | None = None
    # hostNetwork pods: the pod cgroup (cgroup v2).
    cgroup: CgroupRef | None = None
    # Why something could not be resolved (logged and retried on the next resync).
    problems: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Inventory:
    links: tuple[Link, ...] = ()
    # Devices that carry a default route (IPv4 or IPv6), in route order.
    default_route_devices: tuple[str, ...] = ()
    capabilities: Capabilities = field(default_factory=Capabilities)
    # Kubernetes pods on this node (empty without Kubernetes discovery).
    pods: tuple[Pod, ...] = ()
    # match.cgroups of the tenants file, resolved: path -> CgroupRef (missing ones absent).
    cgroups: tuple[CgroupRef, ...] = ()

    def link(self, name: str) -> Link | None:
        return next((l for l in self.links if l.name == name), None)
