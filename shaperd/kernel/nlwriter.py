"""Bounded netlink writes: requests sent in batches whose acks always fit the receive buffer.

pyroute2's ``nlm_request_batch`` sent every message of an apply in one go and
then waited for the acks. Each ack is its own skb in the socket's receive
buffer; past a few thousand messages the buffer overflowed, the kernel
dropped acks (the socket reports ENOBUFS once) and the wait never ended
(issue 11: 3,000 u32 filters hung ``shaperd apply`` forever).

Here every request carries NLM_F_ACK and its own sequence number, at most
``batch_messages`` requests go per send(2), with ``batch_messages`` chosen so
their acks fit the receive buffer this socket really got (SO_RCVBUFFORCE when
permitted, read back with getsockopt), and each ack is matched to its request
by sequence number. NETLINK_CAP_ACK keeps an error ack from echoing the whole
request; NETLINK_EXT_ACK adds the kernel's own error text. Every batch has a
deadline; past it the answer is "no answer", never a wait.

The writer reports, per request, the errno the kernel answered (0: done) or
None (no answer: it may or may not have been applied). What that means for an
operation (retry, re-read, report) is the caller's decision (kernel/tc.py).
The socket and clock are injectable, so batching and ack matching run on a
fake kernel in unit tests. Tests can install a fault plan (kernel/faults.py);
without one this module pays one attribute read per batch.
"""

from __future__ import annotations

import errno as errno_mod
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shaperd.kernel import faults
from shaperd.kernel import netns as netns_mod
from shaperd.kernel import nlmsg
from shaperd.kernel.nlexchange import NETLINK_CAP_ACK, NETLINK_EXT_ACK, SOL_NETLINK

NETLINK_ROUTE = 0
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
# Asked for; the kernel doubles it for its bookkeeping, rmem_max caps it without CAP_NET_ADMIN.
RCVBUF_BYTES = 4 << 20
# What one ack costs in the receive buffer (skb truesize, not its 36 payload bytes): about 0.8 KiB on
# x86_64 for a capped ack; counted as 2 KiB so an uncapped error ack (the request echoed) still fits.
ACK_COST_BYTES = 2048
MAX_BATCH_MESSAGES = 256
# One send(2) must fit the send buffer (default 208 KiB); well under it.
MAX_BATCH_BYTES = 64 << 10
DEFAULT_TIMEOUT_S = 5.0
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
NLMSGERR_ATTR_MSG = 1
_ERR_HDR = struct.Struct("=i")


@dataclass
class Answers:
    """The kernel's answer to each request, in request order.

    ``codes[i]``: 0 done, an errno refused, None no answer. ``texts[i]``: the kernel's extended
    ack message for a refusal ("" without one). ``lost``: why answers are missing (None: all came).
    """

    codes: list[int | None] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    lost: str | None = None
    lost_errno: int | None = None
    sent: int = 0  # requests handed to the kernel (the ones after a batch that went unanswered are not)


def open_rtnl_writer(netns: str | None = None, run_root: str = "/run") -> socket.socket:
    """A NETLINK_ROUTE socket for writes in ``netns``: capped acks, extended acks, a large receive buffer."""
    with netns_mod.entered(netns, run_root):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        except OSError:  # without CAP_NET_ADMIN: capped at net.core.rmem_max, batches shrink to fit
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        for opt in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
            try:
                sock.setsockopt(SOL_NETLINK, opt, 1)
            except OSError:
                pass  # older kernels: acks are then larger (ACK_COST_BYTES allows for it), errors carry no text
        sock.bind((0, 0))
    except OSError:
        sock.close()
        raise
    return sock


def batch_messages_for(rcvbuf_bytes: int) -> int:
    """How many requests one batch may hold so that all their acks fit ``rcvbuf_bytes`` (half of it: margin)."""
    return max(1, min(MAX_BATCH_MESSAGES, rcvbuf_bytes // 2 // ACK_COST_BYTES))


class NetlinkWriter:
    """Write requests over one netlink socket in bounded, acked, deadlined batches."""

    def __init__(self, sock, where: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic, batch_messages: int | None = None, seq: int = 0):
        self.sock = sock
        self.where = where
        self.timeout_s = timeout_s
        self.clock = clock
        self.seq = seq
        if batch_messages is None:
            try:
                batch_messages = batch_messages_for(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
            except (OSError, AttributeError):
                batch_messages = 1
        self.batch_messages = batch_messages
        self.batches_sent = 0  # for tests and benchmarks: how the work was split

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "NetlinkWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def request(self, encoders: Sequence[Callable[[int], bytes]], deadline: float | None = None) -> Answers:
        """Send ``encoders[i](seq)`` for every i, in order; the kernel's answer to each.

        Stops at the first batch that is not fully answered (``lost`` says why); the requests after it
        are not sent (their code is None as well). ``deadline`` (on this writer's clock) bounds the whole
        call on top of the per-batch ``timeout_s``.
        """
        out = Answers()
        i = 0
        n = len(encoders)
        while i < n:
            chunk, size = [], 0
            while i + len(chunk) < n and len(chunk) < self.batch_messages:
                self.seq += 1
                data = encoders[i + len(chunk)](self.seq)
                if chunk and size + len(data) > MAX_BATCH_BYTES:
                    self.seq -= 1
                    break
                chunk.append((self.seq, data))
                size += len(data)
            codes, texts, lost, lost_errno = self._batch(chunk, deadline)
            out.codes += codes
            out.texts += texts
            i += len(chunk)
            out.sent = i
            if lost is not None:
                out.lost, out.lost_errno = lost, lost_errno
                out.codes += [None] * (n - i)
                out.texts += [""] * (n - i)
                break
        return out

    def _batch(self, chunk: list[tuple[int, bytes]], deadline: float | None):
        pending = {seq: k for k, (seq, _data) in enumerate(chunk)}
        codes: list[int | None] = [None] * len(chunk)
        texts = [""] * len(chunk)
        plan = faults.ACTIVE
        send = [data for _seq, data in chunk]
        if plan is not None:
            send, injected = plan.before_send(chunk, self.where)
            for seq, (code, text) in injected.items():
                k = pending.pop(seq)
                codes[k], texts[k] = code, text
        end = self.clock() + self.timeout_s
        if deadline is not None:
            end = min(end, deadline)
        self.batches_sent += 1
        try:
            if send:
                self.sock.send(b"".join(send))
            while pending:
                left = end - self.clock()
                if left <= 0:
                    raise socket.timeout()
                self.sock.settimeout(left)
                buf = self.sock.recv(1 << 16)
                if not buf:
                    return codes, texts, "netlink socket closed", errno_mod.EPIPE
                for m in nlmsg.messages(buf):
                    k = pending.get(m.seq)
                    if k is None or m.type != nlmsg.NLMSG_ERROR:
                        continue  # a late answer to a request whose batch timed out, or a notification
                    if plan is not None and plan.drop_answer(chunk[k][1], self.where):
                        continue
                    del pending[m.seq]
                    codes[k] = nlmsg.error_code(buf, m)
                    texts[k] = ext_ack_text(buf, m) if codes[k] else ""
        except socket.timeout:
            what = f"no answer within {self.timeout_s:g} s"
            if deadline is not None and end == deadline:
                what = "no answer before the device's deadline"
            return codes, texts, f"{what} ({len(pending)} of {len(chunk)} requests unanswered)", errno_mod.ETIMEDOUT
        except OSError as e:
            # ENOBUFS here: the receive buffer overflowed and answers were dropped (should not happen with
            # bounded batches; another writer on this socket could cause it). The state is unknown.
            return codes, texts, f"answers lost ({e.strerror or e})", e.errno
        return codes, texts, None, None


def ext_ack_text(buf: bytes, m: nlmsg.Message) -> str:
    """The kernel's NLMSGERR_ATTR_MSG of an error ack ("" when it sent none)."""
    if not m.flags & NLM_F_ACK_TLVS or m.end - m.start < _ERR_HDR.size + nlmsg.HDR.size:
        return ""
    off = m.start + _ERR_HDR.size
    if m.flags & NLM_F_CAPPED:
        off += nlmsg.HDR.size
    else:
        off += nlmsg.HDR.unpack_from(buf, off)[0]  # the echoed request
    return nlmsg.string(buf, nlmsg.attrs(buf, (off + 3) & ~3, m.end).get(NLMSGERR_ATTR_MSG))
