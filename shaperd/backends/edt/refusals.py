"""Verify at apply, fall back: devices where the kernel refused what the edt data plane needs.

Without a probe namespace (NET_ADMIN + BPF only) the probe can only read
evidence of sch_fq and mq (kernel/qdisc_kinds.py); where it is unknown, edt
is offered and the first apply on a device is the test. When the kernel
answers a SetRoot/SetFq with ENOENT "Specified qdisc kind is unknown"
(net/sched/sch_api.c, qdisc_create: no Qdisc_ops of that kind, loaded or
loadable), the edt backend removes what that apply left (its root), keeps
the device here as "edt refused: <reason>" and the next plan puts it on htb
(backends/edt/select.py reads this as data through PlanInput.refused). One
warning per refusal; no retry (the kernel's kinds do not change under a
running daemon, short of an operator loading a module: a restart re-verifies).

A refusal is kept per device name and ifindex: it is forgotten when the
device goes away (or comes back as a new device: a new ifindex), and on
restart (memory only). Owns that memory and the classification of errors;
does no I/O.
"""

from __future__ import annotations

import errno

from shaperd.core.errors import KernelError
from shaperd.core.inventory import Inventory
from shaperd.core.protocol import Operation
from shaperd.backends.edt.ops import SetFq, SetRoot

# The kernel's extack for a qdisc kind it has no ops for (sch_api.c; the answer on this host for "fq").
UNKNOWN_KIND_TEXT = "Specified qdisc kind is unknown"


def refusal_of(op: Operation, err: KernelError) -> str | None:
    """The reason edt cannot run on the device when ``err`` says the kernel does not know ``op``'s qdisc kind.

    ENOENT with that extack; or ENOENT without any extack (kernels before 4.15 send none), which
    on a create/replace of the root or of an mq child has no other cause once the device exists."""
    if not isinstance(op, (SetRoot, SetFq)) or err.errno != errno.ENOENT:
        return None
    if UNKNOWN_KIND_TEXT not in err.cause and "(" in err.cause:
        return None  # ENOENT with another explanation (e.g. "Failed to find specified qdisc"): not a kind
    kind = "fq" if isinstance(op, SetFq) else op.kind
    module = {"fq": "sch_fq", "mq": "sch_mq"}.get(kind, kind)
    return f"the kernel does not know qdisc kind {kind} ({module}): {err}"


def first_refusal(failed: list[tuple[Operation, KernelError]]) -> str | None:
    return next((r for op, err in failed if (r := refusal_of(op, err)) is not None), None)


class Refusals:
    """device name -> (ifindex, reason): where edt was refused since this process started."""

    def __init__(self) -> None:
        self._by_device: dict[str, tuple[int, str]] = {}

    def add(self, device: str, ifindex: int, reason: str) -> bool:
        """Remember a refusal; True when it is new (the caller warns once)."""
        new = self._by_device.get(device) != (ifindex, reason)
        self._by_device[device] = (ifindex, reason)
        return new

    def current(self, inv: Inventory | None = None) -> dict[str, tuple[int, str]]:
        """The refusals still standing; with ``inv``, first forget devices gone or recreated (new ifindex)."""
        if inv is not None:
            live = {l.name: l.ifindex for l in inv.links}
            for dev, (idx, _why) in list(self._by_device.items()):
                if live.get(dev) != idx:
                    del self._by_device[dev]
        return dict(self._by_device)
