"""The HTB class and leaf operations both HTB trees write: htb's on the uplinks, the tenant-ingress IFB's.

One class per write (create, change, delete a class; set a leaf queue); each backend's ``ops`` module
re-exports them beside its own root and filter operations, and the shared encoders are
``kernel_tc.HTB_TREE_CODEC``. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.backends.common.objects import HtbClass, LeafQdisc, fmt_handle
from shaperd.core.protocol import Operation


@dataclass(frozen=True, kw_only=True)
class CreateClass(Operation):
    cls: HtbClass
    verb: ClassVar[str] = "create"

    def what(self) -> str:
        return f"class {fmt_handle(self.cls.classid)}"


@dataclass(frozen=True, kw_only=True)
class ChangeClass(Operation):
    cls: HtbClass
    verb: ClassVar[str] = "change"

    def what(self) -> str:
        return f"class {fmt_handle(self.cls.classid)}"


@dataclass(frozen=True, kw_only=True)
class DeleteClass(Operation):
    classid: int
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"class {fmt_handle(self.classid)}"


@dataclass(frozen=True, kw_only=True)
class SetLeaf(Operation):
    """Create or replace the queue under a leaf class."""

    leaf: LeafQdisc
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"leaf qdisc {self.leaf.kind} {fmt_handle(self.leaf.handle)}"
