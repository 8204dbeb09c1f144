"""``shaperd rdma ...``: the RDMA subcommands: the shared RDMA model's own, then each backend's.

Each module listed in ``SUBCOMMANDS`` exposes one function, ``register(subparsers, node_opts)``,
which adds its parser (with cli/node.node_opts where it reads the node) and sets ``fn`` to a
function taking the parsed arguments and returning an exit code (core/exitcodes.py). The
backends' own subcommands come from their registry entries (a spec's ``commands``, with the same
signature). Commands that plan one backend as the agent does get the engine's read-only
plan-and-diff as ``args.diff_one`` (they never import the engine).
"""

from __future__ import annotations

import importlib

from shaperd.cli.node import node_opts

# Modules of the RDMA model (not a backend's) that add an ``rdma`` subcommand (imported when the parser is built).
SUBCOMMANDS: tuple[str, ...] = ("shaperd.cli.rdma_opensm", "shaperd.report.rdma_status")


HELP = "RDMA: devices, service levels, NCCL settings, the subnet manager's tables"


def register_stub(sub) -> None:
    """The group's line in ``shaperd --help`` without its tree (cli/main.FULL_TREE: a command line that
    names rdma gets the whole tree, so this parser is never the one that parses)."""
    sub.add_parser("rdma", help=HELP)


def register(sub) -> None:
    from shaperd.engine.reconciler import diff_one
    from shaperd.engine.registry import REGISTRY

    p = sub.add_parser("rdma", help=HELP)
    rs = p.add_subparsers(dest="rdma_cmd", required=True)
    p.set_defaults(diff_one=diff_one)
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(rs, node_opts)
    for spec in REGISTRY.specs:
        if spec.commands is not None:
            spec.commands(rs, node_opts)
