"""The podingress backend's typed operations: set or delete shaperd's tbf root on a pod's host interface. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation
from shaperd.core.units import format_rate
from shaperd.backends.podingress.objects import PodIngress


@dataclass(frozen=True, kw_only=True)
class SetPodTbf(Operation):
    """Create (or replace in place: same handle and kind) the tbf 7368: root qdisc capping what the pod receives."""

    pod: PodIngress
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        t = self.pod.tbf
        return (f"tbf 7368: rate {format_rate(self.pod.cap_bps)} burst {t.burst_bytes}b limit {t.limit_bytes}b "
                f"(ingress cap of pod {self.pod.ref})")


@dataclass(frozen=True, kw_only=True)
class DeletePodTbf(Operation):
    """Delete shaperd's tbf 7368: root qdisc (the kernel puts its default root back)."""

    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return "tbf 7368: (a pod's ingress cap)"
