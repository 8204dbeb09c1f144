"""podingress's kernel side: the tbf 7368: root qdisc on a pod's host interface, set and deleted, as tc requests.

The codec handed to kernel/tc.py's writer. Encoding only. The request is the one iproute2 (tc 6.1) sends for
``tc qdisc replace dev X root handle 7368: tbf rate R burst B limit L`` (tests/unit/test_podingress_bytes.py
compares them byte for byte): TCA_OPTIONS holds TCA_TBF_PARMS (struct tc_tbf_qopt), TCA_TBF_BURST,
TCA_TBF_RATE64 where the rate is 2^32 bytes/s or more, and the 256-entry rate table TCA_TBF_RTAB, in that
order. pyroute2's tbf codec has neither TCA_TBF_BURST nor the 64-bit rate, hence the message class here.

The kernel takes the bucket from TCA_TBF_BURST (tbf_change: buffer = the time ``burst`` bytes take at the
rate) and the rate from TCA_TBF_RATE64 or the ratespec; the ratespec's linklayer is ethernet, so the rate
table is not used either (it is sent as tc sends it). tc's own arithmetic is kept for the fields it fills:
times in whole microseconds, then psched ticks (15.625 per microsecond, /proc/net/psched on every kernel
since 2.6.31), each step truncated as tc's C conversions truncate; the buffer is computed from the 32-bit
rate, as tc 6.1 does (the kernel ignores it here).
"""

from __future__ import annotations

import struct

from pyroute2.netlink import nla, nlmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from shaperd.backends.podingress import ops as pi
from shaperd.backends.podingress.objects import OWN_KIND, ROOT_HANDLE, TC_H_ROOT, TbfSpec
from shaperd.kernel.tc import F_DEL, F_PUT, RTM_DELQDISC, RTM_NEWQDISC, Codec, msg

TICKS_PER_US = 15.625  # tc's tick_in_usec: t2us / us2t = 1000 / 64, clock factor 1
US_PER_S = 1_000_000
TC_LINKLAYER_ETHERNET = 1
RTAB_MTU = 2047  # tc_calc_rtable's mtu when none is given: cell_log 3
_RATESPEC = struct.Struct("=BBHhHI")  # cell_log, linklayer, overhead, cell_align, mpu, rate
_U32_MAX = 0xFFFFFFFF


def xmittime(rate_Bps: int, size: int) -> int:
    """tc_calc_xmittime: ticks ``size`` bytes take at ``rate_Bps`` (microseconds truncated, then ticks)."""
    us = int(US_PER_S * (float(size) / float(rate_Bps))) & _U32_MAX  # tc_core_time2tick takes an unsigned int
    return int(us * TICKS_PER_US) & _U32_MAX


def cell_log(mtu: int = RTAB_MTU) -> int:
    n = 0
    while (mtu >> n) > 255:
        n += 1
    return n


def rtab(rate32: int, log: int) -> bytes:
    """tc_calc_rtable's 256 transmit times, one per cell of 2^log bytes (no mpu, ethernet: sizes as they are)."""
    return struct.pack("=256I", *(xmittime(rate32, (i + 1) << log) for i in range(256)))


def tbf_options(t: TbfSpec) -> dict:
    rate32 = min(t.rate_Bps, _U32_MAX)
    log = cell_log()
    rate = _RATESPEC.pack(log, TC_LINKLAYER_ETHERNET, 0, -1, 0, rate32)
    peak = _RATESPEC.pack(0, 0, 0, 0, 0, 0)
    parms = rate + peak + struct.pack("=III", t.limit_bytes, xmittime(rate32, t.burst_bytes), 0)
    attrs = [["TCA_TBF_PARMS", parms], ["TCA_TBF_BURST", t.burst_bytes]]
    if t.rate_Bps > _U32_MAX:
        attrs.append(["TCA_TBF_RATE64", t.rate_Bps])
    attrs.append(["TCA_TBF_RTAB", rtab(rate32, log)])
    return {"attrs": attrs}


class _TbfRequest(nlmsg):
    """A tcmsg whose TCA_OPTIONS are tbf's, every attribute uapi pkt_sched.h has (TCA_TBF_*).

    Derived from nlmsg, not tcmsg: pyroute2 compiles a class's attribute table once and marks it on the class,
    so a subclass of an already compiled tcmsg would inherit tcmsg's table (and encode pyroute2's tbf)."""

    prefix = "TCA_"
    fields = tcmsg.fields
    nla_map = (("TCA_UNSPEC", "none"), ("TCA_KIND", "asciiz"), ("TCA_OPTIONS", "tbf_options"))

    class tbf_options(nla):
        nla_map = (("TCA_TBF_UNSPEC", "none"), ("TCA_TBF_PARMS", "cdata"), ("TCA_TBF_RTAB", "cdata"),
                   ("TCA_TBF_PTAB", "cdata"), ("TCA_TBF_RATE64", "uint64"), ("TCA_TBF_PRATE64", "uint64"),
                   ("TCA_TBF_BURST", "uint32"), ("TCA_TBF_PBURST", "uint32"), ("TCA_TBF_PAD", "hex"))


def _set(op: pi.SetPodTbf, _fd):
    m = _TbfRequest()
    m["index"], m["handle"], m["parent"], m["info"] = op.ifindex, ROOT_HANDLE, TC_H_ROOT, 0
    m["header"]["type"], m["header"]["flags"] = RTM_NEWQDISC, F_PUT
    m["attrs"] = [["TCA_KIND", OWN_KIND], ["TCA_OPTIONS", tbf_options(op.pod.tbf)]]
    return m


CODEC = Codec(encoders={
    pi.SetPodTbf: _set,
    # What `tc qdisc del dev X root handle 7368:` sends (no kind).
    pi.DeletePodTbf: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, ROOT_HANDLE, TC_H_ROOT),
})
