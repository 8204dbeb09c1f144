"""``shaperd rdma devlink``: each tenant's devlink rate node on this node: planned, in the kernel, and what differs.

Read-only: plans from this node's sysfs inventory, reads the rate tree
(one RATE_GET dump, a port dump where there are leaves) and prints the diff
without writing. A kernel without the devlink family prints one line and
exits 0: there is nothing to group here.
"""

from __future__ import annotations

import sys

from shaperd.core import format as output
from shaperd.core.exitcodes import EXIT_OK


def register(sub, node_opts) -> None:
    p = sub.add_parser("devlink", help="tenants' devlink rate nodes: planned, in the kernel, pending writes",
                       description=__doc__.splitlines()[0])
    node_opts(p)
    output.add_output(p)
    p.set_defaults(fn=run)


def collect(cfg, roots, open_nl) -> dict:
    """The ``--json`` object (also ``shaperd status``'s ``devlink_rates``); ``open_nl`` makes the devlink socket."""
    from shaperd.backends.devlink.backend import DevlinkBackend
    from shaperd.core.protocol import PlanInput
    from shaperd.discovery import rdma
    from shaperd.core.inventory import Capabilities, Inventory
    from shaperd.core.tenancy import tenancy

    devices, notes = rdma.discover(roots)
    inv = Inventory(rdma=devices, rdma_notes=notes)
    b = DevlinkBackend(open_nl)
    support = b.probe(Capabilities())
    desired = b.plan(PlanInput(cfg, inv, tenancy(cfg, inv)))
    out: dict = {"enabled": support.enabled, "family_absent": b.family_absent, "notes": list(support.notes),
                 "warnings": list(desired.warnings), "problems": [str(p) for p in desired.problems],
                 "nodes": [], "devices": []}
    kernel: dict = {}
    if support.enabled:
        try:
            observed = b.observe(None, inv)
            kernel = {(r.instance, r.node): r for r in observed.rates if r.node is not None}
            for d in b.diff(desired, observed):
                out["devices"].append({"device": d.target, "pending": [op.describe() for op in d.ops],
                                       "left_alone": d.blocked, "error": d.error})
        finally:
            b.close()
    for n in desired.nodes:
        k = kernel.get((n.instance, n.node))
        out["nodes"].append({"tenant": n.tenant, "device": n.instance, "node": n.node,
                             "tx_share_Bps": n.tx_share_Bps, "tx_max_Bps": n.tx_max_Bps,
                             "vfs": [v.vf for v in n.vfs],
                             "kernel": None if k is None else {"tx_share_Bps": k.tx_share_Bps,
                                                               "tx_max_Bps": k.tx_max_Bps}})
    return out


def run(args) -> int:
    from shaperd.core.config import load_file
    from shaperd.kernel import devlink as nl
    from shaperd.core.roots import Roots

    cfg = load_file(args.config)
    roots = Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root)
    out = collect(cfg, roots, lambda: nl.DevlinkNl(args.netns, run_root=args.run_root))
    if output.machine(args):
        output.emit(out, args)
        return EXIT_OK
    for line in out["notes"]:
        print(line)
    for n in out["nodes"]:
        k = n["kernel"]
        have = "not in the kernel" if k is None else f"kernel tx_share {k['tx_share_Bps']} B/s tx_max {k['tx_max_Bps']} B/s"
        print(f"{n['tenant']}: {n['device']}/{n['node']} tx_share {n['tx_share_Bps']} B/s tx_max "
              f"{n['tx_max_Bps'] or 'unlimited'}{' B/s' if n['tx_max_Bps'] else ''}, VFs {n['vfs']}; {have}")
    for d in out["devices"]:
        for op in d["pending"]:
            print(f"pending: {op}")
        for key in ("left_alone", "error"):
            if d[key]:
                print(f"{d['device']}: {key.replace('_', ' ')}: {d[key]}")
    for w in out["warnings"] + out["problems"]:
        print(f"warning: {w}", file=sys.stderr)
    return EXIT_OK
