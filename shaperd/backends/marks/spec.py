"""The marks backend's registry entry: skb->mark programs on the host side of pod interfaces."""

from __future__ import annotations

from shaperd.backends.marks import kernel_tc
from shaperd.core.protocol import BackendSpec, NodeContext


def _factory(ctx: NodeContext):
    from shaperd.backends.marks.backend import MarksBackend

    return MarksBackend(ctx.writer)


SPEC = BackendSpec(name="marks", factory=_factory, order=30, codec=kernel_tc.CODEC)
