"""The ``shaperd`` command line: one entry point, one subcommand per job.

Exit codes: 0 done (including "nothing to change"); 1 some kernel write or
device failed (the others were still enforced); 2 bad input (tenants file,
arguments): nothing in the kernel was changed. ``diff`` follows ``kubectl
diff`` instead: 0 in sync, 1 changes pending, 2 bad input, 3 a device could
not be read or is left alone (a root qdisc shaperd does not own).

Read commands take ``-o text|json|yaml`` (cli_output.py); ``--version``,
``completion`` and ``teardown --dry-run`` are in cli_meta.py.
"""

from __future__ import annotations

import argparse
import os
import sys

from shaperd.cli import meta as cli_meta
from shaperd.core import format as output
from shaperd.core import log
from shaperd.core.config import Config, load_file
from shaperd.core.errors import ConfigError, KernelError, ShaperdError
from shaperd.core.exitcodes import (EXIT_BAD_INPUT, EXIT_DIFF_ERROR, EXIT_DIFF_PENDING, EXIT_FAILED,
                                     EXIT_INTERRUPTED, EXIT_OK, err as _err)
from shaperd.backends.htb.plan import MAX_TENANT_PRIO, htb_prios
from shaperd.core.units import format_rate

DEFAULT_CONFIG = "/etc/shaperd/traffic-shaping.yaml"
# Keep in sync with report.metrics.DEFAULT_METRICS_ADDRESS (not imported: prometheus_client loads only for `run`).
DEFAULT_METRICS_ADDRESS = ":9567"


def _load(path: str) -> Config:
    return load_file(path)


def cmd_check_config(args) -> int:
    cfg = _load(args.file)
    if output.machine(args):
        output.emit(check_config_result(args.file, cfg), args)
        return EXIT_OK
    prios = htb_prios(cfg.tenants)
    rows = [("TENANT", "GUARANTEE", "LIMIT", "PRIORITY", "HTB PRIO", "MATCH")]
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
                     format_rate(t.limit_bps) if t.limit_bps else "capacity",
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


def check_config_result(path: str, cfg: Config) -> dict:
    """check-config's -o json|yaml object: the normalised tenants and node settings (rates in bit/s)."""
    prios = htb_prios(cfg.tenants)
    tenants = [{"name": t.name, "guarantee_bps": t.guarantee_bps, "limit_bps": t.limit_bps or None,
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


def _config_map_arg(text: str) -> str:
    from shaperd.discovery.kubernetes.configmap import parse_ref

    try:
        return "/".join(parse_ref(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _max_vls_arg(text: str):
    from shaperd.cli.rdma_opensm import max_vls_arg

    return max_vls_arg(text)


def _roots(args):
    from shaperd.core.roots import Roots

    return Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root,
                    bpffs=getattr(args, "bpffs_root", "") or "/sys/fs/bpf",
                    modules=getattr(args, "modules_root", "/lib/modules"), boot=getattr(args, "boot_root", "/boot"))


def _reconciler(args, probe: bool = True, pods_source=None, pod_resources=None, teardown: bool = False):
    from shaperd.engine.reconciler import open_node
    from shaperd.core.inventory import Capabilities
    from shaperd.kernel.probe import probe_capabilities

    if probe and os.geteuid() == 0:
        caps = probe_capabilities(bpffs_root=str(_roots(args).bpffs) if getattr(args, "bpffs_root", "") else None,
                                  roots=_roots(args))
    else:
        # Without root nothing can be probed: plan for the common kernel set.
        caps = Capabilities(bpf=True, leaf_kinds=frozenset({"bfifo"}),
                            notes=("not root: capabilities assumed (htb, u32, cls_bpf, bfifo leaves)",))
    if teardown and getattr(args, "bpffs_root", ""):
        import dataclasses

        # Unprobed, but its bpffs pins are shaperd's to remove like the rest.
        caps = dataclasses.replace(caps, bpf_adopt="pins", bpf_pin_root=str(_roots(args).bpffs),
                                   edt_pin_root=str(_roots(args).bpffs))
    return open_node(caps, netns=getattr(args, "netns", None), roots=_roots(args),
                     take_over=getattr(args, "take_over", False), pods_source=pods_source,
                     pod_resources=pod_resources)


def _print_plan_notes(plan, caps) -> None:
    for note in caps.notes:
        print(f"# note: {note}")
    for w in plan.warnings:
        print(f"# warning: {w}")


def _print_problems(plan) -> None:
    for pr in plan.problems:
        _err(f"device not shaped: {pr}")


def cmd_plan(args) -> int:
    from shaperd.backends.htb.plan import HtbPlan
    from shaperd.backends.htb.render import render

    cfg = _load(args.config)
    rec = _reconciler(args, probe=False)
    p = rec.plan(cfg)
    if output.machine(args):
        output.emit({"notes": list(rec.capabilities.notes), "warnings": list(p.warnings),
                     "problems": [str(pr) for pr in p.problems], "desired": p.desired}, args)
        return EXIT_BAD_INPUT if p.problems else EXIT_OK
    _print_plan_notes(p, rec.capabilities)
    marks = p.desired["marks"].marks if "marks" in p.desired else ()
    print(render(p.desired.get("htb", HtbPlan()), marks), end="")
    # Other backends (VF rates, devlink, DCB, ...) print their writes as equivalent command lines.
    for b in rec.enabled:
        if b.name not in ("htb", "marks") and hasattr(b, "render") and b.name in p.desired:
            text = b.render(p.desired[b.name])
            if text:
                print(text, end="" if text.endswith("\n") else "\n")
    _print_problems(p)
    return EXIT_BAD_INPUT if p.problems else EXIT_OK


def cmd_diff(args) -> int:
    """Like ``kubectl diff``: 0 in sync, 1 changes pending, 2 bad input, 3 a device unreadable or left alone."""
    cfg = _load(args.config)
    try:
        rec = _reconciler(args)
        rep = rec.diff(cfg)
    except ShaperdError as e:  # not ConfigError (that is bad input, exit 2): the node could not be read
        if isinstance(e, ConfigError):
            raise
        _err(str(e))
        return EXIT_DIFF_ERROR
    if output.machine(args):
        output.emit(outcomes_result(rep, planned=True), args)
    else:
        _print_outcomes(rep, planned=True)
    return diff_exit(rep)


def diff_exit(rep) -> int:
    if rep.problems:
        return EXIT_BAD_INPUT
    if any(d.error or d.blocked or d.failed for d in rep.devices):
        return EXIT_DIFF_ERROR
    return EXIT_DIFF_PENDING if rep.changes else EXIT_OK


def outcomes_result(rep, planned: bool) -> dict:
    """diff's and teardown's -o json|yaml object: per target what would change (``planned``) or what did."""
    head = {"in_sync": rep.changes == 0 and rep.ok} if planned else {}
    return {**head, "ok": rep.ok, "changes": rep.changes, "duration_s": round(rep.duration_s, 6),
            "warnings": list(rep.plan.warnings), "problems": [str(p) for p in rep.plan.problems],
            "targets": [{"backend": d.backend, "device": d.device, "ops": [op.describe() for op in d.ops],
                         "failed": [str(e) for _, e in d.failed], "blocked": d.blocked, "error": d.error}
                        for d in rep.devices]}


def cmd_apply(args) -> int:
    cfg = _load(args.config)
    rec = _reconciler(args)
    rep = rec.apply(cfg)
    _print_outcomes(rep, planned=False)
    return _exit(rep)


def _exit(rep) -> int:
    if rep.problems:
        return EXIT_BAD_INPUT
    return EXIT_OK if rep.ok else EXIT_FAILED


def _print_outcomes(rep, planned: bool) -> None:
    for w in rep.plan.warnings:
        print(f"warning: {w}")
    for d in rep.devices:
        if d.error:
            _err(d.error)
        if d.blocked:
            _err(f"{d.device}: {d.blocked}")
        for op in d.ops:
            print(("would " if planned else "") + op.describe())
        for op, e in d.failed:
            _err(str(e))
    _print_problems(rep.plan)
    verb = "would change" if planned else "changed"
    print(f"{rep.changes} {verb}; {len(rep.planned_devices)} device(s) planned in {rep.duration_s * 1000:.1f} ms")


def cmd_teardown(args) -> int:
    """Remove what shaperd owns; ``--dry-run``: the same removals, printed as "would ...", none sent."""
    rec = _reconciler(args, probe=False, teardown=True)
    rep = rec.teardown(dry_run=args.dry_run)
    if output.machine(args):
        output.emit({"dry_run": args.dry_run, **outcomes_result(rep, planned=args.dry_run)}, args)
    else:
        _print_outcomes(rep, planned=args.dry_run)
    return EXIT_OK if rep.ok else EXIT_FAILED


def cmd_run(args) -> int:
    from shaperd.daemon.service import Daemon
    from shaperd.report.rdma_smcheck import SmCheckSettings

    factory = None
    node_name = args.node_name or os.environ.get("NODE_NAME")
    if node_name and not args.no_kubernetes:
        from shaperd.discovery.kubernetes import PodWatcher

        def make_watcher(on_change):
            return PodWatcher(node_name, on_change=on_change, kubeconfig=args.kubeconfig)

        factory = make_watcher

        def make_volcano(on_change):  # PodGroups and Queues, once a tenant uses match.volcanoQueues
            from shaperd.discovery.kubernetes.volcano import VolcanoView

            return VolcanoView(on_change, kubeconfig=args.kubeconfig)

        volcano_factory = make_volcano
    else:
        volcano_factory = None

    pod_resources = None
    if factory is not None and not args.no_pod_resources:
        # The kubelet's device assignments (RDMA devices of pods); a missing socket is logged once, not an error.
        from shaperd.discovery.podresources.source import PodResourcesSource

        pod_resources = PodResourcesSource(_roots(args))

    config_source = None
    if args.config_map:  # the tenants ConfigMap through the API, e.g. kubeflow/training-network-isolation
        from shaperd.discovery.kubernetes.configmap import ConfigMapSource

        config_source = ConfigMapSource(args.config_map, kubeconfig=args.kubeconfig)
    cilium_factory = None
    if args.cilium_policies:  # CiliumNetworkPolicy bandwidth from the cluster (issue 12)
        def cilium_factory(on_change):
            from shaperd.discovery.kubernetes.ciliumpolicies import CiliumPolicyView

            return CiliumPolicyView(on_change, kubeconfig=args.kubeconfig)
    d = Daemon(args.config, lambda pods: _reconciler(args, pods_source=pods, pod_resources=pod_resources),
               resync_interval_s=args.resync_interval, metrics_address=args.metrics_address,
               netns=getattr(args, "netns", None), pod_watcher_factory=factory, pod_resources=pod_resources,
               sm_check_settings=SmCheckSettings(interval_s=args.sm_check_interval, max_vls=dict(args.max_vls)),
               config_source=config_source, volcano_factory=volcano_factory, cilium_factory=cilium_factory,
               web_config_file=args.web_config_file)
    return d.run()


def cmd_status(args) -> int:
    from shaperd.report import status

    return status.main(args)


def cmd_top(args) -> int:
    from shaperd.report import top

    return top.main(args)


BED_MISSING = ("shaperd demo: the test bed is not installed; it is a separate distribution in this "
               "repository (shaperd-testbed, kept out of the agent's install and image): "
               "pip install ./testbed, or run sudo ./scripts/demo")


def cmd_demo(args) -> int:
    try:
        from shaperd_bed import demo
    except ModuleNotFoundError as e:
        if e.name != "shaperd_bed":
            raise  # the bed is there but broken: show the real error
        print(BED_MISSING, file=sys.stderr)
        return EXIT_BAD_INPUT
    return demo.run(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="shaperd", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action=cli_meta.VersionAction,
                    help="print version, git commit, Python and pyroute2, and exit")
    ap.add_argument("--log-json", dest="log_json", action="store_true", default=None,
                    help="JSON log lines (default when stderr is not a terminal)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def node_opts(p, config=True):
        if config:
            p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"tenants file (default {DEFAULT_CONFIG})")
        p.add_argument("--netns", help=argparse.SUPPRESS)  # tests: act inside a named network namespace
        p.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted (default /sys)")
        p.add_argument("--procfs-root", default="/proc", help="where procfs is mounted (default /proc)")
        p.add_argument("--run-root", default="/run", help="the runtime directory holding netns/ (default /run)")
        p.add_argument("--kubelet-root", default="/var/lib/kubelet",
                       help="the kubelet's directory (default /var/lib/kubelet)")
        p.add_argument("--modules-root", default="/lib/modules",
                       help="the kernel's module trees, evidence of which qdisc kinds it has without CAP_SYS_ADMIN "
                            "(default /lib/modules)")
        p.add_argument("--boot-root", default="/boot", help="where config-$(uname -r) lives (default /boot)")
        p.add_argument("--bpffs-root", default=os.environ.get("SHAPERD_BPFFS_ROOT", "/sys/fs/bpf"),
                       help="bpffs where the eBPF classifier is pinned, under shaperd/ (default $SHAPERD_BPFFS_ROOT "
                            "or /sys/fs/bpf; '' for none: adoption by id, which needs CAP_SYS_ADMIN)")

    p = sub.add_parser("check-config", help="validate a tenants file and print the normalised tenants table")
    p.add_argument("file")
    output.add_output(p)
    p.set_defaults(fn=cmd_check_config)

    p = sub.add_parser("plan", help="print the desired state as equivalent tc commands (no root needed)")
    node_opts(p)
    output.add_output(p, "text: tc commands (default); json|yaml: the planned objects")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("diff", help="print what apply would change on this node; exit 0 in sync, 1 changes "
                       "pending, 2 bad input, 3 a device unreadable or left alone")
    node_opts(p)
    output.add_output(p)
    p.add_argument("--take-over", action="store_true", help="replace a root qdisc shaperd does not own")
    p.set_defaults(fn=cmd_diff)

    p = sub.add_parser("apply", help="reconcile once and exit; prints what changed")
    node_opts(p)
    p.add_argument("--take-over", action="store_true", help="replace a root qdisc shaperd does not own")
    p.set_defaults(fn=cmd_apply)

    p = sub.add_parser("run", help="the daemon: reconcile and keep the node in sync")
    node_opts(p)
    p.add_argument("--take-over", action="store_true", help="replace a root qdisc shaperd does not own")
    p.add_argument("--resync-interval", type=float, default=30.0, metavar="SECONDS",
                   help="periodic full reconcile that repairs drift (default 30)")
    p.add_argument("--metrics-address", default=DEFAULT_METRICS_ADDRESS, metavar="HOST:PORT",
                   help=f"serve /metrics, /healthz, /readyz here (default {DEFAULT_METRICS_ADDRESS}, "
                        "all interfaces; empty to disable)")
    p.add_argument("--web.config.file", dest="web_config_file", default=None, metavar="FILE",
                   help="TLS and basic auth for the metrics endpoint, in Prometheus exporter-toolkit's "
                        "web-config.yml format (default: plain HTTP, no auth)")
    p.add_argument("--node-name", default=None,
                   help="watch this node's pods through the Kubernetes API (default: $NODE_NAME; unset: no Kubernetes)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig for the API (default: in-cluster service account, else $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--no-kubernetes", action="store_true", help="do not watch pods even if NODE_NAME is set")
    p.add_argument("--config-map", default=None, metavar="NAMESPACE/NAME", type=_config_map_arg,
                   help="read and watch the tenants file from this ConfigMap through the API instead of --config")
    p.add_argument("--cilium-policies", action="store_true",
                   help="add the bandwidth scopes of the cluster's CiliumNetworkPolicies (cilium.io/v2) to the tenants")
    p.add_argument("--no-pod-resources", action="store_true",
                   help="do not ask the kubelet's pod-resources API (<kubelet root>/pod-resources/kubelet.sock) "
                        "which RDMA devices pods hold; use the tenants file's rdma.devices only")
    p.add_argument("--sm-check-interval", type=float, default=60.0, metavar="SECONDS",
                   help="how often to read the SM's SL2VL/VLArb tables on InfiniBand ports (default 60)")
    p.add_argument("--max-vls", action="append", type=_max_vls_arg, metavar="N|TYPE=N", default=[],
                   help="as given to 'rdma opensm-config': the SM-table check expects those tables (default 8)")
    p.set_defaults(fn=cmd_run)

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

    p = sub.add_parser("teardown", help="remove what shaperd owns and nothing else")
    node_opts(p, config=False)
    p.add_argument("--dry-run", action="store_true", help="print what would be removed; send nothing")
    output.add_output(p)
    p.set_defaults(fn=cmd_teardown)

    from shaperd.cli import rdma as cli_rdma

    cli_rdma.register(sub, node_opts)
    cli_meta.register(sub)

    p = sub.add_parser("webhook", help="the mutating admission webhook: adds each tenant's NCCL settings to its pods")
    from shaperd import webhook

    webhook.add_arguments(p)

    try:
        from shaperd_bed import demo  # the separate shaperd-testbed distribution, imported only here
    except ImportError:
        # Without the bed, take any arguments (no option parsing at all) so that cmd_demo can
        # say how to install it instead of argparse rejecting the bed's options.
        p = sub.add_parser("demo", help="build a namespace test bed and measure isolation (root; needs "
                           "pip install ./testbed)", prefix_chars="\0", add_help=False)
        p.add_argument("bed_args", nargs="*")
    else:
        p = sub.add_parser("demo", help="build a namespace test bed and measure isolation (root)")
        demo.add_arguments(p)
    p.set_defaults(fn=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log.configure(json=args.log_json, level=args.log_level)
    try:
        return args.fn(args)
    except ConfigError as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    except KernelError as e:
        _err(str(e))
        return EXIT_FAILED
    except ShaperdError as e:
        _err(str(e))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
