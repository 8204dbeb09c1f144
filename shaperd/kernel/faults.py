"""A fault seam at the kernel boundary, for tests only.

The netlink writer (kernel/nlwriter.py) and the rtnetlink reader
(kernel/rtnl.py, through the receive loop in kernel/nlexchange.py) read
``ACTIVE`` once per exchange; it is None unless a test
installs a plan with ``installed(plan)``, so production pays one attribute
read. Nothing in config, CLI or environment reaches this module: only tests
and benchmarks import ``installed``.

Faults, each fired on requests matching a predicate (message type, device,
tc parent: a filter dump's clsact hook) and at most ``times``:
- ``refuse(errno)``: the write is not sent; the kernel "answers" with errno
  (EPERM, EBUSY, ENOBUFS, EINVAL ...), as a refusal leaves the kernel unchanged;
- ``no_answer()``: the write is sent and applied, its ack never arrives;
- ``dump_interrupted()``: replies to a read carry NLM_F_DUMP_INTR;
- ``read_silent()``: a read's replies never arrive.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from shaperd.kernel import nlmsg

ACTIVE: "FaultPlan | None" = None

_TCMSG_IFINDEX = struct.Struct("=i")
_TCMSG_IFINDEX_OFF = nlmsg.HDR.size + 4  # tcm_family, pad1, pad2 then tcm_ifindex
_IFINFO_IFINDEX_OFF = nlmsg.HDR.size + 4  # ifi_family, pad, ifi_type then ifi_index
_TCMSG_PARENT_OFF = nlmsg.HDR.size + 12  # then tcm_handle, tcm_parent


def request_type(data: bytes) -> int:
    return nlmsg.HDR.unpack_from(data, 0)[1]


def request_ifindex(data: bytes) -> int:
    """tcm_ifindex / ifi_index of an rtnetlink tc or link request (both sit at the same offset)."""
    if len(data) < _TCMSG_IFINDEX_OFF + 4:
        return 0
    return _TCMSG_IFINDEX.unpack_from(data, _TCMSG_IFINDEX_OFF)[0]


def request_parent(data: bytes) -> int:
    """tcm_parent of an rtnetlink tc request (a filter dump's hook: clsact ingress or egress)."""
    if len(data) < _TCMSG_PARENT_OFF + 4:
        return 0
    return struct.unpack_from("=I", data, _TCMSG_PARENT_OFF)[0]


@dataclass
class Fault:
    kind: str  # "refuse" | "no_answer" | "dump_interrupted" | "read_silent"
    errno: int = 0
    ifindex: int | None = None  # only requests for this device (None: any)
    msg_type: int | None = None  # only this netlink message type (None: any)
    parent: int | None = None  # only tc requests with this tcm_parent (None: any)
    times: int = 1 << 30
    fired: int = 0

    def matches(self, data: bytes) -> bool:
        if self.fired >= self.times:
            return False
        if self.msg_type is not None and request_type(data) != self.msg_type:
            return False
        if self.ifindex is not None and request_ifindex(data) != self.ifindex:
            return False
        if self.parent is not None and request_parent(data) != self.parent:
            return False
        return True


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    log: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, where, errno) per fault fired

    def add(self, kind: str, **kw) -> Fault:
        f = Fault(kind, **kw)
        self.faults.append(f)
        return f

    def refuse(self, errno: int, **kw) -> Fault:
        return self.add("refuse", errno=errno, **kw)

    def no_answer(self, **kw) -> Fault:
        return self.add("no_answer", **kw)

    def dump_interrupted(self, **kw) -> Fault:
        return self.add("dump_interrupted", **kw)

    def read_silent(self, **kw) -> Fault:
        return self.add("read_silent", **kw)

    @property
    def fired(self) -> int:
        return sum(f.fired for f in self.faults)

    def _fire(self, kind: str, data: bytes, where: str) -> Fault | None:
        for f in self.faults:
            if f.kind == kind and f.matches(data):
                f.fired += 1
                self.log.append((kind, where, f.errno))
                return f
        return None

    # -- the writer's hooks ------------------------------------------------------
    def before_send(self, chunk: list[tuple[int, bytes]], where: str):
        """(what to send, {seq: (errno, text)} answered here instead of by the kernel)."""
        send, injected = [], {}
        for seq, data in chunk:
            f = self._fire("refuse", data, where)
            if f is not None:
                injected[seq] = (f.errno, f"injected {os.strerror(f.errno)}")
            else:
                send.append(data)
        return send, injected

    def drop_answer(self, data: bytes, where: str) -> bool:
        return self._fire("no_answer", data, where) is not None

    # -- the reader's hook -------------------------------------------------------
    def reading(self, request: bytes, where: str) -> str | None:
        """What happens to the replies of this read: "silent" (none arrive), "interrupted", or None."""
        if self._fire("read_silent", request, where) is not None:
            return "silent"
        if self._fire("dump_interrupted", request, where) is not None:
            return "interrupted"
        return None


def mark_dump_intr(buf: bytes) -> bytes:
    """``buf`` with NLM_F_DUMP_INTR set on every message, as the kernel marks a dump that raced a change."""
    out = bytearray(buf)
    for m in nlmsg.messages(buf):
        off = m.start - nlmsg.HDR.size + 6  # nlmsg_flags
        flags = struct.unpack_from("=H", out, off)[0]
        struct.pack_into("=H", out, off, flags | nlmsg.NLM_F_DUMP_INTR)
    return bytes(out)


@contextlib.contextmanager
def installed(plan: FaultPlan) -> Iterator[FaultPlan]:
    """Tests only: route every netlink exchange of this process through ``plan`` for the body."""
    global ACTIVE
    before, ACTIVE = ACTIVE, plan
    try:
        yield plan
    finally:
        ACTIVE = before

