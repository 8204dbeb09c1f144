"""The tenant-ingress backend's registry entry: an IFB per shaped uplink, fed from its ingress, with an HTB tree."""

from __future__ import annotations

from shaperd.backends.ingress import kernel_tc
from shaperd.core.protocol import BackendSpec, NodeContext


def _factory(ctx: NodeContext):
    from shaperd.backends.ingress.backend import IngressBackend

    return IngressBackend(ctx.writer, pins=ctx.classifier_pins)


def _metrics(metrics, backend, _job) -> None:
    from shaperd.backends.ingress import metrics as m

    m.install(metrics, backend)


def _status(inp):
    from shaperd.backends.ingress import status

    return status.sections(inp)


def _top(inp):
    from shaperd.backends.ingress import status

    return status.TopPlane(inp)


# After htb and edt (10, 20): the uplink's own tree is in place before its inbound traffic is redirected.
SPEC = BackendSpec(name="ingress", factory=_factory, order=25, codec=kernel_tc.CODEC, metrics=_metrics,
                   status=_status, top=_top)
