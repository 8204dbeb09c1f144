"""The podingress backend's registry entry: a tbf ingress cap on each capped pod's host-side interface."""

from __future__ import annotations

from shaperd.backends.podingress import kernel_tc
from shaperd.core.protocol import BackendSpec, NodeContext
from shaperd.core.roots import DEFAULT


def _factory(ctx: NodeContext):
    from shaperd.backends.podingress import labels
    from shaperd.backends.podingress.backend import PodIngressBackend

    roots = ctx.roots if ctx.roots is not None else DEFAULT
    return PodIngressBackend(ctx.writer, take_over=ctx.take_over, record=labels.path_for(roots.run, ctx.netns),
                             netns=ctx.netns, run_root=str(roots.run))


def _metrics(metrics, backend, _job) -> None:
    from shaperd.backends.podingress import metrics as m

    m.install(metrics, backend)


def _status(inp):
    from shaperd.backends.podingress import status

    return status.sections(inp)


def _top(inp):
    from shaperd.backends.podingress import status

    return status.TopPlane(inp)


SPEC = BackendSpec(name="podingress", factory=_factory, order=35, codec=kernel_tc.CODEC, metrics=_metrics,
                   status=_status, top=_top)
