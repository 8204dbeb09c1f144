"""The clsact qdisc as shared ground, and when teardown removes it.

shaperd adds a clsact qdisc where it attaches a filter: the marks backend's
mark programs (ingress of pod interfaces), the map classifier and the edt
stamper (egress of uplinks). Other agents (Cilium, an operator's tc) use the
same clsact. Which filter is whose is each backend's own knowledge (its
``owns_clsact_filter``, by hook, prio, handle and program name); this module
owns the rest: the hooks' parents, a clsact's filters read as data, the
decision at teardown, and the delete operation.

Whether shaperd added a clsact is recorded nowhere (there is no saved
state), so it is judged at teardown time from what the clsact holds, read
before any backend removes its filters:

- every filter on it (both hooks) is shaperd's, and there is at least one:
  shaperd's to remove (once shaperd's filters are gone it would hold
  nothing); deleting it also removes a filter a backend failed to remove.
  A clsact someone else added empty and shaperd then attached to cannot be
  told from this and goes too: nothing of theirs is lost with it (it held
  no filter of theirs), and whoever attaches next adds a clsact again;
- it holds shaperd's filters and someone else's: left in place, said in one
  line (a ``note``, not a failure);
- it holds nothing of shaperd's (another agent's, or empty): not shaperd's
  business, left without a word. An empty clsact is not removed: it cannot
  be told from one another agent has just added and not yet filled, so a
  clsact an interrupted earlier teardown left empty stays too.

Pure, apart from ``read`` (through the kernel layer's reader).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from shaperd.core.errors import KernelError
from shaperd.core.protocol import Operation, TargetDiff

TC_H_CLSACT = 0xFFFFFFF1  # the clsact qdisc's parent (TC_H_INGRESS)
CLSACT_HANDLE = 0xFFFF0000
INGRESS = 0xFFFFFFF2  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS): a filter's parent on the ingress hook
EGRESS = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)
HOOKS = {INGRESS: "ingress", EGRESS: "egress"}
TC_H_INGRESS_PARENT, TC_H_EGRESS_PARENT = INGRESS, EGRESS  # the names the tc backends use for the hooks


@dataclass(frozen=True, kw_only=True)
class AddClsact(Operation):
    """Add a clsact qdisc where none is (marks, the map classifier and edt's stamper hang filters on it)."""

    verb: ClassVar[str] = "add"

    def what(self) -> str:
        return "clsact qdisc"


@dataclass(frozen=True, kw_only=True)
class DeleteClsact(Operation):
    """Delete a clsact qdisc (and with it every filter still on it). Encoded by common/kernel_tc.py."""

    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return "clsact qdisc"


@dataclass
class Clsact:
    """One device's clsact as found before the teardown: whose filters it holds."""

    device: str
    ifindex: int
    # Names of the backends that own a filter here, in the engine's order (the first applies the delete).
    owners: list[str] = field(default_factory=list)
    # The other filters, as people read them: "ingress u32 prio 7".
    foreign: list[str] = field(default_factory=list)
    error: str | None = None  # its filters could not be read


def describe(row: Any) -> str:
    name = f" {row.name}" if getattr(row, "name", "") else ""
    return f"{HOOKS.get(row.parent, hex(row.parent))} {row.kind} prio {row.prio}{name}"


def read(reads, names: dict[int, str], owners: dict[str, Callable[[Any], bool]]) -> list[Clsact]:
    """Every clsact on the node with its filters sorted into shaperd's (by owner) and not.

    ``owners``: backend name -> its ``owns_clsact_filter``; ``names``: ifindex -> device name."""
    out = []
    for idx in sorted({q.ifindex for q in reads.all_qdiscs() if q.kind == "clsact" and q.parent == TC_H_CLSACT}):
        c = Clsact(names.get(idx, str(idx)), idx)
        out.append(c)
        try:
            rows = [f for hook in (INGRESS, EGRESS) for f in reads.filters(idx, hook, c.device)]
        except KernelError as e:
            if e.errno == errno.ENODEV:  # the device went away since the qdisc dump: nothing is left there
                out.pop()
            else:
                c.error = str(e)
            continue
        for f in rows:
            mine = [name for name, owns in owners.items() if owns(f)]
            if not mine:
                c.foreign.append(describe(f))
            for name in mine:
                if name not in c.owners:
                    c.owners.append(name)
    return out


def teardown(found: list[Clsact]) -> list[tuple[str | None, TargetDiff]]:
    """(the backend to apply through, the diff) per clsact that holds shaperd's filters or could not be read."""
    out: list[tuple[str | None, TargetDiff]] = []
    for c in found:
        if c.error is not None:
            out.append((None, TargetDiff(c.device, error=c.error)))
        elif c.owners and c.foreign:
            out.append((None, TargetDiff(c.device, note=(
                f"clsact qdisc on {c.device} left in place: it holds filters that are not shaperd's "
                f"({', '.join(c.foreign)})"))))
        elif c.owners:
            out.append((c.owners[0], TargetDiff(c.device, ops=[DeleteClsact(
                device=c.device, ifindex=c.ifindex, reason="teardown: it held only shaperd's filters")])))
    return out
