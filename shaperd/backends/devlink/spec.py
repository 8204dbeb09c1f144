"""The devlink backend's registry entry: rate groups (tx_share/tx_max) for the tenants' VFs on switchdev NICs."""

from __future__ import annotations

from shaperd.core.protocol import BackendSpec, NodeContext


def _factory(ctx: NodeContext):
    from shaperd.backends.devlink.backend import DevlinkBackend

    return DevlinkBackend()



def _commands(sub, node_opts) -> None:
    from shaperd.backends.devlink import cli

    cli.register(sub, node_opts)


def _metrics(metrics, backend, _job) -> None:
    from shaperd.backends.devlink import metrics as m

    m.install(metrics, backend)


def _status(inp):
    from shaperd.backends.devlink import status

    return status.sections(inp)


SPEC = BackendSpec(name="devlink", factory=_factory, order=40, commands=_commands,
                   metrics=_metrics, status=_status)
