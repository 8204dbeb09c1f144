"""tc writes over netlink: the generic writer; each tc backend's codec encodes its own typed operations.

Writes go in bounded, acked, deadlined batches (kernel/nlwriter.py: never
more requests at once than the receive buffer holds acks for) and, if a
write is refused, are replayed one by one by the engine (after a fresh read and diff) so each failure is
attributed to its object while the others still land. An error is built by
the operation itself ("verb object on device: cause"). Reads live in
kernel/rtnl.py. This module knows how to send tc requests and attribute their answers; how
each object kind is encoded is its backend's codec (backends/*/kernel_tc.py), and which
objects to write is the backends' decision. It never imports a backend.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pyroute2.netlink import nla
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELQDISC, RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER  # noqa: F401
from pyroute2.netlink.rtnl import RTM_DELTCLASS, TC_H_ROOT  # noqa: F401 - re-exported for the backends' encoders
from pyroute2.netlink.rtnl import tcmsg as tcmsg_mod
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo, tcmsg

from shaperd.core.errors import TRANSIENT_ERRNOS, KernelError
from shaperd.core.protocol import ApplyResult, Operation
from shaperd.kernel import bpf
from shaperd.kernel import netns as netns_mod
from shaperd.kernel import nlwriter

# bfifo shares pfifo's option struct (struct tc_fifo_qopt { u32 limit; });
# pyroute2 0.9 only registers the pfifo name.
tcmsg_mod.plugins.setdefault("bfifo", sched_pfifo)


class _SchedFq:
    """pyroute2 has no sch_fq codec: its TCA_FQ_* options (uapi pkt_sched.h), as far as edt writes them."""

    class options(nla):
        nla_map = (
            ("TCA_FQ_UNSPEC", "none"), ("TCA_FQ_PLIMIT", "uint32"), ("TCA_FQ_FLOW_PLIMIT", "uint32"),
            ("TCA_FQ_QUANTUM", "uint32"), ("TCA_FQ_INITIAL_QUANTUM", "uint32"), ("TCA_FQ_RATE_ENABLE", "uint32"),
            ("TCA_FQ_FLOW_DEFAULT_RATE", "uint32"), ("TCA_FQ_FLOW_MAX_RATE", "uint32"),
            ("TCA_FQ_BUCKETS_LOG", "uint32"), ("TCA_FQ_FLOW_REFILL_DELAY", "uint32"),
            ("TCA_FQ_ORPHAN_MASK", "uint32"), ("TCA_FQ_LOW_RATE_THRESHOLD", "uint32"),
            ("TCA_FQ_CE_THRESHOLD", "uint32"), ("TCA_FQ_TIMER_SLACK", "uint32"), ("TCA_FQ_HORIZON", "uint32"),
            ("TCA_FQ_HORIZON_DROP", "uint8"),
        )


tcmsg_mod.plugins.setdefault("fq", _SchedFq)

# Request flags: put (create or replace), add (create, refuse an existing one), delete.
F_PUT = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
F_ADD = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
F_DEL = NLM_F_REQUEST | NLM_F_ACK
ETH_P_ALL = 0x0003
# Refusals worth asking again after a pause: the kernel was busy or short of memory, not saying no.
TRANSIENT_ERRNOS = TRANSIENT_ERRNOS - {errno_mod.ETIMEDOUT, errno_mod.EPIPE}  # answered refusals only
RETRY_BACKOFF_S = (0.05, 0.2, 0.5)
# One device's writes in one apply: past this, the rest are reported "not sent" and the engine goes on.
# Each batch has its own deadline (a silent kernel is caught in 5 s); this bounds one that answers, slowly,
# forever. It grows with the work: u32 inserts are linear in the filters already there, and 50,000 of them
# took 40 s with the machine's load at 8.
DEVICE_BUDGET_S = 60.0
PER_WRITE_BUDGET_S = 0.005


def open_writer(netns: str | None = None, run_root: str = "/run", codec: "Codec | None" = None) -> "TcWriter":
    """The node's tc writer: a bounded netlink writer (kernel/nlwriter.py) created inside ``netns``; ``codec``:
    every backend's encoders (the engine hands the registry's), used when apply_ops is given none."""
    try:
        sock = nlwriter.open_rtnl_writer(netns, run_root)
    except OSError as e:
        raise KernelError("open", "rtnetlink socket", netns or "this namespace", e.strerror or str(e), e.errno) from e
    w = TcWriter(nlwriter.NetlinkWriter(sock, netns or "this namespace"), netns, run_root)
    w.codec = codec or NO_CODEC
    return w


class TcWriter:
    """What the backends write through: ``nl`` (bounded, acked, deadlined batches).

    ``nlm_request_batch`` keeps pyroute2's call shape for the VF writer (kernel/vf.py) and raises
    pyroute2's NetlinkError on a refusal. Any other attribute (``link_lookup``, ``get_filters``, as test
    helpers use) opens a pyroute2 IPRoute in the same namespace on first use: the agent itself never does.
    """

    def __init__(self, nl: nlwriter.NetlinkWriter, netns: str | None = None, run_root: str = "/run",
                 device_budget_s: float = DEVICE_BUDGET_S):
        self.nl = nl
        self.netns, self.run_root = netns, run_root
        self.device_budget_s = device_budget_s
        self.codec: "Codec" = NO_CODEC  # set by open_writer; apply_ops' default
        self._ipr = None

    def nlm_request_batch(self, msgs, *_a, **_kw):
        answers = self.nl.request([_encoder(m) for m in msgs])
        for code in answers.codes:
            if code:
                raise NetlinkError(code)
        if answers.lost is not None:
            raise OSError(answers.lost_errno or errno_mod.ETIMEDOUT, answers.lost)
        return []

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._ipr is None:
            from pyroute2.iproute import IPRoute  # test helpers only: the agent never loads it (4.6 MiB)

            with netns_mod.entered(self.netns, self.run_root):
                self._ipr = IPRoute()
        return getattr(self._ipr, name)

    def close(self) -> None:
        self.nl.close()
        if self._ipr is not None:
            self._ipr.close()

    def __enter__(self) -> "TcWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _encoder(m):
    """pyroute2 message -> a function of the sequence number giving its bytes."""
    def encode(seq: int) -> bytes:
        m["header"]["sequence_number"] = seq
        m["header"]["pid"] = 0
        m.reset()
        m.encode()
        return bytes(m.data[:m["header"]["length"]])
    return encode


# ------------------------------------------------------------------ writing


def msg(msg_type: int, flags: int, ifindex: int, handle: int, parent: int, info: int = 0, kind=None, options=None):
    """One tcmsg request (pyroute2's message class): what every backend's encoder builds."""
    m = tcmsg()
    m["index"], m["handle"], m["parent"], m["info"] = ifindex, handle, parent, info
    m["header"]["type"], m["header"]["flags"] = msg_type, flags
    attrs = []
    if kind is not None:
        attrs.append(["TCA_KIND", kind])
    if options is not None:
        attrs.append(["TCA_OPTIONS", options])
    m["attrs"] = attrs
    return m


def info(prio: int, protocol: int) -> int:
    """A filter's tcm_info: its priority and (network order) protocol."""
    return (prio << 16) | socket.htons(protocol)


def htb_init(default_minor: int, offload: bool = False) -> dict:
    """An HTB root's TCA_OPTIONS: used by htb's codec and by the capability probe's offload question."""
    attrs = [["TCA_HTB_INIT", {"version": 3, "rate2quantum": 10, "defcls": default_minor,
                               "debug": 0, "direct_pkts": 0}]]
    if offload:  # NLA_FLAG, no payload: what `tc qdisc add ... htb offload` sends (tests/contract)
        attrs.append(["TCA_HTB_OFFLOAD", ""])
    return {"attrs": attrs}


Encoder = Callable[[Any, "int | None"], Any]  # (operation, fd of its loaded BPF program or None) -> request


@dataclass(frozen=True)
class Codec:
    """How one backend's typed operations become tc requests. Each tc backend owns its codec (its
    ``kernel_tc.py``) and hands it to ``apply_ops``; this module knows no backend.

    ``encoders``: operation class -> Encoder. ``loaders``: operation class -> (op, PinStore or None) -> fd
    of a program whose maps are made and filled first (edt's stamper). ``programs``: operation class ->
    op -> (bytecode builder, program name) of a generated program the request attaches.
    """

    encoders: Mapping[type, Encoder] = field(default_factory=dict)
    loaders: Mapping[type, Callable] = field(default_factory=dict)
    programs: Mapping[type, Callable] = field(default_factory=dict)

    def __or__(self, other: "Codec") -> "Codec":
        return Codec({**self.encoders, **other.encoders}, {**self.loaders, **other.loaders},
                     {**self.programs, **other.programs})


NO_CODEC = Codec()


def build_message(op: Operation, bpf_fd: int | None = None, codec: Codec = NO_CODEC):
    """The netlink request for one operation, by the codec's encoder for its class."""
    try:
        encode = codec.encoders[type(op)]
    except KeyError:
        raise TypeError(f"no tc encoder for {type(op).__name__}") from None
    return encode(op, bpf_fd)


def apply_ops(writer: TcWriter, ops: list[Operation], batch: bool = True, *, codec: "Codec | None" = None,
              sleep=time.sleep, pins=None) -> ApplyResult:
    """Execute ``ops`` (all on one device) in order, within the device's budget, encoded by ``codec`` (default:
    the writer's).

    ``pins``: the bpffs PinStore the codec's loaders pin their programs and maps in (the edt stampers'), or None.

    ``batch``: bounded netlink batches, every request acked (kernel/nlwriter.py). A refusal or lost
    answers set ``batch_failed``: the caller must re-read the device and re-diff, because u32 filter
    adds are not idempotent (the kernel picks the node handle), then call again with ``batch=False`` so
    each remaining failure is attributed to its object while the other writes still land.

    No answer in time is not a batch failure (re-reading a kernel that does not answer helps nobody):
    the unanswered operations fail with "no answer within N s", the ones after them with "not sent",
    and the engine goes on with the other devices.

    ``batch=False``: one request at a time; a transient refusal (EBUSY, ENOBUFS, EAGAIN ...) is asked
    again after RETRY_BACKOFF_S pauses; a permanent one (EPERM, EINVAL ...) is reported at once. A
    write without an answer is never resent here (it may have landed): the next reconcile re-reads.
    """
    result = ApplyResult()
    if not ops:
        return result
    codec = codec or getattr(writer, "codec", NO_CODEC)
    nl = writer.nl
    clock = nl.clock  # the deadline is on the writer's clock (injectable in tests)
    budget_s = writer.device_budget_s + len(ops) * PER_WRITE_BUDGET_S
    deadline = clock() + budget_s
    fds: list[int] = []
    try:
        if batch:
            try:
                encoders = [_encoder(build_message(op, _bpf_fd(op, fds, codec, pins), codec)) for op in ops]
            except KernelError:
                result.batch_failed = True
                return result
            answers = nl.request(encoders, deadline)
            refused = any(answers.codes)
            if answers.lost is not None and answers.lost_errno == errno_mod.ETIMEDOUT and not refused:
                _no_answer(result, ops, answers)
            elif refused or answers.lost is not None:
                result.batch_failed = True
            else:
                result.applied = list(ops)
            return result
        for i, op in enumerate(ops):
            if clock() >= deadline:
                cause = f"not sent: the device's {budget_s:g} s budget for writes was used up"
                result.failed += [(o, o.error(cause, errno_mod.ETIMEDOUT)) for o in ops[i:]]
                break
            try:
                enc = _encoder(build_message(op, _bpf_fd(op, fds, codec, pins), codec))
            except KernelError as e:
                result.failed.append((op, e))
                continue
            code, text, lost, lost_errno = _one(nl, enc, deadline, sleep)
            if lost is not None:
                result.failed.append((op, op.error(lost, lost_errno)))
                if lost_errno == errno_mod.ETIMEDOUT:  # the kernel is not answering this device: stop here
                    cause = "not sent: an earlier write on this device got no answer"
                    result.failed += [(o, o.error(cause, errno_mod.ETIMEDOUT)) for o in ops[i + 1:]]
                    break
            elif code == 0 or (op.deletes and code == errno_mod.ENOENT):
                result.applied.append(op)  # ENOENT on a delete: already gone, the goal holds
            else:
                result.failed.append((op, op.error(_cause(code, text), code)))
    finally:
        for fd in fds:
            os.close(fd)
    return result


def _one(nl: nlwriter.NetlinkWriter, enc, deadline: float, sleep):
    """(errno, kernel text, lost, lost errno) of one request, asked again while the refusal is transient."""
    for pause in (*RETRY_BACKOFF_S, None):
        answers = nl.request([enc], deadline)
        code = answers.codes[0]
        if answers.lost is not None:
            return None, "", answers.lost, answers.lost_errno
        if code not in TRANSIENT_ERRNOS or pause is None or nl.clock() + pause >= deadline:
            return code, answers.texts[0], None, None
        sleep(pause)
    raise AssertionError("unreachable")


def _no_answer(result: ApplyResult, ops: list[Operation], answers: nlwriter.Answers) -> None:
    """Answered operations applied; sent but unanswered ones "no answer ..."; the rest "not sent"."""
    for i, op in enumerate(ops):
        code = answers.codes[i]
        if code == 0:
            result.applied.append(op)
        elif i < answers.sent:
            result.failed.append((op, op.error(answers.lost, errno_mod.ETIMEDOUT)))
        else:
            result.failed.append((op, op.error("not sent: an earlier write on this device got no answer",
                                               errno_mod.ETIMEDOUT)))


def _cause(code: int, text: str) -> str:
    return f"{os.strerror(code)} ({text})" if text else os.strerror(code)


def _bpf_fd(op: Operation, fds: list[int], codec: Codec, pins=None) -> int | None:
    """Load the program an operation attaches; the fd is closed after the request."""
    loader = codec.loaders.get(type(op))
    if loader is not None:
        try:
            fd = loader(op, pins)
        except (bpf.BpfError, OSError, ValueError) as e:
            raise KernelError("load", op.what(), op.device, str(e)) from e
        fds.append(fd)
        return fd
    program = codec.programs.get(type(op))
    if program is None:
        return None
    build, name = program(op)
    try:
        fd = bpf.load_sched_cls(build(), name)
    except (bpf.BpfError, OSError, ValueError) as e:
        raise KernelError("load", f"bpf program {name}", op.device, str(e)) from e
    fds.append(fd)
    return fd
