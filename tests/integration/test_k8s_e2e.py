"""Kubernetes end to end: the daemon follows pods through the API (a fake API server
speaking list/watch, reached through the real client library with a kubeconfig)
and their packets land in their tenant's class on the uplink.

Every wait is on a condition (traffic lands in a class, a series reaches a
value) with a deadline that only bounds a failure. The daemon runs in its
own process group and logs to a file (a pipe nobody reads would block it);
it is stopped by group id however the test ends.
"""

from __future__ import annotations

import signal
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from tests import procs, rbac
from tests.k8s_fake import make_pod, write_kubeconfig

from .conftest import PY, SENDER, needs_root, run, wait_for
from .test_core import classes

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 2Gbps, bandwidthLimit: 4Gbps, priority: 50}
"""
MINORS = assign_minors(["tenant-a", "tenant-b"])
A, B = ROOT_HANDLE | MINORS["tenant-a"], ROOT_HANDLE | MINORS["tenant-b"]


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


DEADLINE = 30.0  # seconds; bounds a failure only


def test_pods_followed_live_through_the_api(bed, tmp_path, api):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    pod_ns = bed.ns(f"{bed.tag}-pod")
    run("ip", "-n", bed.node, "link", "add", "cali7", "type", "veth", "peer", "name", "eth0", "netns", pod_ns)
    run("ip", "-n", bed.node, "addr", "add", "198.18.30.1/24", "dev", "cali7")
    run("ip", "-n", pod_ns, "addr", "add", "198.18.30.2/24", "dev", "eth0")
    run("ip", "-n", bed.node, "link", "set", "cali7", "up")
    run("ip", "-n", pod_ns, "link", "set", "eth0", "up")
    run("ip", "-n", pod_ns, "route", "add", "default", "via", "198.18.30.1")
    # An unrelated pod on another node must not matter.
    api.add_pod(make_pod("elsewhere", "node-2", ips=("198.18.31.9",), labels={"training-tenant": "tenant-a"}))

    port = _free_port()
    log = tmp_path / "daemon.log"

    def tail() -> str:
        return log.read_text()[-3000:]

    def metrics() -> dict[tuple, float]:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20).read().decode()
        except OSError:
            return {}
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(name: str, **labels) -> float | None:
        return metrics().get((name, tuple(sorted(labels.items()))))

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=20).status == 200
        except OSError:
            return False

    def lands_in(cid: int, n: int = 10) -> bool:
        before = classes(bed).get(cid, {"packets": 0})["packets"]
        procs.run(["ip", "netns", "exec", pod_ns, PY, "-c", SENDER, "-", "198.18.0.2", "200", str(n)])
        return classes(bed)[cid]["packets"] - before == n

    # The daemon runs in the host namespace (to reach the API on loopback) and acts in the node's.
    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
         "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "30",
         "--metrics-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ) as daemon:
        assert wait_for(ready, DEADLINE), f"daemon never became ready: {tail()}"
        assert not lands_in(A)  # no pod known yet: default class

        # A tenant pod appears: classified after the API event (the resync is 30 s away).
        pod = api.add_pod(make_pod("trainer-0", "node-1", ips=("198.18.30.2",),
                                   labels={"training-tenant": "tenant-a"}))
        uid = pod["metadata"]["uid"]
        assert wait_for(lambda: lands_in(A, 5), DEADLINE), f"new pod's traffic not classified: {tail()}"
        assert wait_for(lambda: value("shaperd_tenant_pods", tenant="tenant-a") == 1, DEADLINE)
        assert value("shaperd_kubernetes_synced") == 1
        # Bounded series: tenant-b has nothing on this node (no pod), so it has no series here.
        tx = "shaperd_tenant_transmit_bytes_total"
        assert wait_for(lambda: value(tx, tenant="tenant-a", device="up0", path="tc") is not None, DEADLINE), tail()
        assert value(tx, tenant="tenant-b", device="up0", path="tc") is None
        assert value("shaperd_tenant_pods", tenant="tenant-b") is None

        # Its label changes: it moves to tenant-b live.
        api.set_labels(uid, {"training-tenant": "tenant-b"})
        assert wait_for(lambda: lands_in(B, 5), DEADLINE), f"label change not applied: {tail()}"
        # Now tenant-b is present and tenant-a is not: the series follow on the next scrapes.
        assert wait_for(lambda: value(tx, tenant="tenant-b", device="up0", path="tc") is not None, DEADLINE), tail()
        assert wait_for(lambda: value(tx, tenant="tenant-a", device="up0", path="tc") is None, DEADLINE), tail()

        # The API server goes away. Once the daemon knows, a reconcile (SIGHUP) runs
        # without it, and the last known mapping stays enforced.
        api.go_down()
        assert wait_for(lambda: value("shaperd_kubernetes_synced") == 0, DEADLINE), tail()
        reconciles = value("shaperd_reconciles_total")
        daemon.send_signal(signal.SIGHUP)
        assert wait_for(lambda: (value("shaperd_reconciles_total") or 0) > reconciles, DEADLINE), tail()
        assert value("shaperd_kubernetes_synced") == 0  # that reconcile ran while out of sync
        assert lands_in(B, 5)
        assert value("shaperd_tenant_pods", tenant="tenant-b") == 1
        api.come_back()
        assert wait_for(lambda: value("shaperd_kubernetes_synced") == 1, DEADLINE), tail()

        # Deleted: nothing of it is left on its interface.
        api.delete_pod(uid)
        assert wait_for(lambda: "shpdm_" not in bed.exec("tc", "filter", "show", "dev", "cali7", "ingress").stdout,
                        DEADLINE), tail()
        assert not lands_in(B)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=DEADLINE) == 0, tail()
    # Every request the real daemon made is allowed by daemonset/'s RBAC (tests/rbac.py).
    assert rbac.denied(rbac.agent_grants(), api.accesses()) == []
