"""The clsact qdisc as a tc request: the part of the tc backends' codecs they share (common/clsact.py).

Encoding only; kernel/tc.py sends it.
"""

from __future__ import annotations

from shaperd.backends.common.clsact import CLSACT_HANDLE, TC_H_CLSACT, AddClsact
from shaperd.kernel.tc import F_ADD, RTM_NEWQDISC, Codec, msg

CODEC = Codec(encoders={
    AddClsact: lambda op, _fd: msg(RTM_NEWQDISC, F_ADD, op.ifindex, CLSACT_HANDLE, TC_H_CLSACT, kind="clsact"),
})
