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
    p = sub.add_parser("status", help="live per-tenant class stats from the kernel")
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
    from shaperd.report import status

    return status.main(args)


def cmd_top(args) -> int:
    from shaperd.report import top

    return top.main(args)
