"""tc writes over netlink: execute the operations produced by shaperd.diff.

Writes go through pyroute2, as one netlink batch and, if the batch fails,
replayed one by one (after a fresh read and diff) so each failure is
attributed to its object while the others still land. Reads live in
kernel/tcstats.py (raw rtnetlink, much cheaper to decode).
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
from dataclasses import dataclass, field

from pyroute2 import IPRoute
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

from ..diff import Op
from ..errors import KernelError
from ..state import (
    ETH_P_ALL,
    ROOT_HANDLE,
    CLSACT_HANDLE,
    PRIO_MARK_INGRESS,
    TC_H_CLSACT,
    TC_H_INGRESS_PARENT,
    BpfFilter,
    HtbClass,
    LeafQdisc,
    U32Filter,
)
from ..units import bps_to_Bps, xmit_ticks

# bfifo shares pfifo's option struct (struct tc_fifo_qopt { u32 limit; });
# pyroute2 0.9 only registers the pfifo name.
tcmsg_mod.plugins.setdefault("bfifo", sched_pfifo)

TC_U32_TERMINAL = 1
TC_LINKLAYER_ETHERNET = 1
U32_MAX = 0xFFFFFFFF
_F_PUT = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
_F_ADD = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_F_DEL = NLM_F_REQUEST | NLM_F_ACK


def open_netlink(netns: str | None = None) -> IPRoute:
    """An rtnetlink socket, in ``netns`` if given (tests), else this process's namespace."""
    try:
        return IPRoute(netns=netns) if netns else IPRoute()
    except OSError as e:
        raise KernelError("open", "rtnetlink socket", netns or "this namespace", e.strerror or str(e), e.errno) from e


# ------------------------------------------------------------------ reading


def _info(prio: int, protocol: int) -> int:
    return (prio << 16) | socket.htons(protocol)


def _proto(info: int) -> int:
    return socket.ntohs(info & 0xFFFF)


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


def _htb_init(default_minor: int) -> dict:
    return {"attrs": [["TCA_HTB_INIT", {"version": 3, "rate2quantum": 10, "defcls": default_minor,
                                         "debug": 0, "direct_pkts": 0}]]}


def _leaf_options(q: LeafQdisc) -> dict:
    if q.kind in ("bfifo", "pfifo"):
        return {"limit": q.limit}
    if q.kind == "fq_codel":
        return {"attrs": [["TCA_FQ_CODEL_LIMIT", q.limit]]}
    raise ValueError(f"unsupported leaf qdisc {q.kind}")


def _u32_options(f: U32Filter) -> dict:
    keys = [f"0x{k.value:08x}/0x{k.mask:08x}+{k.offset}" for k in f.keys]
    attrs = [["TCA_U32_CLASSID", f.classid], ["TCA_U32_SEL", {"flags": TC_U32_TERMINAL, "keys": keys}]]
    if f.mark is not None:
        attrs.append(["TCA_U32_MARK", {"val": f.mark[0], "mask": f.mark[1], "success": 0}])
    return {"attrs": attrs}


def build_message(op: Op, bpf_fd: int | None = None):
    """The netlink request for one operation."""
    idx = op.ifindex
    if op.verb == "replace-root":
        return _msg(RTM_NEWQDISC, _F_PUT, idx, op.obj.handle, TC_H_ROOT, kind="htb", options=_htb_init(op.obj.default_minor))
    if op.verb == "change-root":
        return _msg(RTM_NEWQDISC, _F_DEL, idx, op.obj.handle, TC_H_ROOT, kind="htb", options=_htb_init(op.obj.default_minor))
    if op.verb == "delete-root":
        return _msg(RTM_DELQDISC, _F_DEL, idx, ROOT_HANDLE, TC_H_ROOT)
    if op.verb == "put-class":
        c = op.obj
        return _msg(RTM_NEWTCLASS, _F_PUT, idx, c.classid, c.parent, kind="htb", options=_htb_class_options(c))
    if op.verb == "delete-class":
        return _msg(RTM_DELTCLASS, _F_DEL, idx, op.obj, 0)
    if op.verb == "put-leaf":
        q = op.obj
        return _msg(RTM_NEWQDISC, _F_PUT, idx, q.handle, q.parent, kind=q.kind, options=_leaf_options(q))
    if op.verb == "add-filter" and isinstance(op.obj, U32Filter):
        f = op.obj
        return _msg(RTM_NEWTFILTER, _F_ADD, idx, 0, ROOT_HANDLE, _info(f.prio, f.protocol), "u32", _u32_options(f))
    if op.verb == "add-filter" and isinstance(op.obj, BpfFilter):
        f = op.obj
        opts = {"attrs": [["TCA_BPF_FD", bpf_fd], ["TCA_BPF_NAME", f.name], ["TCA_BPF_FLAGS", 0]]}
        return _msg(RTM_NEWTFILTER, _F_ADD, idx, 1, ROOT_HANDLE, _info(f.prio, ETH_P_ALL), "bpf", opts)
    if op.verb == "add-clsact":
        return _msg(RTM_NEWQDISC, _F_ADD, idx, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact")
    if op.verb == "put-mark":
        m = op.obj
        opts = {"attrs": [["TCA_BPF_FD", bpf_fd], ["TCA_BPF_NAME", m.name], ["TCA_BPF_FLAGS", 1]]}  # direct action
        return _msg(RTM_NEWTFILTER, _F_PUT, idx, 1, TC_H_INGRESS_PARENT, _info(PRIO_MARK_INGRESS, ETH_P_ALL), "bpf", opts)
    if op.verb == "delete-mark":
        return _msg(RTM_DELTFILTER, _F_DEL, idx, 1, TC_H_INGRESS_PARENT, _info(PRIO_MARK_INGRESS, ETH_P_ALL), "bpf")
    if op.verb == "delete-filter":
        f = op.obj
        return _msg(RTM_DELTFILTER, _F_DEL, idx, f.handle, ROOT_HANDLE, _info(f.prio, f.protocol), f.kind)
    if op.verb == "delete-filter-group":
        prio, proto = op.obj
        return _msg(RTM_DELTFILTER, _F_DEL, idx, 0, ROOT_HANDLE, _info(prio, proto))
    raise ValueError(f"unknown operation {op.verb}")


@dataclass
class ApplyResult:
    applied: list[Op] = field(default_factory=list)
    failed: list[tuple[Op, KernelError]] = field(default_factory=list)
    # A batch that failed part-way: some writes may have landed; re-read and re-diff.
    batch_failed: bool = False


def apply_ops(ipr: IPRoute, ops: list[Op], batch: bool = True) -> ApplyResult:
    """Execute ``ops`` in order.

    ``batch``: one netlink batch (fast; all-or-report). If it fails the
    caller must re-read the device and re-diff, because u32 filter adds are
    not idempotent (the kernel picks the node handle), then call again with
    ``batch=False`` so each remaining failure is attributed to its object
    while the other writes still land.
    """
    result = ApplyResult()
    if not ops:
        return result
    fds: list[int] = []
    try:
        if batch:
            try:
                msgs = [build_message(op, _bpf_fd(op, fds)) for op in ops]
                ipr.nlm_request_batch(msgs)
                result.applied = list(ops)
            except (NetlinkError, KernelError):
                result.batch_failed = True
            return result
        for op in ops:
            try:
                ipr.nlm_request_batch([build_message(op, _bpf_fd(op, fds))])
                result.applied.append(op)
            except NetlinkError as e:
                if op.verb.startswith("delete") and e.code == errno_mod.ENOENT:
                    result.applied.append(op)  # already gone: the goal holds
                else:
                    result.failed.append((op, _kernel_error(op, e)))
            except KernelError as e:
                result.failed.append((op, e))
    finally:
        for fd in fds:
            os.close(fd)
    return result


def _bpf_fd(op: Op, fds: list[int]) -> int | None:
    """Load the program an operation attaches; the fd is closed after the request."""
    from . import bpf

    if op.verb == "add-filter" and isinstance(op.obj, BpfFilter):
        f = op.obj
        build = {
            "cgroup": lambda: bpf.cgroup_classifier(f.mapping),
            "mark": lambda: bpf.mark_classifier(f.mapping),
        }.get(f.kind, lambda: bpf.ifindex_classifier(dict(f.mapping)))
        name = f.name
    elif op.verb == "put-mark":
        m = op.obj
        build, name = (lambda: bpf.mark_setter(m.value, m.mask)), m.name
    else:
        return None
    try:
        fd = bpf.load_sched_cls(build(), name)
    except (bpf.BpfError, OSError, ValueError) as e:
        raise KernelError("load", f"bpf program {name}", op.device, str(e)) from e
    fds.append(fd)
    return fd


def _kernel_error(op: Op, e: NetlinkError) -> KernelError:
    desc = op.describe()
    verb, _, rest = desc.partition(" ")
    obj = rest.split(" on ")[0]
    return KernelError(verb, obj, op.device, os.strerror(e.code), e.code)

