"""The vfrate backend's one typed operation: set a VF's min and max tx rate on its PF. Pure: no I/O.

``device`` is the PF's netdev, so descriptions and errors read
"set VF 3 rates min 100 max 1000 Mbit/s on ens1f0: Invalid argument".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation


@dataclass(frozen=True, kw_only=True)
class SetVfRate(Operation):
    vf: int
    min_mbps: int
    max_mbps: int  # 0: no cap
    pf_pci: str = ""
    driver: str = ""
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"VF {self.vf} rates min {self.min_mbps} max {self.max_mbps} Mbit/s"
