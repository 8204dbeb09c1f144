"""The vfrate backend's registry entry: SR-IOV VF min/max TX rates for the tenants' VFs."""

from __future__ import annotations

from shaperd.core.protocol import BackendSpec, NodeContext
from shaperd.core.roots import DEFAULT


def _factory(ctx: NodeContext):
    from shaperd.backends.vfrate.backend import VfRateBackend

    roots = ctx.roots if ctx.roots is not None else DEFAULT
    return VfRateBackend(ctx.writer, state_file=roots.run / "shaperd" / "vfrate-owned.json")


def _commands(sub, node_opts) -> None:
    from shaperd.backends.vfrate import cli

    cli.register(sub, node_opts)


def _metrics(metrics, backend, _job) -> None:
    from shaperd.backends.vfrate import metrics as m

    m.install(metrics, [backend])


def _status(inp):
    from shaperd.backends.vfrate import status

    return status.sections(inp)


SPEC = BackendSpec(name="vfrate", factory=_factory, order=70, commands=_commands, metrics=_metrics,
                   status=_status)
