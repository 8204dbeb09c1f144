"""marks' kernel side: the clsact qdisc and the mark setter on a pod interface's ingress, as tc requests.

The codec handed to kernel/tc.py's writer. Encoding only.
"""

from __future__ import annotations

from shaperd.backends.marks import ops as marks
from shaperd.backends.common.clsact import TC_H_INGRESS_PARENT
from shaperd.backends.common.kernel_tc import CODEC as CLSACT_CODEC
from shaperd.backends.marks.objects import PRIO_MARK_INGRESS
from shaperd.kernel import bpf
from shaperd.kernel.tc import ETH_P_ALL, F_DEL, F_PUT, RTM_DELTFILTER, RTM_NEWTFILTER, Codec, info, msg


def _set_mark(op: marks.SetMark, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.mark.name], ["TCA_BPF_FLAGS", 1]]}  # direct action
    return msg(RTM_NEWTFILTER, F_PUT, op.ifindex, 1, TC_H_INGRESS_PARENT, info(PRIO_MARK_INGRESS, ETH_P_ALL),
               "bpf", opts)


CODEC = CLSACT_CODEC | Codec(
    encoders={
        marks.SetMark: _set_mark,
        marks.DeleteMark: lambda op, _fd: msg(RTM_DELTFILTER, F_DEL, op.ifindex, 1, TC_H_INGRESS_PARENT,
                                              info(PRIO_MARK_INGRESS, ETH_P_ALL), "bpf"),
    },
    programs={marks.SetMark: lambda op: ((lambda: bpf.mark_setter(op.mark.value, op.mark.mask)), op.mark.name)},
)
