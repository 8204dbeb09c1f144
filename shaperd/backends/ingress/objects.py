"""The tenant-ingress backend's objects, as plain data: the IFB and its tree per uplink, the redirect, what was found.

Per shaped uplink, when a tenant has an ``ingress`` block:

- an IFB device, ``ids.ifb_name(uplink)`` ("shpi-eth0"), administratively up;
- on the uplink's clsact ingress hook, shaperd's redirect: a u32 filter at prio 0x7369 ("si") that
  matches every packet (``match u32 0 0``) and hands it to the IFB (``action mirred egress redirect``);
- on the IFB, an HTB root 7369: with the root class 7369:1 (the capacity), the default class 7369:2
  (everything not classified to a tenant) and one class per tenant with an ingress block, at the tenant's
  own minor (core/ids.py ``assign_minors``, as on egress), each with a leaf queue;
- what puts a packet in its tenant's class, keyed on the destination address: the map classifier's
  destination-keyed variant on the IFB's clsact egress (backends/common/mapcls.py, prio/handle 0x7369),
  or, where the kernel has no eBPF maps, u32 destination-prefix filters on the IFB's root.

Ownership: a device named like one of shaperd's IFBs and of kind ifb is shaperd's, with everything on it;
on an uplink, only the u32 filter at prio 0x7369 of the ingress hook. A device of another kind with an
IFB's name, an IFB of another name (the CNI bandwidth plugin's ``bwp*``, an operator's ``ifb0``) and
every other filter on the uplink's clsact are someone else's: left alone, and said. The handle major
7369 (not htb's 7368) keeps the IFB's tree out of the htb backend's ownership (it owns 7368: roots).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shaperd.backends.common import clsact
from shaperd.backends.common.mapcls import MapClassifier, ObservedMapClassifier
from shaperd.backends.common.objects import (
    DEFAULT_CLASS_MINOR, ROOT_CLASS_MINOR, HtbClass, HtbRoot, LeafQdisc, ObservedClass, ObservedFilter, RootQdisc,
    U32Filter, fmt_handle,
)

INGRESS_MAJOR = 0x7369
INGRESS_ROOT = INGRESS_MAJOR << 16
INGRESS_ROOT_CLASS = INGRESS_ROOT | ROOT_CLASS_MINOR
INGRESS_DEFAULT_CLASS = INGRESS_ROOT | DEFAULT_CLASS_MINOR
# The redirect on the uplink's clsact ingress hook. Filters of others at a lower prio decide first: a
# packet one of them matches never reaches the redirect (tc stops at the first filter that matches).
PRIO_REDIRECT = 0x7369
INGRESS_HOOK = clsact.INGRESS
TCA_EGRESS_REDIR = 1  # mirred's eaction (uapi tc_act/tc_mirred.h)
IFB_KIND = "ifb"


def ingress_classid(minor: int) -> int:
    return INGRESS_ROOT | minor


def ingress_root() -> HtbRoot:
    return HtbRoot(handle=INGRESS_ROOT, default_minor=DEFAULT_CLASS_MINOR)


@dataclass(frozen=True)
class TenantIngress:
    """One tenant's inbound share on one uplink, as planned (status and metrics read these)."""

    tenant: str
    classid: int
    guarantee_bps: int | None  # configured; None: no guarantee (the class has HTB's least rate)
    limit_bps: int | None  # configured; None: the capacity
    destinations: int  # destination prefixes classified to it (configured cidrs and pod addresses)


@dataclass(frozen=True)
class IfbPlan:
    """Everything shaperd wants for one uplink's inbound traffic."""

    uplink: str
    uplink_ifindex: int
    ifb: str
    capacity_bps: int
    root: HtbRoot
    classes: tuple[HtbClass, ...]
    leaves: tuple[LeafQdisc, ...]
    # u32 path: destination-prefix filters on the IFB's root (empty on the eBPF path).
    filters: tuple[U32Filter, ...] = ()
    # eBPF path: the destination-keyed map classifier on the IFB's clsact egress (None on the u32 path).
    map_classifier: MapClassifier | None = field(default=None, compare=False)
    tenants: tuple[TenantIngress, ...] = ()

    @property
    def classifier_path(self) -> str:
        return "ebpf" if self.map_classifier is not None else "u32"


@dataclass(frozen=True)
class IngressPlan:
    """The tenant-ingress backend's desired state: one IfbPlan per shaped uplink (none when no tenant has an
    ingress block)."""

    devices: tuple[IfbPlan, ...] = ()
    problems: tuple = ()
    warnings: tuple[str, ...] = ()
    # Uplinks that could not be planned (a problem): whatever they carry now is kept.
    skipped: tuple[str, ...] = ()

    def device(self, uplink: str) -> IfbPlan | None:
        return next((d for d in self.devices if d.uplink == uplink), None)


@dataclass
class IfbState:
    """One of shaperd's IFBs as found: its link, its root and tree (where the root is 7369:), its classifier."""

    name: str
    ifindex: int
    up: bool
    root: RootQdisc | None = None
    classes: dict[int, ObservedClass] = field(default_factory=dict)
    leaves: dict[int, LeafQdisc] = field(default_factory=dict)  # by parent classid
    filters: list[ObservedFilter] = field(default_factory=list)  # on the root 7369:
    clsact: bool = False
    map_classifier: ObservedMapClassifier | None = None

    @property
    def owned_root(self) -> bool:
        return self.root is not None and self.root.kind == "htb" and self.root.handle == INGRESS_ROOT


@dataclass(frozen=True)
class Redirect:
    """A filter at shaperd's prio on an uplink's ingress hook: u32, with its mirred action if any."""

    prio: int
    protocol: int
    handle: int
    keys: tuple = ()
    mirred: tuple[int, int] | None = None  # (eaction, target ifindex)

    def describe(self) -> str:
        to = f" -> ifindex {self.mirred[1]}" if self.mirred else ""
        return f"u32 filter prio {self.prio} handle 0x{self.handle:x}{to}"


@dataclass
class UplinkState:
    """An uplink's ingress side as found: its clsact, shaperd's redirect filters, everyone else's."""

    name: str
    ifindex: int
    clsact: bool = False
    # A classic ``ingress`` qdisc (the same hook, exclusive with clsact): someone else's.
    ingress_qdisc: bool = False
    redirects: list[Redirect] = field(default_factory=list)
    # Other filters on the ingress hook, as people read them ("ingress bpf prio 1 cil_from_netdev"), with
    # their prio: the ones below PRIO_REDIRECT decide before shaperd's redirect does.
    foreign: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class IngressObserved:
    """What the backend found: its IFBs, the uplinks' ingress hooks, and what is in the way."""

    ifbs: dict[str, IfbState] = field(default_factory=dict)
    uplinks: dict[str, UplinkState] = field(default_factory=dict)
    # Devices with one of shaperd's IFB names that are not IFBs: name -> kind. Left alone.
    squatters: dict[str, str] = field(default_factory=dict)
    # IFB devices that are not shaperd's (the CNI bandwidth plugin's bwp*, an operator's): left alone.
    foreign_ifbs: tuple[str, ...] = ()
    # device -> why it could not be read.
    errors: dict[str, str] = field(default_factory=dict)
    # name -> ifindex of every link (the IFB an uplink's redirect points at, by its ifindex).
    names: dict[int, str] = field(default_factory=dict)
    # Entries under the classifier's bpffs pin scope; None without pins or unreadable.
    pin_entries: list[str] | None = None
    pin_error: str | None = None


def class_label(classid: int, tenants: dict[int, str]) -> str:
    if classid == INGRESS_DEFAULT_CLASS:
        return "(default)"
    if classid == INGRESS_ROOT_CLASS:
        return "(root)"
    return tenants.get(classid, fmt_handle(classid))
