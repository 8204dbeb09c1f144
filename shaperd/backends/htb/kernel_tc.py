"""htb's kernel side: its typed operations as tc requests (the HTB root, classes, leaves, u32 and bpf filters).

The codec handed to kernel/tc.py's writer; each encoder builds the same request ``tc`` would send
(byte for byte: tests/unit/test_htb_offload_bytes.py and the golden tc commands). Encoding only:
sending, batching and attributing answers is kernel/tc.py.
"""

from __future__ import annotations

from shaperd.backends.common.kernel_tc import CODEC as CLSACT_CODEC  # teardown may delete its clsact
from shaperd.backends.common.kernel_tc import HTB_TREE_CODEC
from shaperd.backends.common.kernel_tc import htb_class_options  # noqa: F401 - shared with the ingress IFB's tree
from shaperd.backends.common.kernel_tc import u32_options as _u32_options
from shaperd.backends.common.objects import ETH_P_ALL, ROOT_HANDLE
from shaperd.backends.htb import ops as htb
from shaperd.kernel import bpf
from shaperd.kernel.tc import (
    F_ADD, F_DEL, F_PUT, RTM_DELQDISC, RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTFILTER,
    TC_H_ROOT, Codec, htb_init, info, msg,
)
# The HTB class, leaf and u32 options moved to backends/common/kernel_tc.py (the ingress IFB's tree uses them too).


def _u32_filter(op: htb.AddU32Filter, fd: int | None):
    f = op.filter
    return msg(RTM_NEWTFILTER, F_ADD, op.ifindex, 0, f.parent, info(f.prio, f.protocol), "u32", _u32_options(f))


def _bpf_filter(op: htb.AddBpfFilter, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.filter.name], ["TCA_BPF_FLAGS", 0]]}
    return msg(RTM_NEWTFILTER, F_ADD, op.ifindex, 1, ROOT_HANDLE, info(op.filter.prio, ETH_P_ALL), "bpf", opts)


CODEC = CLSACT_CODEC | HTB_TREE_CODEC | Codec(
    encoders={
        htb.CreateRoot: lambda op, _fd: msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                            options=htb_init(op.root.default_minor, op.root.offload)),
        htb.ChangeRoot: lambda op, _fd: msg(RTM_NEWQDISC, F_DEL, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                            options=htb_init(op.root.default_minor, op.root.offload)),
        htb.DeleteRoot: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, ROOT_HANDLE, TC_H_ROOT),
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
