"""What the tc backends' codecs share: the clsact qdisc's add and delete, and HTB class, leaf and u32 options.

The clsact requests are common/clsact.py's operations; the options are those of htb's uplink tree and of
the tenant-ingress IFB's tree (moved here from backends/htb/kernel_tc.py, unchanged).

Encoding only; kernel/tc.py sends it.
"""

from __future__ import annotations

from shaperd.backends.common import htb_ops
from shaperd.backends.common.clsact import CLSACT_HANDLE, TC_H_CLSACT, AddClsact, DeleteClsact
from shaperd.backends.common.objects import HtbClass, LeafQdisc, U32Filter
from shaperd.core.units import bps_to_Bps, xmit_ticks
from shaperd.kernel.tc import F_ADD, F_DEL, F_PUT, RTM_DELQDISC, RTM_DELTCLASS, RTM_NEWQDISC, RTM_NEWTCLASS, Codec, msg

TC_U32_TERMINAL = 1
TC_LINKLAYER_ETHERNET = 1
U32_MAX = 0xFFFFFFFF


def htb_class_options(c: HtbClass) -> dict:
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


def leaf_options(q: LeafQdisc) -> dict:
    if q.kind in ("bfifo", "pfifo"):
        return {"limit": q.limit}
    if q.kind == "fq_codel":
        return {"attrs": [["TCA_FQ_CODEL_LIMIT", q.limit]]}
    raise ValueError(f"unsupported leaf qdisc {q.kind}")


def u32_options(f: U32Filter) -> dict:
    # pyroute2 shifts the offset per leading zero byte of a zero-padded mask; an all-zero mask (tc's
    # "match u32 0 0", a scoped tenant's catch-all) must be written unpadded or it fails to parse.
    keys = [f"0x{k.value:08x}/0x{k.mask:08x}+{k.offset}" if k.mask else f"0x0/0x0+{k.offset}" for k in f.keys]
    attrs = [["TCA_U32_CLASSID", f.classid], ["TCA_U32_SEL", {"flags": TC_U32_TERMINAL, "keys": keys}]]
    if f.mark is not None:
        attrs.append(["TCA_U32_MARK", {"val": f.mark[0], "mask": f.mark[1], "success": 0}])
    return {"attrs": attrs}


CODEC = Codec(encoders={
    AddClsact: lambda op, _fd: msg(RTM_NEWQDISC, F_ADD, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact"),
    # What `tc qdisc del dev X clsact` sends (tests/unit/fixtures/clsact/del_clsact.strace).
    DeleteClsact: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact"),
})


# The HTB class and leaf writes of both trees (htb's, the tenant-ingress IFB's): one encoder each.
HTB_TREE_CODEC = Codec(encoders={
    htb_ops.CreateClass: lambda op, _fd: msg(RTM_NEWTCLASS, F_PUT, op.ifindex, op.cls.classid, op.cls.parent,
                                             kind="htb", options=htb_class_options(op.cls)),
    htb_ops.ChangeClass: lambda op, _fd: msg(RTM_NEWTCLASS, F_PUT, op.ifindex, op.cls.classid, op.cls.parent,
                                             kind="htb", options=htb_class_options(op.cls)),
    htb_ops.DeleteClass: lambda op, _fd: msg(RTM_DELTCLASS, F_DEL, op.ifindex, op.classid, 0),
    htb_ops.SetLeaf: lambda op, _fd: msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.leaf.handle, op.leaf.parent,
                                         kind=op.leaf.kind, options=leaf_options(op.leaf)),
})
