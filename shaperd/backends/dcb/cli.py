"""``shaperd rdma dcb [--json]``: each RoCE uplink's DCB, as planned and as the NIC reports it. Read only.

Plans the DCB backend from the tenants file and this node's RDMA devices
(sysfs), reads every RoCE PF uplink through DCB netlink (IEEE_GET, no
write), and shows per netdev: the tenants' TCs, shares and max rates, what
the NIC reports (ETS, max rates, APP, PFC), what a reconcile would write,
and what is not enforced (a driver without the op, a netdev without DCB).
"""

from __future__ import annotations

import sys

from shaperd.core import format as output
from shaperd.core.exitcodes import EXIT_BAD_INPUT, EXIT_OK


def register(sub, node_opts) -> None:
    p = sub.add_parser("dcb", help="RoCE DCB per uplink: planned vs read back (ETS, max rates, APP, PFC)")
    node_opts(p)
    output.add_output(p)
    p.set_defaults(fn=run)


def collect(cfg, roots, netns=None, client=None) -> dict:
    from shaperd.core.protocol import PlanInput
    from shaperd.backends.dcb.backend import DcbBackend
    from shaperd.discovery import rdma
    from shaperd.core.inventory import Inventory
    from shaperd.core.tenancy import tenancy

    devs, notes = rdma.discover(roots)
    inv = Inventory(rdma=devs, rdma_notes=notes)
    b = DcbBackend(netns, str(roots.run), client=client)
    desired = b.plan(PlanInput(cfg, inv, tenancy(cfg, inv)))
    diffs = {d.target: d for d in b.diff(desired, b.observe(None, inv))}
    out = {"netdevs": {}, "warnings": list(desired.warnings), "problems": [str(p) for p in desired.problems]}
    for nd, s in sorted(b.status().items()):
        row: dict = {"error": s.error, "not_sticking": list(s.not_sticking),
                     "foreign_dscp_prio": [list(x) for x in s.foreign_apps],
                     "pfc_priorities": list(s.pfc_priorities) if s.pfc_priorities is not None else None,
                     "notes": list(s.pfc_notes)}
        if s.configured is not None:
            c = s.configured
            row["configured"] = {"tc_bw_pct": list(c.tc_bw_pct), "maxrate_kbps": list(c.maxrate_kbps),
                                 "dscp_prio": [list(x) for x in c.dscp_prio],
                                 "tenants": [{"tenant": t.tenant, "dscp": t.dscp, "tc": t.tc, "share_pct": t.share_pct,
                                              "maxrate_kbps": t.maxrate_kbps} for t in c.tenants]}
        if s.read is not None:
            r = s.read
            row["read"] = {"tc_bw_pct": list(r.ets.tc_tx_bw) if r.ets else None,
                           "tc_tsa": list(r.ets.tc_tsa) if r.ets else None,
                           "prio_tc": list(r.ets.prio_tc) if r.ets else None,
                           "maxrate_kbps": list(r.maxrate_kbps) if r.maxrate_kbps is not None else None,
                           "apps": [[a.selector, a.protocol, a.priority] for a in r.apps]}
        d = diffs.get(nd)
        row["would_write"] = [op.describe() for op in d.ops] if d else []
        row["blocked"] = d.blocked if d else None
        out["netdevs"][nd] = row
    return out


def render(st: dict) -> str:
    lines = []
    for nd, r in st["netdevs"].items():
        lines.append(f"{nd}:")
        c = r.get("configured")
        if c:
            for t in c["tenants"]:
                rate = f"{t['maxrate_kbps']} kbit/s" if t["maxrate_kbps"] else "unlimited"
                lines.append(f"  tenant {t['tenant']}: DSCP {t['dscp']} -> TC{t['tc']}, share {t['share_pct']} %, "
                             f"max {rate}")
            lines.append(f"  planned  tc-bw {c['tc_bw_pct']} maxrate {c['maxrate_kbps']}")
        if r.get("read"):
            rd = r["read"]
            lines.append(f"  read     tc-bw {rd['tc_bw_pct']} maxrate {rd['maxrate_kbps']} prio-tc {rd['prio_tc']}")
        if r["error"]:
            lines.append(f"  error: {r['error']}")
        if r["pfc_priorities"] is not None:
            lines.append(f"  PFC on priorities {r['pfc_priorities']} (read only)")
        lines += [f"  would write: {w}" for w in r["would_write"]]
        if r["blocked"]:
            lines.append(f"  not enforced: {r['blocked']}")
        if r["foreign_dscp_prio"]:
            lines.append(f"  left alone (not shaperd's): dscp-prio {r['foreign_dscp_prio']}")
        lines += [f"  note: {n}" for n in r["notes"]]
    lines += [f"warning: {w}" for w in st["warnings"]] + [f"problem: {p}" for p in st["problems"]]
    return "\n".join(lines) if lines else "no RoCE uplink on this node"


def run(args) -> int:
    from shaperd.core.config import load_file
    from shaperd.core.roots import Roots

    cfg = load_file(args.config)
    roots = Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root)
    st = collect(cfg, roots, getattr(args, "netns", None))
    print(output.dump(st, args.output) if output.machine(args) else render(st))
    sys.stdout.flush()
    return EXIT_BAD_INPUT if st["problems"] else EXIT_OK
