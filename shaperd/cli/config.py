"""``shaperd check-config [-c FILE]``: validate a tenants file and print the tenants as shaperd normalised them.

The file is ``-c/--config FILE`` as for every command (default the agent's
file); the positional ``FILE`` is kept, and naming two different files is a
usage error. ``-o json|yaml`` on an invalid file prints the error object
(cli/errout.py) with each problem's field path.

Text: the tenants table (guarantee, limit, the ingress guarantee and limit,
priority, the HTB prio it gets, what it matches), destination scopes,
ignored documents and the node settings; ``-o json|yaml``: the same as one
object (rates in bit/s; ``ingress`` null for a tenant whose inbound traffic
is not shaped).
Exit 0 valid, 2 not (the problems named by field).

Must not: touch the node (no kernel, no sysfs): it checks the file alone.
"""

from __future__ import annotations

from shaperd.backends.htb.plan import MAX_TENANT_PRIO, htb_prios
from shaperd.cli.errout import UsageError, fail_from
from shaperd.cli.node import DEFAULT_CONFIG
from shaperd.core import format as output
from shaperd.core.config import Config, load_file
from shaperd.core.errors import ConfigError
from shaperd.core.exitcodes import EXIT_BAD_INPUT, EXIT_OK
from shaperd.core.units import format_rate


def register(sub) -> None:
    p = sub.add_parser("check-config", help="validate a tenants file and print the normalised tenants table")
    p.add_argument("file", nargs="?", metavar="FILE", help="the tenants file (the older spelling of --config FILE)")
    p.add_argument("--config", "-c", default=None, metavar="FILE",
                   help=f"tenants file (default {DEFAULT_CONFIG})")
    output.add_output(p)
    p.set_defaults(fn=cmd_check_config, usage_parser=p)


def config_path(args) -> str:
    """The file to check: ``-c/--config`` or the positional FILE (the same file when both are given)."""
    if args.file is not None and args.config is not None and args.file != args.config:
        raise UsageError(f"check-config: FILE ({args.file}) and --config ({args.config}) name different files; "
                         "give one")
    return args.config or args.file or DEFAULT_CONFIG


def cmd_check_config(args) -> int:
    args.file = path = config_path(args)
    try:
        cfg = load_file(path)
    except ConfigError as e:  # the error object says which file, and that it is not valid
        return fail_from(args, e, EXIT_BAD_INPUT, file=path, valid=False)
    if output.machine(args):
        output.emit(check_config_result(path, cfg), args)
        return EXIT_OK
    prios = htb_prios(cfg.tenants)
    rows = [("TENANT", "GUARANTEE", "LIMIT", "INGRESS GUARANTEE", "INGRESS LIMIT", "PRIORITY", "HTB PRIO", "MATCH")]
    for t in cfg.tenants:
        match = []
        if t.match.cidrs:
            match.append("cidrs=" + ",".join(map(str, t.match.cidrs)))
        if t.match.interfaces:
            match.append("interfaces=" + ",".join(t.match.interfaces))
        match.append("podLabels=" + ",".join(f"{k}={v}" for k, v in t.effective_pod_labels().items()))
        if t.match.namespaces:
            match.append("namespaces=" + ",".join(t.match.namespaces))
        if t.match.cgroups:
            match.append("cgroups=" + ",".join(t.match.cgroups))
        rows.append((t.name, format_rate(t.guarantee_bps),
                     format_rate(t.limit_bps) if t.limit_bps else "capacity", *_ingress_cells(t),
                     str(t.priority), str(prios[t.name]), " ".join(match)))
    _table(rows)
    scopes = [(t.name, format_rate(d.limit_bps), ",".join(map(str, d.cidrs)), d.origin)
              for t in cfg.tenants for d in t.destinations]
    if scopes:  # destination scopes (issue 12): that traffic's own cap; the rest keeps the tenant's limit
        print()
        _table([("TENANT", "LIMIT", "TOWARDS", "FROM")] + scopes)
    for line in cfg.ignored:
        print(f"ignored: {line}")
    n = cfg.node
    print(
        f"\nnode: interfaces={','.join(n.interfaces) or '(default route)'} "
        f"capacity={format_rate(n.capacity_bps) if n.capacity_bps else '(link speed)'} "
        f"reserve={format_rate(n.reserve_bps) if n.reserve_bps else '(1% of capacity)'} takeOver={n.take_over}"
    )
    if len({t.priority for t in cfg.tenants}) > MAX_TENANT_PRIO + 1:
        print(f"note: more than {MAX_TENANT_PRIO + 1} distinct priorities; the lowest share HTB prio {MAX_TENANT_PRIO}")
    print(f"{args.file}: OK, {len(cfg.tenants)} tenant(s)")
    return EXIT_OK


def _ingress_cells(t) -> tuple[str, str]:
    """The tenants table's ingress columns: "-" where inbound traffic is not shaped (no ingress block),
    "none" for no inbound guarantee, "capacity" for no inbound limit."""
    if t.ingress is None:
        return "-", "-"
    g, l = t.ingress.guarantee_bps, t.ingress.limit_bps
    return (format_rate(g) if g else "none"), (format_rate(l) if l else "capacity")


def check_config_result(path: str, cfg: Config) -> dict:
    """check-config's -o json|yaml object: the normalised tenants and node settings (rates in bit/s)."""
    prios = htb_prios(cfg.tenants)
    tenants = [{"name": t.name, "guarantee_bps": t.guarantee_bps, "limit_bps": t.limit_bps or None,
                "ingress": ({"guarantee_bps": t.ingress.guarantee_bps, "limit_bps": t.ingress.limit_bps}
                            if t.ingress is not None else None),
                "priority": t.priority, "htb_prio": prios[t.name],
                "match": {"cidrs": [str(c) for c in t.match.cidrs], "interfaces": list(t.match.interfaces),
                          "pod_labels": dict(t.effective_pod_labels()), "namespaces": list(t.match.namespaces),
                          "cgroups": list(t.match.cgroups)}} for t in cfg.tenants]
    n = cfg.node
    return {"file": path, "valid": True, "tenants": tenants,
            "node": {"interfaces": list(n.interfaces), "capacity_bps": n.capacity_bps or None,
                     "reserve_bps": n.reserve_bps or None, "take_over": n.take_over}}


def _table(rows) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
