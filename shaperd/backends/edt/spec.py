"""The edt backend's registry entry: mq + sch_fq + a departure-time stamper, and its rate controller loop."""

from __future__ import annotations

from shaperd.backends.edt import kernel_stamper, kernel_tc
from shaperd.backends.edt.pins import stamper_pins
from shaperd.core.protocol import BackendSpec, NodeContext


def _factory(ctx: NodeContext):
    from shaperd.backends.edt.backend import EdtBackend

    return EdtBackend(ctx.writer, take_over=ctx.take_over, pins=ctx.classifier_pins,
                      stamper_pins=stamper_pins(ctx.capabilities, ctx.netns) if ctx.capabilities else None)


def _job(netns, caps):
    from shaperd.backends.edt.loop import Job

    return Job(netns, stamper_pins(caps, netns))


def _metrics(metrics, backend, job) -> None:
    from shaperd.backends.edt import metrics as m

    m.install(metrics, lambda: getattr(job(), "loop", None), [backend])


def _status(inp):
    from shaperd.backends.edt import status

    return status.sections(inp)


def _top(inp):
    from shaperd.backends.edt import status

    return status.TopPlane(inp)


SPEC = BackendSpec(
    name="edt", factory=_factory, order=20, codec=kernel_tc.CODEC,
    program_checks={"stamper_load": lambda root, read_only=False: kernel_stamper.probe_load(root, read_only=read_only)},
    job=_job, metrics=_metrics, status=_status, top=_top,
)
