"""The marks backend's objects: one BPF mark program per host-side interface (clsact ingress).

Pure data. shaperd owns only its own filter there (prio 0x7368, program
name shpdm_*); the clsact qdisc may be shared with other agents (Cilium,
Calico): only a teardown removes it, and only where it held nothing but
shaperd's filters (backends/common/clsact.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shaperd.backends.common.clsact import CLSACT_HANDLE, TC_H_CLSACT, TC_H_INGRESS_PARENT  # noqa: F401 - the marks' names

# On host-side pod interfaces (clsact ingress): shaperd's mark program.
PRIO_MARK_INGRESS = 0x7368
PROGRAM_PREFIX = "shpdm_"
# Pseudo-device name for this backend's target in reports and logs.
TARGET = "(pod interfaces)"


@dataclass(frozen=True)
class MarkFilter:
    """Marks the traffic entering the node through one host-side interface (clsact ingress)."""

    ifindex: int
    ifname: str
    value: int
    mask: int
    name: str
    tenant: str = field(default="", compare=False)
    pods: tuple[str, ...] = field(default=(), compare=False)
    # The capped pod whose own mark this is (namespace/name), "" for a tenant's mark.
    pod: str = field(default="", compare=False)


@dataclass(frozen=True)
class ObservedMark:
    """shaperd's mark program as found on an interface."""

    ifindex: int
    name: str
    handle: int


@dataclass(frozen=True)
class MarksPlan:
    marks: tuple[MarkFilter, ...] = ()
    problems: tuple = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class MarksObserved:
    marks: dict[int, ObservedMark] = field(default_factory=dict)
    clsact: frozenset[int] = frozenset()  # interfaces that have a clsact qdisc
    # Interfaces whose ingress hook holds a classic ``ingress`` qdisc (the CNI bandwidth plugin's egress side
    # puts one there, with a redirect to its bwp* IFB): clsact cannot be added beside it, so no mark is set.
    ingress_qdisc: frozenset[int] = frozenset()
    names: dict[int, str] = field(default_factory=dict)
    # ifindex -> why its clsact ingress filters could not be read (a teardown fails on it; a reconcile
    # sets the mark again where one is wanted).
    errors: dict[int, str] = field(default_factory=dict)
