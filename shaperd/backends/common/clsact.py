"""The clsact qdisc, shared by the tc backends: its handles, and the typed operation that adds it.

marks (ingress mark programs), the map classifier (egress) and edt's stamper (egress) hang their
filters on a device's clsact qdisc. It may be shared with other agents (Cilium, Calico): shaperd
adds one where none exists and removes only one that holds nothing but what shaperd put there
(engine teardown). Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation

TC_H_CLSACT = 0xFFFFFFF1
CLSACT_HANDLE = 0xFFFF0000
TC_H_INGRESS_PARENT = 0xFFFFFFF2  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
TC_H_EGRESS_PARENT = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)


@dataclass(frozen=True, kw_only=True)
class AddClsact(Operation):
    verb: ClassVar[str] = "add"

    def what(self) -> str:
        return "clsact qdisc"
