"""``shaperd rdma vf-rates``: each tenant's VFs, the rates shaperd wants and what the PFs report (read only).

Plans the vfrate backend on this node (sysfs for the VFs, rtnetlink for the
PFs' VF info), reads each PF once and prints per VF: tenant, PF and VF
number, PCI address, wanted min/max Mbit/s, reported min/max, and whether
they agree. It writes nothing. A refused minimum is known to the daemon
that met it (its log line and ``shaperd_vf_min_rate_supported``); here a VF
whose reported minimum is 0 while one is wanted says so. Exit 0 in sync,
1 when a PF is out of sync, blocked or unreadable.
"""

from __future__ import annotations

from shaperd.core import format as output
from shaperd.core.exitcodes import EXIT_FAILED, EXIT_OK


def register(sub, node_opts) -> None:
    p = sub.add_parser("vf-rates", help="each tenant's SR-IOV VF rates: wanted and as the PF reports them",
                       description=__doc__.splitlines()[0])
    node_opts(p)
    output.add_output(p)
    p.set_defaults(fn=run)


def rows(backend, report, refusals: dict | None = None) -> list[dict]:
    """Per VF; ``refusals``: the running agent's record (backend.read_refusals), for min_rate_supported."""
    refusals = refusals or {}
    snap = backend.snapshot
    pending = {(op.device, op.vf) for t in report.devices for op in t.ops}
    out = []
    for v in snap.desired.vfs:
        st = snap.observed.pfs.get(v.pf)
        row = st.vf(v.vf) if st is not None and st.reported else None
        state = "in sync"
        if v.pf in snap.observed.errors:
            state = "unreadable: " + snap.observed.errors[v.pf]
        elif row is None:
            state = "not reported by the PF"
        elif (v.pf, v.vf) in pending:
            state = "out of sync"
        note = None
        refused = refusals.get((v.pf_pci, v.driver), {})
        if row is not None and v.min_mbps and row.min_mbps == 0 and not refused:
            note = "minimum not applied (drivers such as i40e, ixgbe, ice with DCB refuse one)"
        out.append({"tenant": v.tenant, "pf": v.pf, "vf": v.vf, "pci": v.pci, "device": v.device,
                    "driver": v.driver, "min_mbps": v.min_mbps, "max_mbps": v.max_mbps,
                    "reported_min_mbps": row.min_mbps if row else None,
                    "reported_max_mbps": row.max_mbps if row else None, "state": state, "note": note,
                    "min_rate_supported": "min" not in refused and "all" not in refused,
                    "reason": refused.get("all") or refused.get("min")})
    return out


def read(cfg, roots, reader, diff_one, kernel=None):
    """Plan as the running agent does and diff without writing: (backend, report, refusals), for rows()/as_json().

    ``diff_one(reader, backend, cfg, roots)``: the engine's read-only plan-and-diff (engine/reconciler.py)."""
    from shaperd.backends.vfrate.backend import VfRateBackend, read_refusals

    refusals = read_refusals(roots.run / "shaperd" / "vfrate-owned.json")
    backend = VfRateBackend(writer=None, kernel=kernel)  # no record: this command writes nothing, not even that
    backend.adopt_refusals(cfg, refusals)  # plan as the running agent does
    rep = diff_one(reader, backend, cfg, roots)
    return backend, rep, refusals


def as_json(backend, rep, refusals) -> dict:
    """The ``--json`` object (also ``shaperd status``'s ``vf_rates``)."""
    return {"vfs": rows(backend, rep, refusals), "warnings": list(rep.plan.warnings),
            "pfs": {t.device: {"blocked": t.blocked, "error": t.error} for t in rep.devices}}


def run(args) -> int:
    from shaperd.core.config import load_file
    from shaperd.kernel.rtnl import RtnlReader
    from shaperd.core.roots import Roots

    cfg = load_file(args.config)
    roots = Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root)
    with RtnlReader(args.netns, run_root=args.run_root) as reader:
        backend, rep, refusals = read(cfg, roots, reader, args.diff_one)
    out = as_json(backend, rep, refusals)
    table = out["vfs"]
    bad = [t for t in rep.devices if t.ops or t.blocked or t.error]
    if output.machine(args):
        output.emit(out, args, indent=2)
        return EXIT_FAILED if bad else EXIT_OK
    for w in backend.snapshot.desired.warnings:
        print(f"warning: {w}")
    if not table:
        print("no tenant holds an SR-IOV VF on this node")
    for r in table:
        rep_txt = "-" if r["reported_max_mbps"] is None else f"{r['reported_min_mbps']}/{r['reported_max_mbps']}"
        print(f"{r['tenant']}  {r['pf']} vf {r['vf']} ({r['pci']})  want {r['min_mbps']}/{r['max_mbps']} Mbit/s"
              f"  reported {rep_txt}  {r['state']}" + (f"  note: {r['note']}" if r["note"] else "")
              + ("" if r["min_rate_supported"] else f"  min_rate_supported: false ({r['reason']})"))
    for t in rep.devices:
        if t.blocked or t.error:
            print(f"{t.device}: {t.blocked or t.error}")
    return EXIT_FAILED if bad else EXIT_OK
