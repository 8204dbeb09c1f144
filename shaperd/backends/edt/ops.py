"""The edt backend's typed operations: one class per object kind and write. Pure data.

Each names its object the way ``tc`` would, so errors read "set fq qdisc
8001: on eth0: Invalid argument". The kernel side (kernel/tc.py ENCODERS)
turns each into its netlink request; the stamper's maps and program are
made by kernel_stamper.py when SetStamper is applied, and a capped pod's map
entries (SetPodKey, ClearPodKey) are written there too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from shaperd.core.protocol import Operation
from shaperd.backends.common.objects import fmt_handle
from shaperd.backends.edt.controller import rate_bps_of_q16
from shaperd.backends.edt.objects import FqQdisc, Stamper
from shaperd.core.units import format_rate


@dataclass(frozen=True, kw_only=True)
class SetRoot(Operation):
    """Replace the device's root qdisc with mq (several TX queues) or sch_fq (one), handle 7365:."""

    kind: str
    handle: int
    fq: FqQdisc | None = None  # the root's options when the root itself is sch_fq
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"root {self.kind} qdisc {fmt_handle(self.handle)}"


@dataclass(frozen=True, kw_only=True)
class SetFq(Operation):
    """sch_fq on one TX queue (under mq class 7365:<q>), sized for the rate."""

    fq: FqQdisc
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"fq qdisc {fmt_handle(self.fq.handle)} (parent {fmt_handle(self.fq.parent)})"


@dataclass(frozen=True, kw_only=True)
class DeleteRoot(Operation):
    handle: int
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"root qdisc {fmt_handle(self.handle)}"


@dataclass(frozen=True, kw_only=True)
class SetStamper(Operation):
    """Create fresh maps, write the first rates, load the stamper and attach (or replace) it on clsact egress."""

    stamper: Stamper
    # key -> first rate (ns per byte, 16.16 fixed point) until the controller writes its own; capped pods'
    # keys carry their static rate here too.
    initial_q16: tuple[tuple[int, int], ...] = field(default=())
    # pod key -> parent key of each capped pod, written into the fresh maps before the program is attached.
    initial_parents: tuple[tuple[int, int], ...] = field(default=())
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"edt stamper {self.stamper.name} (clsact egress prio {self.stamper.prio})"


@dataclass(frozen=True, kw_only=True)
class SetPodKey(Operation):
    """A capped pod's key in the attached stamper's maps: its parent, then its rate (only what differs:
    None leaves that entry as it is, so a changed cap rewrites one rate entry)."""

    key: int
    parent: int | None = None
    ns_per_byte_q16: int | None = None
    prog_id: int = 0  # the attached stamper whose maps are written
    pod: str = ""  # namespace/name, for the operator
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        parts = ([f"parent {self.parent}"] if self.parent is not None else []) + (
            [f"rate {format_rate(rate_bps_of_q16(self.ns_per_byte_q16))}"] if self.ns_per_byte_q16 is not None
            else [])
        return f"edt pod key {self.key}{f' of pod {self.pod}' if self.pod else ''} ({', '.join(parts)})"


@dataclass(frozen=True, kw_only=True)
class ClearPodKey(Operation):
    """A pod key no capped pod has any more: its rate, clock, counters and (last) its parent cleared."""

    key: int
    prog_id: int = 0
    verb: ClassVar[str] = "clear"

    def what(self) -> str:
        return f"edt pod key {self.key} (rate, clock, counters, parent)"


@dataclass(frozen=True, kw_only=True)
class DeleteStamper(Operation):
    prio: int
    name: str = ""
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"edt stamper {self.name or '?'} (clsact egress prio {self.prio})"


@dataclass(frozen=True, kw_only=True)
class UnpinStamper(Operation):
    """Remove the bpffs pins of a stamper no longer on ``device`` (the "edt-stamper" part of the pin scope)."""

    verb: ClassVar[str] = "remove"

    def what(self) -> str:
        return "edt stamper bpffs pins"
