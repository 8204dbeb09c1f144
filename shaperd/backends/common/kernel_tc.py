"""The clsact qdisc's add and delete as tc requests: the part of the tc backends' codecs they share (common/clsact.py).

Encoding only; kernel/tc.py sends it.
"""

from __future__ import annotations

from shaperd.backends.common.clsact import CLSACT_HANDLE, TC_H_CLSACT, AddClsact, DeleteClsact
from shaperd.kernel.tc import F_ADD, F_DEL, RTM_DELQDISC, RTM_NEWQDISC, Codec, msg

CODEC = Codec(encoders={
    AddClsact: lambda op, _fd: msg(RTM_NEWQDISC, F_ADD, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact"),
    # What `tc qdisc del dev X clsact` sends (tests/unit/fixtures/clsact/del_clsact.strace).
    DeleteClsact: lambda op, _fd: msg(RTM_DELQDISC, F_DEL, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact"),
})
