"""Parse ``strace -e write=all -e read=all -xx`` output into the bytes each syscall sent or received.

strace prints, under each sendto/sendmsg/recvmsg line, a hex dump of the
buffer (`` | 00000  10 00 00 00 01 14 ...  ascii |``). Those dumps are the
exact bytes, whatever strace thought the structure was, so recorded tool
runs (iproute2's ``rdma``) become request and reply fixtures for the
netlink encoders and decoders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+)?(socket|sendto|sendmsg|recvmsg|recvfrom)\((\d+)?")
_HEX = re.compile(r"^ \| ([0-9a-f]{5})  ")
_HEX_COLUMNS = 49  # "xx " x 8, a space, "xx " x 8; the ASCII column follows


@dataclass(frozen=True)
class Call:
    name: str  # sendto, sendmsg, recvmsg, recvfrom
    fd: int
    data: bytes


def calls(text: str) -> list[Call]:
    """Every send/receive with a hex dump, in order (socket() lines and calls without data are skipped)."""
    out: list[Call] = []
    cur: tuple[str, int] | None = None
    buf = bytearray()

    def flush():
        if cur is not None and buf:
            out.append(Call(cur[0], cur[1], bytes(buf)))

    for line in text.splitlines():
        m = _CALL.match(line)
        if m:
            flush()
            buf = bytearray()
            cur = (m.group(1), int(m.group(2) or -1)) if m.group(1) != "socket" else None
            continue
        h = _HEX.match(line)
        if h and cur is not None:
            if int(h.group(1), 16) != len(buf):
                raise ValueError(f"strace dump out of order at {line!r}")
            buf.extend(bytes.fromhex(line[h.end():h.end() + _HEX_COLUMNS]))
    flush()
    return out


def sent(text: str) -> list[bytes]:
    return [c.data for c in calls(text) if c.name in ("sendto", "sendmsg")]


def received(text: str) -> list[bytes]:
    return [c.data for c in calls(text) if c.name in ("recvmsg", "recvfrom")]
