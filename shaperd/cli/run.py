"""``shaperd run``: the daemon (shaperd/daemon/service.py) with what its options select.

Builds the daemon's sources from the options: the node's pods through the
Kubernetes API (``--node-name``/$NODE_NAME, unless ``--no-kubernetes``),
Volcano queues and CiliumNetworkPolicy scopes, the kubelet's pod-resources
API, the tenants file from a ConfigMap (``--config-map``), the metrics
endpoint and its web config, the SM-table check, and the startup taint
(``--remove-taint``, daemon/taint.py). Each reconcile opens
the node through cli/node.reconciler. A daemon: it writes log lines
without being asked (``log_lines``, cli/main.py).
"""

from __future__ import annotations

import argparse
import os

from shaperd.cli.node import node_opts
from shaperd.cli.node import reconciler as _reconciler
from shaperd.cli.node import roots as _roots

# Keep in sync with report.metrics.DEFAULT_METRICS_ADDRESS (not imported: prometheus_client loads only for `run`).
DEFAULT_METRICS_ADDRESS = ":9567"


def register(sub) -> None:
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
    p.add_argument("--metrics-all-tenants", action="store_true",
                   help="export the per-tenant series of every tenant in the tenants file (default: only the "
                        "tenants present on this node: a pod, an address, a host interface, a cgroup or an RDMA "
                        "device here)")
    p.add_argument("--node-name", default=None,
                   help="watch this node's pods through the Kubernetes API (default: $NODE_NAME; unset: no Kubernetes)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig for the API (default: in-cluster service account, else $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--no-kubernetes", action="store_true", help="do not watch pods even if NODE_NAME is set")
    p.add_argument("--remove-taint", default=None, metavar="KEY[:EFFECT]", type=_taint_arg,
                   help="after the first reconcile that enforced the tenants, remove this taint (effect default "
                        "NoSchedule) from this node, once (daemonset/components/startup-taint: "
                        "shaperd.io/agent-not-ready); needs the node's name and the API")
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
    p.set_defaults(fn=cmd_run, log_lines=True)


def _config_map_arg(text: str) -> str:
    from shaperd.discovery.kubernetes.configmap import parse_ref

    try:
        return "/".join(parse_ref(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _taint_arg(text: str):
    from shaperd.daemon.taint import parse_taint

    try:
        return parse_taint(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _max_vls_arg(text: str):
    from shaperd.cli.rdma_opensm import max_vls_arg

    return max_vls_arg(text)


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
    startup_taint = None
    if args.remove_taint is not None:  # the startup taint (daemon/taint.py), off this node once it is shaped
        if factory is None:
            from shaperd.cli.errout import UsageError

            raise UsageError(f"--remove-taint {args.remove_taint}: needs this node's name and the Kubernetes API "
                             "(--node-name or $NODE_NAME, without --no-kubernetes)")
        from shaperd.daemon.taint import StartupTaint

        startup_taint = StartupTaint(node_name, args.remove_taint, kubeconfig=args.kubeconfig)
    d = Daemon(args.config, lambda pods: _reconciler(args, pods_source=pods, pod_resources=pod_resources),
               resync_interval_s=args.resync_interval, metrics_address=args.metrics_address,
               netns=getattr(args, "netns", None), pod_watcher_factory=factory, pod_resources=pod_resources,
               sm_check_settings=SmCheckSettings(interval_s=args.sm_check_interval, max_vls=dict(args.max_vls)),
               config_source=config_source, volcano_factory=volcano_factory, cilium_factory=cilium_factory,
               web_config_file=args.web_config_file, metrics_all_tenants=args.metrics_all_tenants,
               startup_taint=startup_taint)
    return d.run()
