"""The tenant-ingress backend's kernel side: its typed operations as rtnetlink requests (the IFB, its tree, the redirect).

The codec handed to kernel/tc.py's writer. The IFB's link requests are kernel/link.py's (what ``ip link``
sends); the redirect is what ``tc filter add dev UPLINK ingress prio 29545 protocol all u32 match u32 0 0
action mirred egress redirect dev IFB`` sends, byte for byte (tests/unit/test_ingress_codec.py, recorded
with strace); the HTB class, leaf and u32 options are the ones htb writes (backends/common/kernel_tc.py).
Encoding only: sending, batching and attributing answers is kernel/tc.py.
"""

from __future__ import annotations

from shaperd.backends.common.kernel_tc import CODEC as CLSACT_CODEC
from shaperd.backends.common.kernel_tc import HTB_TREE_CODEC, TC_U32_TERMINAL, u32_options
from shaperd.backends.common.objects import ETH_P_ALL
from shaperd.backends.ingress import ops
from shaperd.backends.ingress.objects import INGRESS_HOOK, PRIO_REDIRECT, TCA_EGRESS_REDIR
from shaperd.kernel import link
from shaperd.kernel.tc import (
    F_ADD, F_DEL, F_PUT, RTM_DELQDISC, RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTFILTER,
    TC_H_ROOT, Codec, htb_init, info, msg,
)

TC_ACT_STOLEN = 4  # what mirred's redirect returns (tc's m_mirred.c sets it for "redirect")


def redirect_options(ifb_ifindex: int) -> dict:
    """u32 ``match u32 0 0`` (every packet, terminal) with one action: mirred egress redirect to the IFB."""
    parms = {"index": 0, "capab": 0, "action": TC_ACT_STOLEN, "refcnt": 0, "bindcnt": 0,
             "eaction": TCA_EGRESS_REDIR, "ifindex": ifb_ifindex}
    act = {"attrs": [["TCA_ACT_KIND", "mirred"], ["TCA_ACT_OPTIONS", {"attrs": [["TCA_MIRRED_PARMS", parms]]}]]}
    return {"attrs": [["TCA_U32_ACT", {"attrs": [["TCA_ACT_PRIO_1", act]]}],
                      ["TCA_U32_SEL", {"flags": TC_U32_TERMINAL, "keys": ["0x0/0x0+0"]}]]}


def _add_redirect(op: ops.AddRedirect, _fd):
    if op.ifb_ifindex <= 0:
        raise ValueError(f"redirect to {op.ifb}: its ifindex is not known")
    return msg(RTM_NEWTFILTER, F_ADD, op.ifindex, 0, INGRESS_HOOK, info(PRIO_REDIRECT, ETH_P_ALL), "u32",
               redirect_options(op.ifb_ifindex))


CODEC = CLSACT_CODEC | HTB_TREE_CODEC | Codec(encoders={
    ops.CreateIfb: lambda op, _fd: link.new_link(op.device, "ifb"),
    ops.SetIfbUp: lambda op, _fd: link.set_up(op.ifindex),
    ops.DeleteIfb: lambda op, _fd: link.delete_link(op.ifindex),
    ops.CreateRoot: lambda op, _fd: msg(RTM_NEWQDISC, F_PUT, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                        options=htb_init(op.root.default_minor)),
    ops.ChangeRoot: lambda op, _fd: msg(RTM_NEWQDISC, F_DEL, op.ifindex, op.root.handle, TC_H_ROOT, kind="htb",
                                        options=htb_init(op.root.default_minor)),
    ops.DeleteRoot: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, op.handle, TC_H_ROOT),
    ops.AddDstFilter: lambda op, _fd: msg(RTM_NEWTFILTER, F_ADD, op.ifindex, 0, op.filter.parent,
                                          info(op.filter.prio, op.filter.protocol), "u32", u32_options(op.filter)),
    ops.DeleteFilter: lambda op, _fd: msg(RTM_DELTFILTER, F_DEL, op.ifindex, op.filter.handle, op.filter.parent,
                                          info(op.filter.prio, op.filter.protocol), op.filter.kind),
    ops.AddRedirect: _add_redirect,
    # What `tc filter del dev UPLINK ingress prio 29545 protocol all` sends: the whole tcf_proto at that prio.
    ops.DeleteRedirect: lambda op, _fd: msg(RTM_DELTFILTER, F_DEL, op.ifindex, 0, INGRESS_HOOK,
                                            info(op.prio, op.protocol)),
})
