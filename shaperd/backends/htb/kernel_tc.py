"""htb's kernel side: its typed operations as tc requests (the HTB root, classes, leaves, u32 and bpf filters).

The codec handed to kernel/tc.py's writer; each encoder builds the same request ``tc`` would send
(byte for byte: tests/unit/test_htb_offload_bytes.py and the golden tc commands). Encoding only:
sending, batching and attributing answers is kernel/tc.py.
"""

from __future__ import annotations

from shaperd.backends.common.kernel_tc import CODEC as CLSACT_CODEC  # teardown may delete its clsact
from shaperd.backends.common.objects import ETH_P_ALL, ROOT_HANDLE, HtbClass, LeafQdisc, U32Filter
from shaperd.backends.htb import ops as htb
from shaperd.core.units import bps_to_Bps, xmit_ticks
from shaperd.kernel import bpf
from shaperd.kernel.tc import (
    F_ADD, F_DEL, F_PUT, RTM_DELQDISC, RTM_DELTCLASS, RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER,
    TC_H_ROOT, Codec, htb_init, info, msg,
)

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
    return msg(RTM_NEWTFILTER, F_ADD, op.ifindex, 0, f.parent, info(f.prio, f.protocol), "u32", _u32_options(f))


def _bpf_filter(op: htb.AddBpfFilter, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.filter.name], ["TCA_BPF_FLAGS", 0]]}
    return msg(RTM_NEWTFILTER, F_ADD, op.ifindex, 1, ROOT_HANDLE, info(op.filter.prio, ETH_P_ALL), "bpf", opts)


CODEC = CLSACT_CODEC | Codec(
    encoders={
        htb.CreateRoot: lambda op, _fd: msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                            options=htb_init(op.root.default_minor, op.root.offload)),
        htb.ChangeRoot: lambda op, _fd: msg(RTM_NEWQDISC, F_DEL, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                            options=htb_init(op.root.default_minor, op.root.offload)),
        htb.DeleteRoot: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, ROOT_HANDLE, TC_H_ROOT),
        htb.CreateClass: lambda op, _fd: msg(RTM_NEWTCLASS, F_PUT, op.ifindex, op.cls.classid, op.cls.parent,
                                             kind="htb", options=htb_class_options(op.cls)),
        htb.ChangeClass: lambda op, _fd: msg(RTM_NEWTCLASS, F_PUT, op.ifindex, op.cls.classid, op.cls.parent,
                                             kind="htb", options=htb_class_options(op.cls)),
        htb.DeleteClass: lambda op, _fd: msg(RTM_DELTCLASS, F_DEL, op.ifindex, op.classid, 0),
        htb.SetLeaf: lambda op, _fd: msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.leaf.handle, op.leaf.parent,
                                         kind=op.leaf.kind, options=_leaf_options(op.leaf)),
        htb.AddU32Filter: _u32_filter,
        htb.AddBpfFilter: _bpf_filter,
        htb.DeleteFilter: lambda op, _fd: msg(RTM_DELTFILTER, F_DEL, op.ifindex, op.filter.handle, op.filter.parent,
                                              info(op.filter.prio, op.filter.protocol), op.filter.kind),
        htb.DeleteFilterGroup: lambda op, _fd: msg(RTM_DELTFILTER, F_DEL, op.ifindex, 0, op.parent,
                                                   info(op.prio, op.protocol)),
    },
    # The u32 path's bpf filters attach a generated program: how to build its bytecode, and its name.
    programs={
        htb.AddBpfFilter: lambda op: ({
            "cgroup": lambda: bpf.cgroup_classifier(op.filter.mapping),
            "mark": lambda: bpf.mark_classifier(op.filter.mapping),
        }.get(op.filter.kind, lambda: bpf.ifindex_classifier(dict(op.filter.mapping))), op.filter.name),
    },
)
