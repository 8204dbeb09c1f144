"""The marks backend's typed operations. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation
from shaperd.backends.common.clsact import AddClsact  # noqa: F401 - marks adds clsact where none is
from shaperd.backends.marks.objects import MarkFilter, ObservedMark


@dataclass(frozen=True, kw_only=True)
class SetMark(Operation):
    """Load the mark program and attach (or replace) it at clsact ingress."""

    mark: MarkFilter
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"mark program {self.mark.name} (mark 0x{self.mark.value:x}/0x{self.mark.mask:x})"


@dataclass(frozen=True, kw_only=True)
class DeleteMark(Operation):
    observed: ObservedMark
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"mark program {self.observed.name}"
