"""The dcb backend's registry entry: RoCE traffic classes (ETS shares, max rates, DSCP app entries)."""

from __future__ import annotations

from shaperd.core.protocol import BackendSpec, NodeContext


def _factory(ctx: NodeContext):
    from shaperd.backends.dcb.backend import DcbBackend

    return DcbBackend(ctx.netns, str(ctx.roots.run) if ctx.roots is not None else "/run")



def _commands(sub, node_opts) -> None:
    from shaperd.backends.dcb import cli

    cli.register(sub, node_opts)


def _metrics(metrics, backend, _job) -> None:
    from shaperd.backends.dcb import metrics as m

    m.install(metrics, [backend])


def _status(inp):
    from shaperd.backends.dcb import status

    return status.sections(inp)


SPEC = BackendSpec(name="dcb", factory=_factory, order=50, commands=_commands,
                   metrics=_metrics, status=_status)
