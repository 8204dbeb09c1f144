"""The tenant-ingress backend's typed operations: one class per object kind and write. Pure data.

Operations on an IFB that does not exist yet carry ifindex 0 (and a redirect its ``ifb_ifindex`` 0): the
backend's apply creates the IFB first and fills the new ifindex in (backend.py ``resolved``). The
encoders are in kernel_tc.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.backends.common.clsact import AddClsact  # noqa: F401 - an uplink without clsact gets one
from shaperd.backends.common.objects import HtbRoot, ObservedFilter, U32Filter, fmt_handle
from shaperd.backends.ingress.objects import PRIO_REDIRECT
from shaperd.core.protocol import Operation
from shaperd.backends.common.htb_ops import ChangeClass, CreateClass, DeleteClass, SetLeaf  # noqa: F401 - shared with the other HTB tree


@dataclass(frozen=True, kw_only=True)
class CreateIfb(Operation):
    """Create the IFB ``device``, up (``ip link add name shpi-eth0 up type ifb``)."""

    uplink: str
    verb: ClassVar[str] = "create"

    def what(self) -> str:
        return f"ifb device (fed from {self.uplink})"


@dataclass(frozen=True, kw_only=True)
class SetIfbUp(Operation):
    """Set shaperd's IFB up: mirred drops what it redirects to a device that is down."""

    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return "ifb device up"


@dataclass(frozen=True, kw_only=True)
class DeleteIfb(Operation):
    """Delete shaperd's IFB, and with it its tree and its classifier."""

    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return "ifb device"


@dataclass(frozen=True, kw_only=True)
class CreateRoot(Operation):
    """Put shaperd's HTB root 7369: on the IFB (replacing the IFB's default root)."""

    root: HtbRoot
    verb: ClassVar[str] = "create"

    def what(self) -> str:
        return f"root qdisc htb {fmt_handle(self.root.handle)}"


@dataclass(frozen=True, kw_only=True)
class ChangeRoot(Operation):
    root: HtbRoot
    verb: ClassVar[str] = "change"

    def what(self) -> str:
        return f"root qdisc htb {fmt_handle(self.root.handle)}"


@dataclass(frozen=True, kw_only=True)
class DeleteRoot(Operation):
    handle: int
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"root qdisc htb {fmt_handle(self.handle)}"






@dataclass(frozen=True, kw_only=True)
class AddDstFilter(Operation):
    """u32 path: one destination prefix to its tenant's class, on the IFB's root."""

    filter: U32Filter
    verb: ClassVar[str] = "add"

    def what(self) -> str:
        return f"u32 filter {self.filter.prefix} -> {fmt_handle(self.filter.classid)}"


@dataclass(frozen=True, kw_only=True)
class DeleteFilter(Operation):
    """Remove one observed filter on the IFB's root (stale)."""

    filter: ObservedFilter
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        f = self.filter
        return f"{f.kind} filter prio {f.prio} handle 0x{f.handle:x}"


@dataclass(frozen=True, kw_only=True)
class AddRedirect(Operation):
    """On the uplink's clsact ingress: every packet to the IFB (``u32 match u32 0 0 action mirred egress
    redirect dev IFB``), at shaperd's prio."""

    ifb: str
    ifb_ifindex: int
    verb: ClassVar[str] = "add"

    def what(self) -> str:
        return f"ingress redirect to {self.ifb} (u32 prio {PRIO_REDIRECT:#x}, mirred egress redirect)"


@dataclass(frozen=True, kw_only=True)
class DeleteRedirect(Operation):
    """Remove every filter at shaperd's prio on the uplink's ingress hook (one tcf_proto: the redirect)."""

    prio: int = PRIO_REDIRECT
    protocol: int = 0x0003
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"ingress redirect (u32 prio {self.prio:#x})"
