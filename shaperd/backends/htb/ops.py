"""The HTB backend's typed operations: one class per object kind and write.

Each says, in tc's words, which object it touches; the base class builds the
description ("create class 7368:10 on eth0 (tenant a): missing") and the
error from that. The kernel side (kernel/tc.py) holds one encoder per class.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation
from shaperd.backends.common.htb_ops import ChangeClass, CreateClass, DeleteClass, SetLeaf  # noqa: F401 - shared with the other HTB tree
from shaperd.backends.common.objects import ROOT_HANDLE, BpfFilter, HtbRoot, ObservedFilter, U32Filter, fmt_handle

ROOT_LABEL = "root qdisc htb 7368:"


@dataclass(frozen=True, kw_only=True)
class CreateRoot(Operation):
    """Replace the device's root qdisc with shaperd's HTB (a default or taken-over root)."""

    root: HtbRoot
    verb: ClassVar[str] = "create"

    def what(self) -> str:
        return ROOT_LABEL


@dataclass(frozen=True, kw_only=True)
class ChangeRoot(Operation):
    """Change the root HTB's own parameters (its default class)."""

    root: HtbRoot
    verb: ClassVar[str] = "change"

    def what(self) -> str:
        return ROOT_LABEL


@dataclass(frozen=True, kw_only=True)
class DeleteRoot(Operation):
    """Remove shaperd's root qdisc, and with it everything under it."""

    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return ROOT_LABEL






@dataclass(frozen=True, kw_only=True)
class AddU32Filter(Operation):
    filter: U32Filter
    verb: ClassVar[str] = "add"

    def what(self) -> str:
        f = self.filter
        keys = " ".join(f"{k.value:08x}/{k.mask:08x}@{k.offset}" for k in f.keys)
        where = "" if f.parent == ROOT_HANDLE else f" under {fmt_handle(f.parent)}"
        return f"u32 filter {f.prefix or keys}{where} -> {fmt_handle(f.classid)}"


@dataclass(frozen=True, kw_only=True)
class AddBpfFilter(Operation):
    """Load a generated classifier program and attach it (cls_bpf) at the root."""

    filter: BpfFilter
    verb: ClassVar[str] = "add"

    def what(self) -> str:
        return f"bpf filter {self.filter.name}"


@dataclass(frozen=True, kw_only=True)
class DeleteFilter(Operation):
    """Remove one observed filter under shaperd's root (stale, or not ours to keep)."""

    filter: ObservedFilter
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        f = self.filter
        return f"{f.kind} filter prio {f.prio} handle 0x{f.handle:x}"


@dataclass(frozen=True, kw_only=True)
class DeleteFilterGroup(Operation):
    """Remove every filter of one (prio, protocol): one kernel tcf_proto instance."""

    prio: int
    protocol: int
    # The chain: the root qdisc's (7368:) or an inner tenant class's (destination scopes).
    parent: int = 0x73680000
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        where = "" if self.parent == 0x73680000 else f" under {fmt_handle(self.parent)}"
        return f"filters at prio {self.prio} protocol 0x{self.protocol:04x}{where}"
