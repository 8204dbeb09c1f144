"""``shaperd rdma env TENANT``: print a tenant's NCCL environment on this node (shell, JSON or a ConfigMap).

Runs the RDMA plan on this node's sysfs inventory (no root, no daemon).
Warnings and notes (a missing device, a variable left unset and why) go to
stderr, so stdout can be sourced or piped to ``kubectl apply -f -``.
"""

from __future__ import annotations

import sys

from shaperd.core.exitcodes import EXIT_BAD_INPUT, EXIT_OK, err

FORMATS = ("shell", "json", "configmap")


def register(sub, node_opts) -> None:
    p = sub.add_parser("env", help="print a tenant's NCCL environment on this node",
                       description=__doc__.splitlines()[0])
    p.add_argument("tenant", help="tenant name, as in the tenants file")
    node_opts(p)
    p.add_argument("-o", "--output", choices=FORMATS, default="shell",
                   help="shell: export lines (default); json: an object; configmap: a Kubernetes ConfigMap")
    p.set_defaults(fn=run)


def run(args) -> int:
    from shaperd.rdma import nccl
    from shaperd.rdma.plan import plan
    from shaperd.core.config import load_file
    from shaperd.discovery import rdma
    from shaperd.core.inventory import Inventory
    from shaperd.core.roots import Roots
    from shaperd.core.tenancy import tenancy

    cfg = load_file(args.config)
    names = [t.name for t in cfg.tenants]
    if args.tenant not in names:
        err(f"rdma env: no tenant {args.tenant!r} in {args.config}; its tenants are: {', '.join(names)}")
        return EXIT_BAD_INPUT
    roots = Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root)
    devices, notes = rdma.discover(roots)
    inv = Inventory(rdma=devices, rdma_notes=notes)
    p = plan(cfg, inv, tenancy(cfg, inv))
    env = nccl.tenant_env(p.tenant(args.tenant))
    for w in _about(p.warnings, names.index(args.tenant)):
        print(f"warning: {w}", file=sys.stderr)
    for n in env.notes:
        print(f"note: {n}", file=sys.stderr)
    render = {"shell": nccl.shell, "json": nccl.json_text, "configmap": nccl.configmap}[args.output]
    sys.stdout.write(render(env))
    return EXIT_OK


def _about(warnings, index: int) -> list[str]:
    """The plan's warnings minus those about another tenant's rdma.devices entries."""
    mine = f"tenants[{index}]."
    return [w for w in warnings if not w.startswith("tenants[") or w.startswith(mine)]
