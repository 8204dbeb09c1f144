"""``shaperd rdma ...``: the RDMA subcommands, one module each.

Each module listed in ``SUBCOMMANDS`` (the backends' own command modules,
shaperd/backends/<name>/cli.py, and the shared RDMA model's) exposes one
function, ``register(subparsers, node_opts)``, which adds its parser (with
cli/node.node_opts where it reads the node) and sets ``fn`` to a function
taking the parsed arguments and returning an exit code (core/exitcodes.py).
"""

from __future__ import annotations

import importlib

from shaperd.cli.node import node_opts

# Modules that add an ``rdma`` subcommand (imported when the parser is built).
SUBCOMMANDS: tuple[str, ...] = ("shaperd.backends.nccl.cli", "shaperd.cli.rdma_opensm", "shaperd.report.rdma_status",
                               "shaperd.backends.devlink.cli", "shaperd.backends.vfrate.cli", "shaperd.backends.dcb.cli")


def register(sub) -> None:
    if not SUBCOMMANDS:
        return
    p = sub.add_parser("rdma", help="RDMA: devices, service levels, NCCL settings, the subnet manager's tables")
    rs = p.add_subparsers(dest="rdma_cmd", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(rs, node_opts)
