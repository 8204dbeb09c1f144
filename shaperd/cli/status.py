"""``shaperd status`` and ``shaperd top``: what the kernel counts per tenant, read live. Read only.

- ``status``: per-tenant class stats (and the edt, RDMA, NIC and classifier
  sections), once or ``--watch``; report/status.py.
- ``top``: rate against guarantee and limit, drops, borrowing, refreshed
  every ``--interval``; report/top.py.

This module only adds the commands' arguments; the readers load when a command runs.
"""

from __future__ import annotations

from shaperd.cli.node import node_opts
from shaperd.core import format as output


def register(sub) -> None:
    p = sub.add_parser("status", help="live per-tenant class stats from the kernel, and what is not enforced "
                       "(exit 1 a device unreadable or left alone, 2 a plan problem)")
    node_opts(p)
    output.add_output(p)
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="rate window (default 1)")
    p.set_defaults(fn=cmd_status)

    p = sub.add_parser("top", help="live per-tenant view: rate against guarantee and limit, drops, borrowing")
    node_opts(p)
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period (default 1)")
    p.add_argument("--once", action="store_const", const=1, dest="iterations",
                   help="print one view (after one interval) and exit")
    p.add_argument("-n", "--iterations", type=int, default=None, metavar="N",
                   help="print N views and exit (default: until interrupted)")
    output.add_output(p, "text (default); json|yaml: one document per view (JSON: one line each)")
    p.set_defaults(fn=cmd_top)


def cmd_status(args) -> int:
    """Live class stats, then what the node does not enforce. Exit 0: all planned is enforced; 1: a device
    could not be read, or a target is left alone (degraded; ``apply`` exits 1 there too); 2: the tenants file
    asks for what this node cannot plan (degraded by a plan problem; as ``plan`` and ``apply``)."""
    from shaperd.report import status

    return status.main(args, degraded=_status_degraded(args))


def _status_degraded(args):
    """A function for status's "degraded" line (report/degraded.py): the plan and read of ``diff``, nothing written;
    None without a valid tenants file (status then shows classes by id only)."""
    from shaperd.core.config import load_file
    from shaperd.core.errors import ConfigError

    try:
        cfg = load_file(args.config)
    except ConfigError:
        return None
    from shaperd.cli.node import reconciler
    from shaperd.report.degraded import of_report

    opened = []

    def degraded():
        if not opened:
            opened.append(reconciler(args))  # probed once, as diff does (root only); --watch re-reads per window
        return of_report(opened[0].diff(cfg))

    return degraded


def cmd_top(args) -> int:
    from shaperd.report import top

    return top.main(args)
