"""The nccl backend's registry entry: per-tenant NCCL environment files (NCCL_IB_HCA, NCCL_IB_SL, NCCL_IB_TC)."""

from __future__ import annotations

from shaperd.core.protocol import BackendSpec, NodeContext
from shaperd.core.roots import DEFAULT


def _factory(ctx: NodeContext):
    from shaperd.backends.nccl.backend import RdmaBackend

    return RdmaBackend(ctx.roots if ctx.roots is not None else DEFAULT)


def _commands(sub, node_opts) -> None:
    from shaperd.backends.nccl import cli

    cli.register(sub, node_opts)


SPEC = BackendSpec(name="rdma", factory=_factory, order=60, commands=_commands)
