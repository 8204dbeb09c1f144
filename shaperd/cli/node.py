"""What the commands that look at this node share: their options, the roots they name, and a reconciler.

``node_opts`` adds the tenants file (``--config``) and the filesystem roots
(sysfs, procfs, the run directory, the kubelet's, the module trees, /boot,
bpffs) to a command; ``roots`` turns them into core.roots.Roots;
``reconciler`` opens the node (engine/reconciler.open_node) with this
kernel's capabilities: probed when root (kernel/probe.py, in a network
namespace of its own), assumed otherwise.

Must not: print, or decide exit codes (the command modules do).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from shaperd.core.inventory import Capabilities

DEFAULT_CONFIG = "/etc/shaperd/traffic-shaping.yaml"


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


def roots(args):
    from shaperd.core.roots import Roots

    return Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root,
                    bpffs=getattr(args, "bpffs_root", "") or "/sys/fs/bpf",
                    modules=getattr(args, "modules_root", "/lib/modules"), boot=getattr(args, "boot_root", "/boot"))


# Without root nothing can be probed: plan for the common kernel set (what every kernel shaperd supports has).
ASSUMED = Capabilities(htb=True, u32=True, bpf=True, leaf_kinds=frozenset({"bfifo"}))


def assumed(why: str, caps: Capabilities = ASSUMED) -> Capabilities:
    """``caps`` with a note naming what was assumed and what was not, made from ``caps`` itself."""
    have = [n for ok, n in ((caps.htb, "sch_htb"), (caps.u32, "cls_u32"), (caps.bpf, "cls_bpf")) if ok]
    have += [f"{k} leaves" for k in sorted(caps.leaf_kinds)]
    lacking = [n for ok, n in ((caps.bpf_maps, "the eBPF map classifier (u32 filters instead)"),
                               ("fq_codel" in caps.leaf_kinds, "fq_codel leaves"),
                               (caps.fq and caps.mq, "sch_fq and mq (no edt data plane)")) if not ok]
    note = f"{why}: assumed {', '.join(have) or 'nothing'}" + (f"; not assumed: {', '.join(lacking)}" if lacking else "")
    return dataclasses.replace(caps, notes=(note,))


def reconciler(args, probe: bool = True, pods_source=None, pod_resources=None, teardown: bool = False,
               read_only: bool = False):
    """``probe``: probe this kernel when root (else: ``assumed()``); ``read_only``: a probe that writes nothing
    to the node (kernel/probe.py), for commands that only show (plan)."""
    from shaperd.engine.reconciler import open_node
    from shaperd.engine.probe import probe_capabilities

    if probe and os.geteuid() == 0:
        caps = probe_capabilities(bpffs_root=str(roots(args).bpffs) if getattr(args, "bpffs_root", "") else None,
                                  roots=roots(args), read_only=read_only)
    else:
        caps = assumed("not root, so capabilities not probed" if os.geteuid() != 0 else "capabilities not probed")
    if teardown and getattr(args, "bpffs_root", ""):
        # Unprobed, but its bpffs pins are shaperd's to remove like the rest.
        caps = dataclasses.replace(caps, bpf_adopt="pins", bpf_pin_root=str(roots(args).bpffs),
                                   edt_pin_root=str(roots(args).bpffs))
    return open_node(caps, netns=getattr(args, "netns", None), roots=roots(args),
                     take_over=getattr(args, "take_over", False), pods_source=pods_source,
                     pod_resources=pod_resources)

