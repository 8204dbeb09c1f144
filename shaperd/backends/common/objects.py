"""The tc object model the tc backends share, as plain data: root qdisc, classes, leaf queues, filters.

Desired state (from the planner) and observed state (from the kernel reader)
are described with the same types, so the diff compares like with like, field
by field, in the units the kernel stores (bytes per second, psched ticks).
Pure: no I/O, no pyroute2.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import NamedTuple

from shaperd.core import units

# The handle major and the tenant minor range are identity (core/ids.py): the config's limits need them too.
from shaperd.core.ids import HANDLE_MAJOR, TENANT_MINOR_FIRST, TENANT_MINOR_LAST  # noqa: E402,F401

ROOT_HANDLE = HANDLE_MAJOR << 16
ROOT_CLASS_MINOR = 0x1
DEFAULT_CLASS_MINOR = 0x2

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ALL = 0x0003

# Filter priorities (lower runs first). Interface matches are the most
# specific statement about a packet, then source prefixes, longest first.
PRIO_BPF_IFINDEX = 10
PRIO_BPF_CGROUP = 11
PRIO_BPF_MARK = 20
PRIO_U32_V4_BASE = 1000  # + (32 - prefix length)
PRIO_U32_V6_BASE = 2000  # + (128 - prefix length)
# Under a tenant class with destination scopes (its own filter chain, which
# HTB runs for every packet classified to that inner class): destination
# prefixes, longest first, then a catch-all to the tenant's "rest" leaf. Kept
# apart from the root's prios: u32's dump of one chain lists every hash table
# of the same prio in the qdisc (see observe.py).
PRIO_SCOPE_V4_BASE = 3000  # + (32 - prefix length)
PRIO_SCOPE_V6_BASE = 3200  # + (128 - prefix length)
PRIO_SCOPE_REST = 3400
# In the same chain, after the scopes and before "rest" (u32 path only): a capped pod's own addresses
# (host prefixes, so one prio per family) to its leaf (backends/htb/pods.py).
PRIO_CHAIN_POD_V4 = 3340
PRIO_CHAIN_POD_V6 = 3341
# Filters at or above this prio sit in an inner class's chain, below it in the root's (backends/htb/observe.py).
PRIO_CHAIN_FIRST = PRIO_SCOPE_V4_BASE

# Root qdiscs the kernel or the distribution installs by default: shaperd may
# replace these. Anything else belongs to someone and is left alone.
DEFAULT_ROOT_KINDS = frozenset({"noqueue", "pfifo_fast", "mq", "fq_codel", "fq", "pfifo"})


def classid(minor: int) -> int:
    return ROOT_HANDLE | minor


def fmt_handle(h: int) -> str:
    """tc's notation: 0x73680010 -> '7368:10'."""
    major, minor = h >> 16, h & 0xFFFF
    return f"{major:x}:{minor:x}" if minor else f"{major:x}:"


@dataclass(frozen=True)
class HtbRoot:
    """The root HTB qdisc on a device."""

    handle: int = ROOT_HANDLE
    default_minor: int = DEFAULT_CLASS_MINOR
    # HTB offload (TCA_HTB_OFFLOAD): the NIC schedules the tree (backends/htb/offload_plan.py).
    offload: bool = False


@dataclass(frozen=True)
class HtbClass:
    """One HTB class, with the kernel's own units for comparison."""

    classid: int
    parent: int
    rate_bps: int
    ceil_bps: int
    burst_bytes: int
    cburst_bytes: int
    quantum_bytes: int
    prio: int
    # Label only (who this class is for); the kernel does not store it.
    tenant: str | None = field(default=None, compare=False)

    def kernel_fields(self) -> tuple:
        """What the kernel stores and dumps back for this class."""
        return (
            self.parent,
            units.bps_to_Bps(self.rate_bps),
            units.bps_to_Bps(self.ceil_bps),
            units.xmit_ticks(self.burst_bytes, self.rate_bps),
            units.xmit_ticks(self.cburst_bytes, self.ceil_bps),
            self.quantum_bytes,
            self.prio,
        )


@dataclass(frozen=True)
class ObservedClass:
    """An HTB class as dumped by the kernel (same field order as HtbClass.kernel_fields)."""

    classid: int
    parent: int
    rate_Bps: int
    ceil_Bps: int
    buffer_ticks: int
    cbuffer_ticks: int
    quantum_bytes: int
    prio: int
    leaf_handle: int = 0

    def kernel_fields(self) -> tuple:
        return (
            self.parent,
            self.rate_Bps,
            self.ceil_Bps,
            self.buffer_ticks,
            self.cbuffer_ticks,
            self.quantum_bytes,
            self.prio,
        )


@dataclass(frozen=True)
class LeafQdisc:
    """The queue under a leaf class. ``limit`` is bytes for bfifo, packets otherwise."""

    parent: int
    handle: int
    kind: str
    limit: int


class U32Key(NamedTuple):
    """One u32 match key. A NamedTuple: equal to the kernel reader's key rows, so observed keys need no copy."""

    value: int
    mask: int
    offset: int


@dataclass(frozen=True)
class U32Filter:
    """A source-prefix match. Identity is its content; the kernel picks the node handle."""

    prio: int
    protocol: int
    classid: int
    keys: tuple[U32Key, ...]
    # Label: the prefix this filter matches (rendering and logs only).
    prefix: str = field(default="", compare=False)
    # (value, mask) of skb->mark this filter also requires, or None. shaperd
    # never writes one (u32's mark match is a compile-time kernel option that
    # is silently ignored where absent); it is read so a foreign one is seen.
    mark: tuple[int, int] | None = None
    # The filter chain it sits in: the root qdisc's, or an inner tenant class's (destination scopes).
    parent: int = ROOT_HANDLE

    @staticmethod
    def for_prefix(net: ipaddress.IPv4Network | ipaddress.IPv6Network, cls: int) -> "U32Filter":
        return U32Filter(
            prio=prefix_prio(net), protocol=ETH_P_IP if net.version == 4 else ETH_P_IPV6,
            classid=cls, keys=src_prefix_keys(net), prefix=str(net),
        )


@dataclass(frozen=True)
class BpfFilter:
    """cls_bpf classifier (classic mode) on the uplink; identified by program name.

    kind "ifindex": mapping of (ingress ifindex, classid);
    kind "cgroup": mapping of (cgroup level, cgroup id, classid).
    """

    prio: int
    name: str
    mapping: tuple[tuple[int, ...], ...] = field(compare=False)
    # Labels: which interfaces / cgroups produced the mapping.
    interfaces: tuple[str, ...] = field(default=(), compare=False)
    kind: str = field(default="ifindex", compare=False)


class ObservedFilter(NamedTuple):
    """A filter as dumped: enough to identify it and to delete it.

    A NamedTuple: a resync builds one per filter (hundreds), at a quarter of a frozen dataclass's cost."""

    kind: str
    prio: int
    protocol: int
    handle: int
    parent: int
    classid: int = 0
    keys: tuple[U32Key, ...] = ()
    name: str = ""
    mark: tuple[int, int] | None = None

    def identity(self):
        if self.kind == "u32":
            return U32Filter(self.prio, self.protocol, self.classid, self.keys, mark=self.mark, parent=self.parent)
        if self.kind == "bpf":
            return BpfFilter(self.prio, self.name, ())
        return None


Filter = U32Filter | BpfFilter


class DstScope(NamedTuple):
    """A tenant's traffic towards one destination prefix, sent to its own class.

    The contract between the planner and every classifier (u32 fallback, the
    eBPF map classifier, later EDT): a packet first classified to
    ``tenant_classid`` whose destination lies in ``prefix`` goes to ``classid``
    instead (longest destination prefix wins). Empty until the tenants file
    gives a tenant a destination scope.
    """

    tenant_classid: int
    prefix: ipaddress.IPv4Network | ipaddress.IPv6Network
    classid: int


@dataclass(frozen=True)
class DevicePlan:
    """Everything shaperd wants on one device."""

    device: str
    ifindex: int
    capacity_bps: int
    root: HtbRoot
    classes: tuple[HtbClass, ...]
    leaves: tuple[LeafQdisc, ...]
    filters: tuple[Filter, ...]
    # tenant name -> classid, for reporting.
    tenant_classes: dict[str, int] = field(default_factory=dict, compare=False)
    # Destination scopes (see DstScope); classifiers realise them.
    dst_scopes: tuple[DstScope, ...] = ()
    # The eBPF map classifier on clsact egress (backends/htb/mapcls.py), or None on the u32 path.
    map_classifier: object = field(default=None, compare=False)
    # Why HTB offload is on or off for this device (status, metrics, logs); "" where never considered.
    offload_why: str = field(default="", compare=False)

    @property
    def classifier_path(self) -> str:
        return "ebpf" if self.map_classifier is not None else "u32"


@dataclass(frozen=True)
class RootQdisc:
    """The root qdisc found on a device."""

    kind: str
    handle: int
    default_minor: int = 0
    offload: bool = False  # htb: TCA_HTB_OFFLOAD in the dump


@dataclass
class DeviceState:
    """What the kernel holds on one device, as far as shaperd cares."""

    device: str
    ifindex: int
    root: RootQdisc | None
    classes: dict[int, ObservedClass] = field(default_factory=dict)
    leaves: dict[int, LeafQdisc] = field(default_factory=dict)  # by parent classid
    filters: list[ObservedFilter] = field(default_factory=list)
    # shaperd's map classifier found on clsact egress (mapcls.ObservedMapClassifier), if any.
    map_classifier: object = None

    @property
    def owned(self) -> bool:
        return self.root is not None and self.root.kind == "htb" and self.root.handle == ROOT_HANDLE


def prefix_prio(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> int:
    """Longest prefix first: a /32 runs before the /24 that contains it."""
    if net.version == 4:
        return PRIO_U32_V4_BASE + (32 - net.prefixlen)
    return PRIO_U32_V6_BASE + (128 - net.prefixlen)


def dst_prefix_keys(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[U32Key, ...]:
    """u32 keys matching the destination address against ``net`` (IPv4 at offset 16, IPv6 at 24)."""
    return src_prefix_keys(net, dst=True)


def scope_prio(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> int:
    """Longest destination prefix first, in an inner class's chain."""
    if net.version == 4:
        return PRIO_SCOPE_V4_BASE + (32 - net.prefixlen)
    return PRIO_SCOPE_V6_BASE + (128 - net.prefixlen)


def src_prefix_keys(net: ipaddress.IPv4Network | ipaddress.IPv6Network, dst: bool = False) -> tuple[U32Key, ...]:
    """u32 keys matching the source (or, with ``dst``, destination) address against ``net``."""
    v4_off, v6_off = (16, 24) if dst else (12, 8)
    addr = int(net.network_address)
    plen = net.prefixlen
    if net.version == 4:
        if plen == 0:
            return ()  # no key: u32 matches every packet of the protocol
        mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        return (U32Key(addr & mask, mask, v4_off),)
    keys = []
    for word in range(4):  # IPv6 source: 16 bytes at offset 8
        bits = max(0, min(32, plen - 32 * word))
        if bits == 0:
            break
        mask = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF
        val = (addr >> (96 - 32 * word)) & 0xFFFFFFFF
        keys.append(U32Key(val & mask, mask, v6_off + 4 * word))
    return tuple(keys)
