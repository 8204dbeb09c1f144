"""The htb backend's registry entry: HTB trees on the uplinks, classified by the eBPF map classifier or u32."""

from __future__ import annotations

from shaperd.backends.common import kernel_classifier
from shaperd.backends.htb import kernel_tc
from shaperd.core.protocol import BackendSpec, NodeContext


def _factory(ctx: NodeContext):
    from shaperd.backends.htb import podlabels
    from shaperd.backends.htb.backend import HtbBackend

    # The writer's namespace names the file where the context gives none (a reconciler built in a test).
    netns = ctx.netns if ctx.netns is not None else getattr(ctx.writer, "netns", None)
    labels = podlabels.path_for(ctx.roots.run, netns) if ctx.roots is not None and ctx.writer is not None else None
    return HtbBackend(ctx.writer, take_over=ctx.take_over, pins=ctx.classifier_pins, labels_file=labels)


def _metrics(metrics, backend, _job) -> None:
    from shaperd.backends.htb import metrics as m

    m.install(metrics, [backend])


def _status(inp):
    from shaperd.backends.htb import status

    return status.sections(inp)


def _top(inp):
    from shaperd.backends.htb import status

    return status.TopPlane(inp)


SPEC = BackendSpec(
    name="htb", factory=_factory, order=10, codec=kernel_tc.CODEC,
    # The map classifier is shared with edt (backends/common); htb supplies the probe's checks of it.
    program_checks={"classifier_attach": lambda ipr, ifindex: kernel_classifier.probe(ipr, ifindex),
                    "classifier_load": lambda root, read_only=False: kernel_classifier.probe_load(
                        root, read_only=read_only)},
    metrics=_metrics, status=_status, top=_top,
)
