"""``shaperd rdma opensm-config``: the subnet manager's side of the tenants' service levels.

Prints OpenSM's QoS options for the tenants file (SL2VL, both VL arbitration
tables, the high-priority limit, per-port-type sets where they differ). With
``--write OPTS_FILE`` it puts them into OpenSM's options file atomically,
keeping every other line byte for byte, and sends SIGHUP to the opensm that
reads that file. Exit codes: 0 done (also when nothing changed), 1 the write
or the signal failed, 2 bad input or output OpenSM would not take.
``-o json|yaml``: the options (and what ``--write`` did) as one object; a
failure as cli/errout.py's error object.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shaperd.cli.errout import fail_from
from shaperd.cli.node import DEFAULT_CONFIG
from shaperd.core import format as output
from shaperd.rdma import opensm
from shaperd.rdma.opensm import max_vls_arg  # noqa: F401 - the --max-vls type, shared with rdma status
from shaperd.rdma import opensm_file
from shaperd.rdma.plan import plan
from shaperd.core.config import load_file
from shaperd.core.inventory import Inventory
from shaperd.core.exitcodes import EXIT_BAD_INPUT, EXIT_OK, err
from shaperd.core.tenancy import tenancy


def register(sub, node_opts) -> None:
    p = sub.add_parser(
        "opensm-config",
        help="render OpenSM's QoS options (SL2VL, VL arbitration) for the tenants; --write updates opensm's file",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"tenants file (default {DEFAULT_CONFIG})")
    p.add_argument("--max-vls", action="append", type=max_vls_arg, metavar="N|TYPE=N", default=[],
                   help=f"data VLs the fabric's ports operate (default {opensm.DEFAULT_MAX_VLS}); TYPE=N for one "
                        f"port type ({', '.join(opensm.PORT_TYPES)}), repeatable")
    p.add_argument("--write", metavar="OPTS_FILE",
                   help="update this OpenSM options file (replaces only the qos keys shaperd owns) and SIGHUP opensm")
    p.add_argument("--opensm-pid-file", metavar="PATH",
                   help="signal the opensm whose pid this file holds (default: every opensm reading OPTS_FILE)")
    p.add_argument("--no-signal", action="store_true", help="with --write: write the file, do not signal opensm")
    output.add_output(p, "text: the options as OpenSM reads them, or what --write did (default); json|yaml: "
                         "the options, the tenants' SLs and warnings, and what --write did, as one object")
    p.set_defaults(fn=run)




def rendered(args) -> opensm.OpenSmConfig:
    cfg = load_file(args.config)
    inv = Inventory()  # the SM's side needs no node: every tenant's SL comes from the tenants file
    return opensm.render(cfg, plan(cfg, inv, tenancy(cfg, inv)), dict(args.max_vls))


def result(out: opensm.OpenSmConfig) -> dict:
    """The -o json|yaml object: the options in the order OpenSM's file holds them, the tenants' SLs, warnings."""
    return {"ok": True, "options": dict(out.options()), "tenant_sls": dict(out.tenant_sls),
            "warnings": list(out.warnings)}


def run(args) -> int:
    try:
        out = rendered(args)
    except opensm.OpenSmConfigError as e:
        return fail_from(args, e, EXIT_BAD_INPUT)
    for w in out.warnings:
        err(f"warning: {w}")
    if not args.write:
        if output.machine(args):
            output.emit(result(out), args)
        else:
            sys.stdout.write(out.text())
        return EXIT_OK
    if not output.machine(args):
        return write(args, out)  # each step printed as it is done
    said: list[str] = []
    signalled: list[int] = []
    code = write(args, out, said.append, signalled)
    if code == EXIT_OK:
        output.emit({**result(out), "write": {"file": args.write, "written": any(l.startswith("wrote ") for l in said),
                                              "signalled": signalled, "messages": said}}, args)
    return code


def write(args, out: opensm.OpenSmConfig, print=print, signalled=None) -> int:
    """--write: merge, write and signal; each step said through ``print``, each pid signalled added to
    ``signalled``."""
    from shaperd.rdma import opensm_host as host

    signalled = [] if signalled is None else signalled
    path = Path(args.write)
    old = host.read_text(path)
    try:
        merged = opensm_file.merge(old or "", out.text(), name=str(path))
    except opensm_file.OptionsFileError as e:
        return fail_from(args, e, EXIT_BAD_INPUT)
    if old is not None and merged.text == old:
        print(f"{path}: the QoS options are already as rendered; not written, opensm not signalled")
        return EXIT_OK
    real = host.write_atomic(path, merged.text)
    what = ["created it with the QoS block"] if old is None else [
        "replaced shaperd's QoS block" if merged.previous_block else "added shaperd's QoS block"]
    if merged.replaced:
        what.append(f"removed {len(merged.replaced)} qos line(s) it now sets ("
                    + ", ".join(f"{k} at line {n}" for n, k in merged.replaced) + ")")
    if old is not None:
        what.append(f"kept {merged.kept} other line(s) unchanged")
    print(f"wrote {real}: " + "; ".join(what))
    if args.no_signal:
        print("opensm not signalled (--no-signal): it reads the new tables at its next start or SIGHUP")
        return EXIT_OK
    if args.opensm_pid_file:
        targets = [host.from_pid_file(Path(args.opensm_pid_file))]
        if targets[0].config != str(real):
            err(f"warning: opensm pid {targets[0].pid} (from {args.opensm_pid_file}) reads {targets[0].config}, "
                 f"not {real}")
    else:
        running = host.running_opensm()
        targets = [p for p in running if p.config == str(real)]
        for p in running:
            if p not in targets:
                print(f"opensm pid {p.pid} reads {p.config}, not this file: not signalled")
    if not targets:
        print(f"no running opensm reads {real}: it takes the new tables when it starts")
        return EXIT_OK
    for t in targets:
        host.hup(t)
        signalled.append(t.pid)
        print(f"sent SIGHUP to opensm pid {t.pid}: it re-reads {real} and reprograms SL2VL and VL arbitration "
              "in its next heavy sweep")
    return EXIT_OK
