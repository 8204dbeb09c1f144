"""tc writes over netlink: one encoder per typed operation (pyroute2's message classes), sent by kernel/nlwriter.py.

Writes go in bounded, acked, deadlined batches (kernel/nlwriter.py: never
more requests at once than the receive buffer holds acks for) and, if a
write is refused, are replayed one by one by the engine (after a fresh read and diff) so each failure is
attributed to its object while the others still land. An error is built by
the operation itself ("verb object on device: cause"). Reads live in
kernel/rtnl.py. This module knows how to write each object kind; which
objects to write is the backends' decision.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import time

from pyroute2 import IPRoute
from pyroute2.netlink import nla
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import (
    RTM_DELQDISC,
    RTM_DELTCLASS,
    RTM_DELTFILTER,
    RTM_NEWQDISC,
    RTM_NEWTCLASS,
    RTM_NEWTFILTER,
    TC_H_ROOT,
)
from pyroute2.netlink.rtnl import tcmsg as tcmsg_mod
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo, tcmsg

from shaperd.core.protocol import ApplyResult, Operation
from shaperd.backends.edt import ops as edt
from shaperd.backends.edt.objects import STAMPER_HANDLE
from shaperd.backends.htb import ops as htb
from shaperd.backends.common import clsact
from shaperd.backends.common.objects import ETH_P_ALL, ROOT_HANDLE, HtbClass, LeafQdisc, U32Filter
from shaperd.backends.marks import ops as marks
from shaperd.backends.marks.objects import CLSACT_HANDLE, PRIO_MARK_INGRESS, TC_H_CLSACT, TC_H_INGRESS_PARENT
from shaperd.core.errors import TRANSIENT_ERRNOS, KernelError
from shaperd.core.units import bps_to_Bps, xmit_ticks
from shaperd.kernel import bpf
from shaperd.backends.edt import kernel_stamper as edt_prog
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

TC_U32_TERMINAL = 1
TC_LINKLAYER_ETHERNET = 1
U32_MAX = 0xFFFFFFFF
_F_PUT = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
_F_ADD = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_F_DEL = NLM_F_REQUEST | NLM_F_ACK
# Refusals worth asking again after a pause: the kernel was busy or short of memory, not saying no.
TRANSIENT_ERRNOS = TRANSIENT_ERRNOS - {errno_mod.ETIMEDOUT, errno_mod.EPIPE}  # answered refusals only
RETRY_BACKOFF_S = (0.05, 0.2, 0.5)
# One device's writes in one apply: past this, the rest are reported "not sent" and the engine goes on.
# Each batch has its own deadline (a silent kernel is caught in 5 s); this bounds one that answers, slowly,
# forever. It grows with the work: u32 inserts are linear in the filters already there, and 50,000 of them
# took 40 s with the machine's load at 8.
DEVICE_BUDGET_S = 60.0
PER_WRITE_BUDGET_S = 0.005


def open_writer(netns: str | None = None, run_root: str = "/run") -> "TcWriter":
    """The node's tc writer: a bounded netlink writer (kernel/nlwriter.py) created inside ``netns``."""
    try:
        sock = nlwriter.open_rtnl_writer(netns, run_root)
    except OSError as e:
        raise KernelError("open", "rtnetlink socket", netns or "this namespace", e.strerror or str(e), e.errno) from e
    return TcWriter(nlwriter.NetlinkWriter(sock, netns or "this namespace"), netns, run_root)


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


def _info(prio: int, protocol: int) -> int:
    return (prio << 16) | socket.htons(protocol)


# ------------------------------------------------------------------ writing


def _msg(msg_type: int, flags: int, ifindex: int, handle: int, parent: int, info: int = 0, kind=None, options=None):
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


def _htb_class_options(c: HtbClass) -> dict:
    rate, ceil = bps_to_Bps(c.rate_bps), bps_to_Bps(c.ceil_bps)
    parms = {
        # linklayer ethernet: the kernel then needs no rate tables (RTAB/CTAB).
        "rate___reserved": TC_LINKLAYER_ETHERNET, "rate": min(rate, U32_MAX),
        "ceil___reserved": TC_LINKLAYER_ETHERNET, "ceil": min(ceil, U32_MAX),
        "buffer": xmit_ticks(c.burst_bytes, c.rate_bps), "cbuffer": xmit_ticks(c.cburst_bytes, c.ceil_bps),
        "quantum": c.quantum_bytes, "prio": c.prio,
    }
    attrs = [["TCA_HTB_PARMS", parms]]
    # Rates of 2^32 bytes/s (34.4 Gbit) and above travel in the 64-bit attributes.
    if rate >= U32_MAX:
        attrs.append(["TCA_HTB_RATE64", rate])
    if ceil >= U32_MAX:
        attrs.append(["TCA_HTB_CEIL64", ceil])
    return {"attrs": attrs}


def _htb_init(default_minor: int, offload: bool = False) -> dict:
    attrs = [["TCA_HTB_INIT", {"version": 3, "rate2quantum": 10, "defcls": default_minor,
                               "debug": 0, "direct_pkts": 0}]]
    if offload:  # NLA_FLAG, no payload: what `tc qdisc add ... htb offload` sends (tests/contract)
        attrs.append(["TCA_HTB_OFFLOAD", ""])
    return {"attrs": attrs}


def _leaf_options(q: LeafQdisc) -> dict:
    if q.kind in ("bfifo", "pfifo"):
        return {"limit": q.limit}
    if q.kind == "fq_codel":
        return {"attrs": [["TCA_FQ_CODEL_LIMIT", q.limit]]}
    raise ValueError(f"unsupported leaf qdisc {q.kind}")


def _u32_options(f: U32Filter) -> dict:
    # pyroute2 shifts the offset per leading zero byte of a zero-padded mask; an all-zero mask (tc's
    # "match u32 0 0", a scoped tenant's catch-all) must be written unpadded or it fails to parse.
    keys = [f"0x{k.value:08x}/0x{k.mask:08x}+{k.offset}" if k.mask else f"0x0/0x0+{k.offset}" for k in f.keys]
    attrs = [["TCA_U32_CLASSID", f.classid], ["TCA_U32_SEL", {"flags": TC_U32_TERMINAL, "keys": keys}]]
    if f.mark is not None:
        attrs.append(["TCA_U32_MARK", {"val": f.mark[0], "mask": f.mark[1], "success": 0}])
    return {"attrs": attrs}


def _u32_filter(op: htb.AddU32Filter, fd: int | None):
    f = op.filter
    return _msg(RTM_NEWTFILTER, _F_ADD, op.ifindex, 0, f.parent, _info(f.prio, f.protocol), "u32", _u32_options(f))


def _bpf_filter(op: htb.AddBpfFilter, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.filter.name], ["TCA_BPF_FLAGS", 0]]}
    return _msg(RTM_NEWTFILTER, _F_ADD, op.ifindex, 1, ROOT_HANDLE, _info(op.filter.prio, ETH_P_ALL), "bpf", opts)


def _set_mark(op: marks.SetMark, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.mark.name], ["TCA_BPF_FLAGS", 1]]}  # direct action
    return _msg(RTM_NEWTFILTER, _F_PUT, op.ifindex, 1, TC_H_INGRESS_PARENT, _info(PRIO_MARK_INGRESS, ETH_P_ALL),
                "bpf", opts)


def _fq_options(fq) -> dict:
    return {"attrs": [["TCA_FQ_PLIMIT", fq.limit_packets], ["TCA_FQ_FLOW_PLIMIT", fq.flow_limit_packets],
                      ["TCA_FQ_HORIZON", fq.horizon_us], ["TCA_FQ_HORIZON_DROP", int(fq.horizon_drop)]]}


def _edt_root(op: edt.SetRoot, fd: int | None):
    options = _fq_options(op.fq) if op.kind == "fq" and op.fq is not None else None
    return _msg(RTM_NEWQDISC, _F_PUT, op.ifindex, op.handle, TC_H_ROOT, kind=op.kind, options=options)


_TC_H_EGRESS_PARENT = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)


def _edt_stamper(op: edt.SetStamper, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.stamper.name], ["TCA_BPF_FLAGS", 1]]}  # direct action
    return _msg(RTM_NEWTFILTER, _F_PUT, op.ifindex, STAMPER_HANDLE, _TC_H_EGRESS_PARENT,
                _info(op.stamper.prio, ETH_P_ALL), "bpf", opts)


# One encoder per operation class: (operation, fd of its loaded BPF program or None) -> netlink request.
ENCODERS = {
    htb.CreateRoot: lambda op, _fd: _msg(RTM_NEWQDISC, _F_PUT, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                         options=_htb_init(op.root.default_minor, op.root.offload)),
    htb.ChangeRoot: lambda op, _fd: _msg(RTM_NEWQDISC, _F_DEL, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                         options=_htb_init(op.root.default_minor, op.root.offload)),
    htb.DeleteRoot: lambda op, _fd: _msg(RTM_DELQDISC, _F_DEL, op.ifindex, ROOT_HANDLE, TC_H_ROOT),
    htb.CreateClass: lambda op, _fd: _msg(RTM_NEWTCLASS, _F_PUT, op.ifindex, op.cls.classid, op.cls.parent, kind="htb",
                                          options=_htb_class_options(op.cls)),
    htb.ChangeClass: lambda op, _fd: _msg(RTM_NEWTCLASS, _F_PUT, op.ifindex, op.cls.classid, op.cls.parent, kind="htb",
                                          options=_htb_class_options(op.cls)),
    htb.DeleteClass: lambda op, _fd: _msg(RTM_DELTCLASS, _F_DEL, op.ifindex, op.classid, 0),
    htb.SetLeaf: lambda op, _fd: _msg(RTM_NEWQDISC, _F_PUT, op.ifindex, op.leaf.handle, op.leaf.parent,
                                      kind=op.leaf.kind, options=_leaf_options(op.leaf)),
    htb.AddU32Filter: _u32_filter,
    htb.AddBpfFilter: _bpf_filter,
    htb.DeleteFilter: lambda op, _fd: _msg(RTM_DELTFILTER, _F_DEL, op.ifindex, op.filter.handle, op.filter.parent,
                                           _info(op.filter.prio, op.filter.protocol), op.filter.kind),
    htb.DeleteFilterGroup: lambda op, _fd: _msg(RTM_DELTFILTER, _F_DEL, op.ifindex, 0, op.parent,
                                                _info(op.prio, op.protocol)),
    marks.AddClsact: lambda op, _fd: _msg(RTM_NEWQDISC, _F_ADD, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact"),
    clsact.DeleteClsact: lambda op, _fd: _msg(RTM_DELQDISC, _F_DEL, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT,
                                              kind="clsact"),
    marks.SetMark: _set_mark,
    marks.DeleteMark: lambda op, _fd: _msg(RTM_DELTFILTER, _F_DEL, op.ifindex, 1, TC_H_INGRESS_PARENT,
                                           _info(PRIO_MARK_INGRESS, ETH_P_ALL), "bpf"),
    # edt: mq or sch_fq at the root, sch_fq per TX queue, the stamper on clsact egress.
    edt.SetRoot: _edt_root,
    edt.SetFq: lambda op, _fd: _msg(RTM_NEWQDISC, _F_PUT, op.ifindex, op.fq.handle, op.fq.parent, kind="fq",
                                    options=_fq_options(op.fq)),
    edt.DeleteRoot: lambda op, _fd: _msg(RTM_DELQDISC, _F_DEL, op.ifindex, op.handle, TC_H_ROOT),
    edt.SetStamper: _edt_stamper,
    edt.DeleteStamper: lambda op, _fd: _msg(RTM_DELTFILTER, _F_DEL, op.ifindex, STAMPER_HANDLE, _TC_H_EGRESS_PARENT,
                                            _info(op.prio, ETH_P_ALL), "bpf"),
}

# Operations whose program needs maps made and filled first: (op, PinStore or None) -> its program fd
# (kernel/edt_prog.py; with a store, the program and maps are pinned as the device's entry).
LOADERS = {
    edt.SetStamper: lambda op, pins: edt_prog.load_fresh(op.stamper.horizon_ns, dict(op.initial_q16), pins, op.device),
}

# Operations that attach a generated program: how to build its bytecode, and its name.
PROGRAMS = {
    htb.AddBpfFilter: lambda op: ({
        "cgroup": lambda: bpf.cgroup_classifier(op.filter.mapping),
        "mark": lambda: bpf.mark_classifier(op.filter.mapping),
    }.get(op.filter.kind, lambda: bpf.ifindex_classifier(dict(op.filter.mapping))), op.filter.name),
    marks.SetMark: lambda op: ((lambda: bpf.mark_setter(op.mark.value, op.mark.mask)), op.mark.name),
}


def build_message(op: Operation, bpf_fd: int | None = None):
    """The netlink request for one operation."""
    try:
        encode = ENCODERS[type(op)]
    except KeyError:
        raise TypeError(f"no tc encoder for {type(op).__name__}") from None
    return encode(op, bpf_fd)


def apply_ops(writer: TcWriter, ops: list[Operation], batch: bool = True, *, sleep=time.sleep,
              pins=None) -> ApplyResult:
    """Execute ``ops`` (all on one device) in order, within the device's budget.

    ``pins``: the bpffs PinStore LOADERS pin their programs and maps in (the edt stampers'), or None.

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
    nl = writer.nl
    clock = nl.clock  # the deadline is on the writer's clock (injectable in tests)
    budget_s = writer.device_budget_s + len(ops) * PER_WRITE_BUDGET_S
    deadline = clock() + budget_s
    fds: list[int] = []
    try:
        if batch:
            try:
                encoders = [_encoder(build_message(op, _bpf_fd(op, fds, pins))) for op in ops]
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
                enc = _encoder(build_message(op, _bpf_fd(op, fds, pins)))
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


def _bpf_fd(op: Operation, fds: list[int], pins=None) -> int | None:
    """Load the program an operation attaches; the fd is closed after the request."""
    loader = LOADERS.get(type(op))
    if loader is not None:
        try:
            fd = loader(op, pins)
        except (bpf.BpfError, OSError, ValueError) as e:
            raise KernelError("load", op.what(), op.device, str(e)) from e
        fds.append(fd)
        return fd
    program = PROGRAMS.get(type(op))
    if program is None:
        return None
    build, name = program(op)
    try:
        fd = bpf.load_sched_cls(build(), name)
    except (bpf.BpfError, OSError, ValueError) as e:
        raise KernelError("load", f"bpf program {name}", op.device, str(e)) from e
    fds.append(fd)
    return fd
