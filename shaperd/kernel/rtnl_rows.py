"""rtnetlink replies decoded into typed rows, pure (bytes in, named tuples out).

One decoder per message kind: links, routes, neighbours, qdiscs, classes,
filters. Only the fields shaperd uses are unpacked, with ``struct`` (pyroute2
decodes every attribute into objects, ~25x slower for class dumps). No
policy: a row says what the kernel holds, not whether it is shaperd's.
Rows are NamedTuples, not dataclasses: a resync decodes hundreds of them and
a frozen dataclass costs about four times as much to build.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

from shaperd.kernel.nlmsg import Message, U32, attr_list, attrs, fast_new, string, u32, u64

IFINFOMSG = struct.Struct("=BBHiII")  # family, pad, type, index, flags, change
TCMSG = struct.Struct("=BBHiIII")  # family, pad1, pad2, ifindex, handle, parent, info
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
NDMSG = struct.Struct("=BBHiHBB")  # family, pad1, pad2, ifindex, state, flags, type

IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 4, 18, 1
IFLA_NUM_TX_QUEUES = 31
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_MULTIPATH, RTA_TABLE, RTA_VIA = 1, 4, 5, 6, 9, 15, 18
NDA_DST, NDA_LLADDR, NDA_MASTER = 1, 2, 9
TCA_KIND, TCA_OPTIONS, TCA_STATS2 = 1, 2, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE, TCA_STATS_APP = 1, 3, 4
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 6, 7
TCA_HTB_OFFLOAD = 9  # NLA_FLAG: htb_dump puts it on an offloaded root (sch_htb.c, kernel 5.12+)
TCA_FQ_CODEL_LIMIT = 2
TCA_U32_CLASSID, TCA_U32_DIVISOR, TCA_U32_SEL, TCA_U32_MARK = 1, 4, 5, 10
TCA_U32_ACT = 7
TCA_ACT_KIND, TCA_ACT_OPTIONS = 1, 2
TCA_MIRRED_PARMS = 2
TCA_BPF_CLASSID, TCA_BPF_NAME, TCA_BPF_ID = 3, 7, 11
TC_H_ROOT = 0xFFFFFFFF

_BASIC = struct.Struct("=QI")  # bytes, packets
_QUEUE = struct.Struct("=IIIII")  # qlen, backlog, drops, requeues, overlimits
_HTB_XSTATS = struct.Struct("=IIIii")  # lends, borrows, giants, tokens, ctokens
_U32_SEL_HEAD = 16  # struct tc_u32_sel before its keys
_U32_KEY = struct.Struct("!II")  # mask, val in network order; then off, offmask in host order
_TC_MIRRED = struct.Struct("=IIiiiiI")  # struct tc_mirred: index, capab, action, refcnt, bindcnt, eaction, ifindex
_I32 = struct.Struct("=i")
_RTNEXTHOP = struct.Struct("=HBBi")


class LinkRow(NamedTuple):
    ifindex: int
    name: str
    kind: str  # IFLA_INFO_KIND: "veth", "bridge", "" for a physical NIC
    mtu: int
    up: bool  # administratively up (IFF_UP)
    tx_queues: int = 1  # IFLA_NUM_TX_QUEUES: how many children mq gives the device


class RouteRow(NamedTuple):
    family: int
    dst_len: int
    table: int
    type: int
    metric: int
    oif: int | None
    via_gateway: bool  # RTA_GATEWAY or RTA_VIA: the destination is not on a local link
    multipath_oifs: tuple[int, ...] = ()


class NeighRow(NamedTuple):
    family: int
    ifindex: int
    dst: bytes | None
    lladdr: bytes | None
    master: int | None


# tbf (uapi pkt_sched.h): struct tc_tbf_qopt in PARMS; rates at or above 2^32 bytes/s in RATE64/PRATE64.
TCA_TBF_PARMS, TCA_TBF_RATE64, TCA_TBF_PRATE64 = 1, 4, 5
# struct tc_tbf_qopt: rate (tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate), peakrate, limit,
# buffer, mtu.
_TBF_QOPT = struct.Struct("=BBHhHI BBHhHI III")


class TbfParams(NamedTuple):
    """A tbf qdisc's parameters as the kernel dumps them (tbf_dump): rates in bytes/s, times in ticks (64 ns)."""

    rate_Bps: int
    peakrate_Bps: int
    limit_bytes: int
    buffer_ticks: int  # the bucket, as time at rate (the kernel derives it from TCA_TBF_BURST)
    mtu_ticks: int  # the peak bucket (0 without a peak rate)
    linklayer: int  # tc_ratespec's linklayer (1: ethernet)


class QdiscCounters(NamedTuple):
    """A qdisc's counters (TCA_STATS2): what it sent, dropped and holds."""

    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    requeues: int = 0
    backlog_bytes: int = 0
    qlen: int = 0


class QdiscRow(NamedTuple):
    ifindex: int
    handle: int
    parent: int
    kind: str
    limit: int = 0  # bfifo/pfifo (bytes/packets) and fq_codel (packets)
    default_minor: int = 0  # htb: the default class
    # sch_fq: (limit, flow_limit, horizon_us, horizon_drop), the edt backend's sizing; None for other kinds.
    fq: tuple[int, int, int, int] | None = None
    offload: bool = False  # htb: the root is offloaded to the NIC (TCA_HTB_OFFLOAD in the dump)
    tbf: TbfParams | None = None  # tbf: its parameters; None for other kinds
    counters: QdiscCounters | None = None  # None where the dump carries no TCA_STATS2


class HtbClassRow(NamedTuple):
    """An HTB class with its parameters (kernel units) and counters."""

    ifindex: int
    classid: int
    parent: int
    leaf_handle: int
    rate_Bps: int
    ceil_Bps: int
    buffer_ticks: int
    cbuffer_ticks: int
    quantum_bytes: int
    prio: int
    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    qlen: int = 0
    borrows: int = 0
    lends: int = 0
    tokens: int = 0
    ctokens: int = 0


class U32KeyRow(NamedTuple):
    value: int
    mask: int
    offset: int


class FilterRow(NamedTuple):
    ifindex: int
    parent: int
    prio: int
    protocol: int  # host order (ETH_P_*)
    handle: int
    kind: str
    classid: int = 0
    keys: tuple[U32KeyRow, ...] = ()  # u32, by offset
    name: str = ""  # bpf program name
    mark: tuple[int, int] | None = None  # u32 mark match (value, mask)
    prog_id: int = 0  # bpf: TCA_BPF_ID, the attached program's id (adoption of its maps)
    # u32: its first mirred action as (eaction, target ifindex): TCA_EGRESS_REDIR 1, TCA_EGRESS_MIRROR 2,
    # TCA_INGRESS_REDIR 3, TCA_INGRESS_MIRROR 4 (uapi tc_act/tc_mirred.h); None without one.
    mirred: tuple[int, int] | None = None


def link(buf: bytes, m: Message) -> LinkRow:
    _fam, _pad, _type, index, flags, _change = IFINFOMSG.unpack_from(buf, m.start)
    a = attrs(buf, m.start + IFINFOMSG.size, m.end)
    kind = string(buf, attrs(buf, *a[IFLA_LINKINFO]).get(IFLA_INFO_KIND)) if IFLA_LINKINFO in a else ""
    return LinkRow(ifindex=index, name=string(buf, a.get(IFLA_IFNAME)), kind=kind,
                   mtu=u32(buf, a.get(IFLA_MTU), 1500), up=bool(flags & 1),
                   tx_queues=u32(buf, a.get(IFLA_NUM_TX_QUEUES), 1))


def route(buf: bytes, m: Message) -> RouteRow:
    fam, dst_len, _sl, _tos, table, _proto, _scope, rtype, _flags = RTMSG.unpack_from(buf, m.start)
    a = attrs(buf, m.start + RTMSG.size, m.end)
    hops = []
    if RTA_MULTIPATH in a:  # struct rtnexthop { u16 len; u8 flags; u8 hops; s32 ifindex; } + attrs
        pos, stop = a[RTA_MULTIPATH]
        while pos + _RTNEXTHOP.size <= stop:
            nh_len, _f, _h, nh_if = _RTNEXTHOP.unpack_from(buf, pos)
            hops.append(nh_if)
            if nh_len < _RTNEXTHOP.size:
                break
            pos += (nh_len + 3) & ~3
    return RouteRow(
        family=fam, dst_len=dst_len, table=u32(buf, a.get(RTA_TABLE), table), type=rtype,
        metric=u32(buf, a.get(RTA_PRIORITY)), oif=u32(buf, a[RTA_OIF]) if RTA_OIF in a else None,
        via_gateway=RTA_GATEWAY in a or RTA_VIA in a, multipath_oifs=tuple(hops),
    )


def neigh(buf: bytes, m: Message) -> NeighRow:
    fam, _p1, _p2, index, _state, _flags, _t = NDMSG.unpack_from(buf, m.start)
    a = attrs(buf, m.start + NDMSG.size, m.end)
    return NeighRow(
        family=fam, ifindex=index,
        dst=bytes(buf[slice(*a[NDA_DST])]) if NDA_DST in a else None,
        lladdr=bytes(buf[slice(*a[NDA_LLADDR])]) if NDA_LLADDR in a else None,
        master=u32(buf, a[NDA_MASTER]) if NDA_MASTER in a else None,
    )


def root_qdisc(buf: bytes, m: Message) -> QdiscRow | None:
    """A root qdisc (parent TC_H_ROOT), or None without decoding anything else (the sampler's hot path)."""
    if TCMSG.unpack_from(buf, m.start)[5] != TC_H_ROOT:
        return None
    return qdisc(buf, m)


TCA_FQ_PLIMIT, TCA_FQ_FLOW_PLIMIT, TCA_FQ_HORIZON, TCA_FQ_HORIZON_DROP = 1, 2, 14, 15  # sch_fq (edt)


def qdisc(buf: bytes, m: Message) -> QdiscRow:
    _f, _p1, _p2, index, handle, parent, _info = TCMSG.unpack_from(buf, m.start)
    a = attrs(buf, m.start + TCMSG.size, m.end)
    kind = string(buf, a.get(TCA_KIND))
    limit = default_minor = 0
    fq = tbf = None
    offload = False
    if TCA_OPTIONS in a:
        s, e = a[TCA_OPTIONS]
        if kind in ("bfifo", "pfifo") and e - s >= 4:
            limit = U32.unpack_from(buf, s)[0]  # struct tc_fifo_qopt, not nested
        elif kind == "fq_codel":
            limit = u32(buf, attrs(buf, s, e).get(TCA_FQ_CODEL_LIMIT))
        elif kind == "htb":
            o = attrs(buf, s, e)
            if TCA_HTB_INIT in o:
                default_minor = U32.unpack_from(buf, o[TCA_HTB_INIT][0] + 8)[0]  # tc_htb_glob.defcls
            offload = TCA_HTB_OFFLOAD in o
        elif kind == "fq":
            o = attrs(buf, s, e)
            drop = buf[o[TCA_FQ_HORIZON_DROP][0]] if TCA_FQ_HORIZON_DROP in o else 0  # a u8
            fq = (u32(buf, o.get(TCA_FQ_PLIMIT)), u32(buf, o.get(TCA_FQ_FLOW_PLIMIT)), u32(buf, o.get(TCA_FQ_HORIZON)),
                  drop)
        elif kind == "tbf":
            tbf = _tbf(buf, attrs(buf, s, e))
    return QdiscRow(ifindex=index, handle=handle, parent=parent, kind=kind, limit=limit, default_minor=default_minor,
                    fq=fq, offload=offload, tbf=tbf, counters=_counters(buf, a))


def _tbf(buf: bytes, o: dict[int, tuple[int, int]]) -> TbfParams | None:
    """tbf's TCA_OPTIONS: tc_tbf_qopt, with the 64-bit rates where the kernel put them (>= 2^32 bytes/s)."""
    if TCA_TBF_PARMS not in o or o[TCA_TBF_PARMS][1] - o[TCA_TBF_PARMS][0] < _TBF_QOPT.size:
        return None
    (_cl, linklayer, _ov, _ca, _mpu, rate, _pcl, _pll, _pov, _pca, _pmpu, peak, limit, buffer,
     mtu) = _TBF_QOPT.unpack_from(buf, o[TCA_TBF_PARMS][0])
    if TCA_TBF_RATE64 in o:
        rate = u64(buf, o[TCA_TBF_RATE64])
    if TCA_TBF_PRATE64 in o:
        peak = u64(buf, o[TCA_TBF_PRATE64])
    return TbfParams(rate, peak, limit, buffer, mtu, linklayer & 0x0F)  # TC_LINKLAYER_MASK


def _counters(buf: bytes, a: dict[int, tuple[int, int]]) -> QdiscCounters | None:
    if TCA_STATS2 not in a:
        return None
    st = attrs(buf, *a[TCA_STATS2])
    nbytes = packets = qlen = backlog = drops = requeues = overlimits = 0
    if TCA_STATS_BASIC in st:
        nbytes, packets = _BASIC.unpack_from(buf, st[TCA_STATS_BASIC][0])
    if TCA_STATS_QUEUE in st:
        qlen, backlog, drops, requeues, overlimits = _QUEUE.unpack_from(buf, st[TCA_STATS_QUEUE][0])
    return QdiscCounters(nbytes, packets, drops, overlimits, requeues, backlog, qlen)


def htb_class(buf: bytes, m: Message) -> HtbClassRow | None:
    """An HTB class, or None for a class of another kind (or without parameters)."""
    _f, _p1, _p2, index, handle, parent, info = TCMSG.unpack_from(buf, m.start)
    a = attrs(buf, m.start + TCMSG.size, m.end)
    if string(buf, a.get(TCA_KIND)) != "htb" or TCA_OPTIONS not in a:
        return None
    o = attrs(buf, *a[TCA_OPTIONS])
    if TCA_HTB_PARMS not in o:
        return None
    p = o[TCA_HTB_PARMS][0]  # struct tc_htb_opt: rate (tc_ratespec, 12 bytes), ceil, buffer, cbuffer, quantum, level, prio
    rate, ceil = U32.unpack_from(buf, p + 8)[0], U32.unpack_from(buf, p + 20)[0]
    buffer, cbuffer, quantum, _level, prio = struct.unpack_from("=IIIII", buf, p + 24)
    if TCA_HTB_RATE64 in o:
        rate = u64(buf, o[TCA_HTB_RATE64])
    if TCA_HTB_CEIL64 in o:
        ceil = u64(buf, o[TCA_HTB_CEIL64])
    nbytes = packets = qlen = backlog = drops = overlimits = lends = borrows = tokens = ctokens = 0
    if TCA_STATS2 in a:
        st = attrs(buf, *a[TCA_STATS2])
        if TCA_STATS_BASIC in st:
            nbytes, packets = _BASIC.unpack_from(buf, st[TCA_STATS_BASIC][0])
        if TCA_STATS_QUEUE in st:
            qlen, backlog, drops, _req, overlimits = _QUEUE.unpack_from(buf, st[TCA_STATS_QUEUE][0])
        if TCA_STATS_APP in st and st[TCA_STATS_APP][1] - st[TCA_STATS_APP][0] >= _HTB_XSTATS.size:
            lends, borrows, _giants, tokens, ctokens = _HTB_XSTATS.unpack_from(buf, st[TCA_STATS_APP][0])
    return fast_new(HtbClassRow, (index, handle, parent, info, rate, ceil, buffer, cbuffer, quantum, prio, nbytes,
                                  packets, drops, overlimits, backlog, qlen, borrows, lends, tokens, ctokens))


def _mirred(buf: bytes, span: tuple[int, int]) -> tuple[int, int] | None:
    """(eaction, ifindex) of the first mirred action in a filter's action list (TCA_ACT_PRIO_n nests)."""
    for _prio, (s, e) in attr_list(buf, *span):
        act = attrs(buf, s, e)
        if string(buf, act.get(TCA_ACT_KIND)) != "mirred" or TCA_ACT_OPTIONS not in act:
            continue
        parms = attrs(buf, *act[TCA_ACT_OPTIONS]).get(TCA_MIRRED_PARMS)
        if parms is not None and parms[1] - parms[0] >= _TC_MIRRED.size:
            fields = _TC_MIRRED.unpack_from(buf, parms[0])
            return (fields[5], fields[6])
    return None


def tc_filter(buf: bytes, m: Message) -> FilterRow | None:
    """A filter, or None for structure (u32 hash tables and divisors, chain heads without a handle)."""
    _f, _p1, _p2, index, handle, parent, info = TCMSG.unpack_from(buf, m.start)
    if handle == 0:
        return None
    a = attrs(buf, m.start + TCMSG.size, m.end)
    kind = string(buf, a.get(TCA_KIND))
    base = dict(ifindex=index, parent=parent, prio=info >> 16, protocol=socket.ntohs(info & 0xFFFF),
                handle=handle, kind=kind)
    o = attrs(buf, *a[TCA_OPTIONS]) if TCA_OPTIONS in a else {}
    if kind == "u32":
        if handle & 0xFFF == 0 or TCA_U32_DIVISOR in o:
            return None
        keys: list[U32KeyRow] = []
        if TCA_U32_SEL in o:
            s0, e0 = o[TCA_U32_SEL]
            nkeys = buf[s0 + 2] if e0 - s0 >= _U32_SEL_HEAD else 0
            for i in range(nkeys):
                k = s0 + _U32_SEL_HEAD + 16 * i
                if k + 16 > e0:
                    break
                mask, val = _U32_KEY.unpack_from(buf, k)
                keys.append(U32KeyRow(val, mask, _I32.unpack_from(buf, k + 8)[0]))
        mark = None
        if TCA_U32_MARK in o:
            mv, mm = struct.unpack_from("=II", buf, o[TCA_U32_MARK][0])
            mark = (mv, mm) if (mv or mm) else None
        return FilterRow(**base, classid=u32(buf, o.get(TCA_U32_CLASSID)),
                         keys=tuple(sorted(keys, key=lambda k: k.offset)), mark=mark,
                         mirred=_mirred(buf, o[TCA_U32_ACT]) if TCA_U32_ACT in o else None)
    if kind == "bpf":
        return FilterRow(**base, classid=u32(buf, o.get(TCA_BPF_CLASSID)), name=string(buf, o.get(TCA_BPF_NAME)),
                         prog_id=u32(buf, o.get(TCA_BPF_ID)))
    return FilterRow(**base)
