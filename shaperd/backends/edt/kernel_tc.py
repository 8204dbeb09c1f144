"""edt's kernel side as tc requests: mq or sch_fq at the root, sch_fq per TX queue, the stamper on clsact egress.

The codec handed to kernel/tc.py's writer; the stamper's program and maps are made and filled by
kernel_stamper.py first (the codec's loader). Encoding only.
"""

from __future__ import annotations

from shaperd.backends.common.clsact import TC_H_EGRESS_PARENT as _TC_H_EGRESS_PARENT
from shaperd.backends.common.kernel_tc import CODEC as CLSACT_CODEC
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.backends.edt import ops as edt
from shaperd.backends.edt.objects import STAMPER_HANDLE
from shaperd.kernel.tc import ETH_P_ALL, F_DEL, F_PUT, RTM_DELQDISC, RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTFILTER
from shaperd.kernel.tc import TC_H_ROOT, Codec, info, msg


def _fq_options(fq) -> dict:
    return {"attrs": [["TCA_FQ_PLIMIT", fq.limit_packets], ["TCA_FQ_FLOW_PLIMIT", fq.flow_limit_packets],
                      ["TCA_FQ_HORIZON", fq.horizon_us], ["TCA_FQ_HORIZON_DROP", int(fq.horizon_drop)]]}


def _edt_root(op: edt.SetRoot, fd: int | None):
    options = _fq_options(op.fq) if op.kind == "fq" and op.fq is not None else None
    return msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.handle, TC_H_ROOT, kind=op.kind, options=options)


def _edt_stamper(op: edt.SetStamper, fd: int | None):
    opts = {"attrs": [["TCA_BPF_FD", fd], ["TCA_BPF_NAME", op.stamper.name], ["TCA_BPF_FLAGS", 1]]}  # direct action
    return msg(RTM_NEWTFILTER, F_PUT, op.ifindex, STAMPER_HANDLE, _TC_H_EGRESS_PARENT,
               info(op.stamper.prio, ETH_P_ALL), "bpf", opts)


CODEC = CLSACT_CODEC | Codec(
    encoders={
        edt.SetRoot: _edt_root,
        edt.SetFq: lambda op, _fd: msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.fq.handle, op.fq.parent, kind="fq",
                                       options=_fq_options(op.fq)),
        edt.DeleteRoot: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, op.handle, TC_H_ROOT),
        edt.SetStamper: _edt_stamper,
        edt.DeleteStamper: lambda op, _fd: msg(RTM_DELTFILTER, F_DEL, op.ifindex, STAMPER_HANDLE,
                                               _TC_H_EGRESS_PARENT, info(op.prio, ETH_P_ALL), "bpf"),
    },
    # The stamper's maps are made and filled first; with a store, the program and maps are pinned as the
    # device's entry (kernel_stamper.py).
    loaders={
        edt.SetStamper: lambda op, pins: edt_prog.load_fresh(op.stamper.horizon_ns, dict(op.initial_q16), pins,
                                                             op.device, dict(op.initial_parents)),
    },
)
