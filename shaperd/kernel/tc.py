"""tc over netlink: read a device's qdiscs/classes/filters, execute diff operations.

The only place (with kernel/links.py and kernel/probe.py) that speaks
rtnetlink. Reads are dumps translated into shaperd.state types; writes are
the operations produced by shaperd.diff, sent as one netlink batch and, if
the batch fails, replayed one by one so each failure is attributed to its
object and the others still land. Every write is idempotent (create-or-
replace, delete-if-present), so a replay is safe.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import struct
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
    HANDLE_MAJOR,
    ROOT_HANDLE,
    CLSACT_HANDLE,
    PRIO_MARK_INGRESS,
    TC_H_CLSACT,
    TC_H_INGRESS_PARENT,
    BpfFilter,
    MarkFilter,
    DeviceState,
    HtbClass,
    LeafQdisc,
    ObservedClass,
    ObservedFilter,
    RootQdisc,
    U32Filter,
    U32Key,
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


@dataclass
class ClassStats:
    """Counters of one HTB class, as the kernel reports them."""

    classid: int
    parent: int
    rate_Bps: int
    ceil_Bps: int
    prio: int
    bytes: int
    packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    qlen: int
    borrows: int
    lends: int
    tokens: int
    ctokens: int


def _info(prio: int, protocol: int) -> int:
    return (prio << 16) | socket.htons(protocol)


def _proto(info: int) -> int:
    return socket.ntohs(info & 0xFFFF)


def _htb_parms(msg) -> tuple[dict, int, int] | None:
    opts = msg.get_attr("TCA_OPTIONS")
    if opts is None:
        return None
    parms = opts.get_attr("TCA_HTB_PARMS")
    if parms is None:
        return None
    rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
    ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
    return parms, rate, ceil


def _dump(ipr: IPRoute, what: str, device: str, fn, *args, **kw) -> list:
    try:
        return list(fn(*args, **kw))
    except NetlinkError as e:
        raise KernelError("dump", what, device, os.strerror(e.code), e.code) from e


def read_device(ipr: IPRoute, device: str, ifindex: int) -> DeviceState:
    """Everything shaperd cares about on one device, from three dumps."""
    st = DeviceState(device=device, ifindex=ifindex, root=None)
    for q in _dump(ipr, "qdiscs", device, ipr.get_qdiscs, index=ifindex):
        if q["index"] != ifindex:
            continue
        kind = q.get_attr("TCA_KIND")
        if q["parent"] == TC_H_ROOT:
            default_minor = 0
            if kind == "htb":
                init = (q.get_attr("TCA_OPTIONS") or {}).get_attr("TCA_HTB_INIT") if q.get_attr("TCA_OPTIONS") else None
                default_minor = init["defcls"] if init else 0
            st.root = RootQdisc(kind=kind, handle=q["handle"], default_minor=default_minor)
        elif q["parent"] >> 16 == HANDLE_MAJOR:
            st.leaves[q["parent"]] = LeafQdisc(
                parent=q["parent"], handle=q["handle"], kind=kind, limit=_qdisc_limit(q, kind)
            )
    if not st.owned:
        return st  # nothing under a foreign or default root is ours to read
    for c in _dump(ipr, "classes", device, ipr.get_classes, index=ifindex):
        if c["index"] != ifindex or c.get_attr("TCA_KIND") != "htb" or c["handle"] >> 16 != HANDLE_MAJOR:
            continue
        parsed = _htb_parms(c)
        if parsed is None:
            continue
        parms, rate, ceil = parsed
        # The kernel reports a top-level class's parent as TC_H_ROOT; we create it under the qdisc handle.
        parent = ROOT_HANDLE if c["parent"] == TC_H_ROOT else c["parent"]
        st.classes[c["handle"]] = ObservedClass(
            classid=c["handle"], parent=parent, rate_Bps=rate, ceil_Bps=ceil,
            buffer_ticks=parms["buffer"], cbuffer_ticks=parms["cbuffer"], quantum_bytes=parms["quantum"],
            prio=parms["prio"], leaf_handle=c["info"],
        )
    for f in _dump(ipr, "filters", device, ipr.get_filters, index=ifindex, parent=ROOT_HANDLE):
        obs = _observed_filter(f)
        if obs is not None:
            st.filters.append(obs)
    return st


def owned_ifindexes(ipr: IPRoute) -> set[int]:
    """Devices whose root qdisc is shaperd's (one dump of all qdiscs)."""
    return {
        q["index"]
        for q in _dump(ipr, "qdiscs", "node", ipr.get_qdiscs)
        if q["parent"] == TC_H_ROOT and q["handle"] == ROOT_HANDLE and q.get_attr("TCA_KIND") == "htb"
    }


def read_marks(ipr: IPRoute) -> tuple[dict[int, ObservedFilter], set[int]]:
    """shaperd's mark programs on host-side interfaces, and which devices have a clsact qdisc."""
    clsact = {
        q["index"] for q in _dump(ipr, "qdiscs", "node", ipr.get_qdiscs)
        if q.get_attr("TCA_KIND") == "clsact"
    }
    marks: dict[int, ObservedFilter] = {}
    for idx in sorted(clsact):
        try:
            filters = list(ipr.get_filters(index=idx, parent=TC_H_INGRESS_PARENT))
        except NetlinkError:
            continue  # the interface went away between the two dumps: nothing to do there
        for f in filters:
            obs = _observed_filter(f)
            if obs and obs.kind == "bpf" and obs.prio == PRIO_MARK_INGRESS and obs.name.startswith("shpdm_"):
                marks[idx] = obs
    return marks, clsact


def _qdisc_limit(q, kind: str) -> int:
    opts = q.get_attr("TCA_OPTIONS")
    if opts is None:
        return 0
    if kind in ("bfifo", "pfifo"):
        return int(opts.get("limit", 0))
    if kind == "fq_codel":
        return int(opts.get_attr("TCA_FQ_CODEL_LIMIT") or 0)
    return 0


def _observed_filter(f) -> ObservedFilter | None:
    kind = f.get_attr("TCA_KIND")
    prio, proto = f["info"] >> 16, _proto(f["info"])
    base = dict(kind=kind, prio=prio, protocol=proto, handle=f["handle"], parent=f["parent"])
    opts = f.get_attr("TCA_OPTIONS")
    if kind == "u32":
        # The dump also lists hash tables (node id 0) and the bare tcf_proto: not filters.
        if f["handle"] & 0xFFF == 0 or opts is None:
            return None
        mark = opts.get_attr("TCA_U32_MARK")
        return ObservedFilter(**base, classid=opts.get_attr("TCA_U32_CLASSID") or 0, keys=_u32_keys(opts),
                              mark=(mark["val"], mark["mask"]) if mark else None)
    if kind == "bpf":
        if f["handle"] == 0 or opts is None:
            return None
        return ObservedFilter(**base, classid=opts.get_attr("TCA_BPF_CLASSID") or 0, name=opts.get_attr("TCA_BPF_NAME") or "")
    if f["handle"] == 0:
        return None
    return ObservedFilter(**base)




def _u32_keys(opts) -> tuple[U32Key, ...]:
    """Decode TCA_U32_SEL from its raw bytes (pyroute2 0.9 misaligns the keys)."""
    sel = opts.get_attr("TCA_U32_SEL")
    if sel is None:
        return ()
    raw = bytes(sel.data[sel.offset + 4 : sel.offset + sel.length])
    nkeys = raw[2]
    keys = []
    for i in range(nkeys):
        chunk = raw[16 + 16 * i : 32 + 16 * i]
        mask, val = struct.unpack("!II", chunk[:8])
        off, _offmask = struct.unpack("=ii", chunk[8:])
        keys.append(U32Key(val, mask, off))
    return tuple(sorted(keys, key=lambda k: k.offset))


def read_class_stats(ipr: IPRoute, device: str, ifindex: int) -> dict[int, ClassStats]:
    """Counters of shaperd's classes on one device (one dump)."""
    out: dict[int, ClassStats] = {}
    for c in _dump(ipr, "classes", device, ipr.get_classes, index=ifindex):
        if c["index"] != ifindex or c.get_attr("TCA_KIND") != "htb" or c["handle"] >> 16 != HANDLE_MAJOR:
            continue
        parsed = _htb_parms(c)
        if parsed is None:
            continue
        parms, rate, ceil = parsed
        s2 = c.get_attr("TCA_STATS2")
        basic = s2.get_attr("TCA_STATS_BASIC") if s2 else None
        queue = s2.get_attr("TCA_STATS_QUEUE") if s2 else None
        app = s2.get_attr("TCA_STATS_APP") if s2 else None
        # 64-bit byte counters come in TCA_STATS_BASIC; the legacy TCA_STATS is 32-bit-safe only.
        out[c["handle"]] = ClassStats(
            classid=c["handle"], parent=c["parent"], rate_Bps=rate, ceil_Bps=ceil, prio=parms["prio"],
            bytes=basic["bytes"] if basic else 0, packets=basic["packets"] if basic else 0,
            drops=queue["drops"] if queue else 0, overlimits=queue["overlimits"] if queue else 0,
            backlog_bytes=queue["backlog"] if queue else 0, qlen=queue["qlen"] if queue else 0,
            borrows=app["borrows"] if app else 0, lends=app["lends"] if app else 0,
            tokens=app["tokens"] if app else 0, ctokens=app["ctokens"] if app else 0,
        )
    return out


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

