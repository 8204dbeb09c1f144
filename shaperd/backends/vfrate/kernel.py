"""SR-IOV VF rates over rtnetlink: the write (RTM_NEWLINK on the PF) and the read-back (RTM_GETLINK).

The write is what ``ip link set dev PF vf N min_tx_rate A max_tx_rate B``
sends (iproute2 ip/iplink.c): an ifinfomsg for the PF, then
IFLA_VFINFO_LIST > IFLA_VF_INFO > IFLA_VF_RATE, ``struct ifla_vf_rate
{u32 vf, min_tx_rate, max_tx_rate}`` in Mbit/s (include/uapi/linux/if_link.h),
nests without NLA_F_NESTED, as iproute2 sends them. It is built with
pyroute2's ifinfmsg and sent on the reconciler's writer (kernel/nlwriter.py), the same
socket (and namespace) as the tc writes (kernel/tc.py); the bytes are
checked against a capture of iproute2's (tests/unit/fixtures/vfrate/).

The read is one RTM_GETLINK for the PF's ifindex with IFLA_EXT_MASK =
RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS (as ``ip link show`` asks), through
the raw reader of kernel/rtnl.py (deadline, errors as KernelError), decoded
here by hand: IFLA_VF_RATE, else IFLA_VF_TX_RATE (max only) for drivers
that report just that. This module knows how to write and read VF rates;
which VFs and which rates is the vfrate backend's decision.
"""

from __future__ import annotations

import errno as errno_mod
import os
import struct
from dataclasses import dataclass

from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from shaperd.core.protocol import ApplyResult
from shaperd.backends.vfrate.ops import SetVfRate
from shaperd.kernel import nlmsg
from shaperd.kernel import rtnl_rows as rows

RTM_GETLINK = 18
IFLA_IFNAME, IFLA_NUM_VF, IFLA_VFINFO_LIST, IFLA_EXT_MASK = 3, 21, 22, 29
IFLA_VF_INFO = 1
IFLA_VF_TX_RATE, IFLA_VF_RATE = 3, 6
RTEXT_FILTER_VF, RTEXT_FILTER_SKIP_STATS = 1 << 0, 1 << 3
VF_RATE = struct.Struct("=III")  # struct ifla_vf_rate: vf, min_tx_rate, max_tx_rate (Mbit/s)
VF_TX_RATE = struct.Struct("=II")  # struct ifla_vf_tx_rate: vf, rate (max, Mbit/s)
# What a driver answers when it refuses the request as asked (i40e/ixgbe: a minimum at all; ice: one with DCB on).
REFUSED_ERRNOS = frozenset({errno_mod.EINVAL, errno_mod.EOPNOTSUPP})


@dataclass(frozen=True)
class VfRateRow:
    """One VF's rates as the PF reports them. ``min_mbps`` None: the driver reports only IFLA_VF_TX_RATE."""

    vf: int
    min_mbps: int | None
    max_mbps: int


@dataclass(frozen=True)
class PfVfs:
    """A PF's VF rates; ``reported`` False when the link carries no IFLA_VFINFO_LIST (no SR-IOV, or a veth)."""

    ifindex: int
    name: str
    num_vfs: int | None
    vfs: tuple[VfRateRow, ...] = ()
    reported: bool = False

    def vf(self, n: int) -> VfRateRow | None:
        return next((v for v in self.vfs if v.vf == n), None)


# ------------------------------------------------------------------ write


def build_message(op: SetVfRate) -> ifinfmsg:
    """The RTM_NEWLINK request for one VF's rates (what iproute2's ``ip link set ... vf N ...`` sends)."""
    m = ifinfmsg()
    m["family"], m["index"] = 0, op.ifindex
    m["header"]["type"], m["header"]["flags"] = RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK
    rate = {"vf": op.vf, "min_tx_rate": op.min_mbps, "max_tx_rate": op.max_mbps}
    m["attrs"] = [["IFLA_VFINFO_LIST", {"attrs": [["IFLA_VF_INFO", {"attrs": [["IFLA_VF_RATE", rate]]}]]}]]
    return m


def encode(op: SetVfRate, seq: int = 0) -> bytes:
    """The request's bytes (for tests: compared with iproute2's, seq and pid aside)."""
    m = build_message(op)
    m["header"]["sequence_number"] = seq
    m.encode()
    return bytes(m.data)


def apply_ops(ipr, ops: list[SetVfRate], batch: bool = True) -> ApplyResult:
    """Send each write on its own and wait for its answer.

    VF rate writes are few (one per VF) and each is a firmware command on
    the NIC; one per request attributes every refusal to its VF, so there
    is no batch to fail part-way (``batch`` is accepted and ignored). A
    refusal is a KernelError ("set VF 3 rates on ens1f0: Invalid argument",
    with the errno) that the backend inspects.
    """
    res = ApplyResult()
    for op in ops:
        try:
            ipr.nlm_request_batch([build_message(op)])
        except NetlinkError as e:
            res.failed.append((op, op.error(os.strerror(e.code), e.code)))
        except OSError as e:
            res.failed.append((op, op.error(e.strerror or str(e), e.errno)))
        else:
            res.applied.append(op)
    return res


# ------------------------------------------------------------------ read


def get_request(ifindex: int) -> bytes:
    """The body of RTM_GETLINK for one PF with its VF info and without statistics."""
    return rows.IFINFOMSG.pack(0, 0, 0, ifindex, 0, 0) + nlmsg.rta(
        IFLA_EXT_MASK, nlmsg.U32.pack(RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS))


def decode(buf: bytes, msg: nlmsg.Message) -> PfVfs:
    """An RTM_NEWLINK reply -> the PF's VF rates."""
    _family, _pad, _type, ifindex, _flags, _change = rows.IFINFOMSG.unpack_from(buf, msg.start)
    top = nlmsg.attrs(buf, msg.start + rows.IFINFOMSG.size, msg.end)
    name = nlmsg.string(buf, top.get(IFLA_IFNAME))
    num = nlmsg.u32(buf, top[IFLA_NUM_VF]) if IFLA_NUM_VF in top else None
    span = top.get(IFLA_VFINFO_LIST)
    if span is None:
        return PfVfs(ifindex, name, num)
    out = []
    for typ, (start, end) in nlmsg.attr_list(buf, span[0], span[1]):
        if typ != IFLA_VF_INFO:
            continue
        info = nlmsg.attrs(buf, start, end)
        r = info.get(IFLA_VF_RATE)
        if r is not None and r[1] - r[0] >= VF_RATE.size:
            vf, lo, hi = VF_RATE.unpack_from(buf, r[0])
            out.append(VfRateRow(vf, lo, hi))
            continue
        t = info.get(IFLA_VF_TX_RATE)
        if t is not None and t[1] - t[0] >= VF_TX_RATE.size:
            vf, hi = VF_TX_RATE.unpack_from(buf, t[0])
            out.append(VfRateRow(vf, None, hi))
    return PfVfs(ifindex, name, num, tuple(sorted(out, key=lambda v: v.vf)), True)


def read_pf(reader, ifindex: int, device: str) -> PfVfs | None:
    """The PF's VF rates (``reader``: kernel.rtnl.RtnlReader or its CachedReads); None when the link is gone."""
    inner = getattr(reader, "reader", reader)
    return inner._get(RTM_GETLINK, get_request(ifindex), decode, "VF rates", device,
                      frozenset({errno_mod.ENODEV}))
