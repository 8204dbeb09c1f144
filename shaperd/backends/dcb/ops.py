"""The DCB backend's typed operations, one per IEEE object it writes on a netdev. Pure: no I/O.

Each carries ``plan_key`` (NetdevDcb.key): a write the kernel acknowledged
but that did not stick is remembered with it, and not re-sent until the
plan for that netdev changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation


@dataclass(frozen=True, kw_only=True)
class SetEts(Operation):
    tc_bw_pct: tuple[int, ...]
    tc_tsa: tuple[int, ...]
    prio_tc: tuple[int, ...]
    plan_key: tuple = ()
    verb: ClassVar[str] = "set"
    kind: ClassVar[str] = "ets"

    def what(self) -> str:
        bw = " ".join(f"{tc}:{b}" for tc, b in enumerate(self.tc_bw_pct))
        return f"DCB ETS (tc-bw {bw})"


@dataclass(frozen=True, kw_only=True)
class SetMaxrate(Operation):
    maxrate_kbps: tuple[int, ...]
    plan_key: tuple = ()
    verb: ClassVar[str] = "set"
    kind: ClassVar[str] = "maxrate"

    def what(self) -> str:
        return "DCB max rates (" + " ".join(f"{tc}:{r}kbit" for tc, r in enumerate(self.maxrate_kbps)) + ")"


@dataclass(frozen=True, kw_only=True)
class AddDscpApps(Operation):
    dscp_prio: tuple[tuple[int, int], ...]
    plan_key: tuple = ()
    verb: ClassVar[str] = "add"
    kind: ClassVar[str] = "app"

    def what(self) -> str:
        return "DCB APP dscp-prio " + " ".join(f"{d}:{p}" for d, p in self.dscp_prio)


@dataclass(frozen=True, kw_only=True)
class DeleteDscpApps(Operation):
    dscp_prio: tuple[tuple[int, int], ...]
    plan_key: tuple = ()
    verb: ClassVar[str] = "delete"
    kind: ClassVar[str] = "app-del"

    def what(self) -> str:
        return "DCB APP dscp-prio " + " ".join(f"{d}:{p}" for d, p in self.dscp_prio)
