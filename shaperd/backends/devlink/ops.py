"""The devlink backend's typed operations, pure. ``device`` is the devlink device (``pci/0000:3b:00.0``).

Descriptions read "create rate node shpd_a (tx_share 1250000 B/s, tx_max
12500000 B/s) on pci/0000:3b:00.0 (tenant a)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation


def _rates(share: int | None, mx: int | None) -> str:
    parts = [f"tx_share {share} B/s" if share is not None else "", f"tx_max {mx} B/s" if mx is not None else ""]
    text = ", ".join(p for p in parts if p)
    return f" ({text})" if text else ""


@dataclass(frozen=True, kw_only=True)
class CreateRateNode(Operation):
    node: str
    tx_share_Bps: int | None = None  # None: not sent (the kernel's default, 0)
    tx_max_Bps: int | None = None
    verb: ClassVar[str] = "create"

    def what(self) -> str:
        return f"rate node {self.node}{_rates(self.tx_share_Bps, self.tx_max_Bps)}"


@dataclass(frozen=True, kw_only=True)
class SetRateNode(Operation):
    """Change the fields that differ (None: left as it is)."""

    node: str
    tx_share_Bps: int | None = None
    tx_max_Bps: int | None = None
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"rate node {self.node}{_rates(self.tx_share_Bps, self.tx_max_Bps)}"


@dataclass(frozen=True, kw_only=True)
class SetLeafParent(Operation):
    port_index: int
    parent: str  # "": no parent
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"parent of rate leaf {self.device}/{self.port_index} to {self.parent or 'none'}"


@dataclass(frozen=True, kw_only=True)
class DeleteRateNode(Operation):
    node: str
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"rate node {self.node}"
