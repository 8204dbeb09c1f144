"""The edt backend's typed operations: one class per object kind and write. Pure data.

Each names its object the way ``tc`` would, so errors read "set fq qdisc
8001: on eth0: Invalid argument". The kernel side (kernel/tc.py ENCODERS)
turns each into its netlink request; the stamper's maps and program are
made by kernel/edt_prog.py when SetStamper is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from shaperd.core.protocol import Operation
from shaperd.backends.common.objects import fmt_handle
from shaperd.backends.edt.objects import FqQdisc, Stamper


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
    # key -> first rate (ns per byte, 16.16 fixed point) until the controller writes its own.
    initial_q16: tuple[tuple[int, int], ...] = field(default=())
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"edt stamper {self.stamper.name} (clsact egress prio {self.stamper.prio})"


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
