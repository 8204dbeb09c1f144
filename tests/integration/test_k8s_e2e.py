"""Kubernetes end to end: the daemon follows pods through the API (a fake API server
speaking list/watch, reached through the real client library with a kubeconfig)
and their packets land in their tenant's class on the uplink."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

import pytest

from shaperd.backends.htb.objects import ROOT_HANDLE
from shaperd.backends.ids import assign_minors
from tests.k8s_fake import FakeKubeAPI, make_pod, write_kubeconfig

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


@pytest.fixture
def api():
    fake = FakeKubeAPI()
    fake.start()
    try:
        yield fake
    finally:
        fake.close()


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
    # The daemon runs in the host namespace (to reach the API on loopback) and acts in the node's.
    daemon = subprocess.Popen(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
         "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "30",
         "--metrics-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    bed.procs.append(daemon)

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1).status == 200
        except OSError:
            return False

    def metrics() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()

    def lands_in(cid: int, n: int = 10) -> bool:
        before = classes(bed).get(cid, {"packets": 0})["packets"]
        bed.exec(PY, "-c", SENDER, "-", "198.18.0.2", "200", str(n), ns=pod_ns)
        return classes(bed)[cid]["packets"] - before == n

    assert wait_for(ready, 15), "daemon never became ready"
    assert not lands_in(A)  # no pod known yet: default class

    # A tenant pod appears: classified shortly after the API event.
    pod = api.add_pod(make_pod("trainer-0", "node-1", ips=("198.18.30.2",), labels={"training-tenant": "tenant-a"}))
    uid = pod["metadata"]["uid"]
    assert wait_for(lambda: lands_in(A, 5), 5), "new pod's traffic not classified"
    assert 'shaperd_tenant_pods{tenant="tenant-a"} 1.0' in metrics()
    assert "shaperd_kubernetes_synced 1.0" in metrics()

    # Its label changes: it moves to tenant-b live.
    api.set_labels(uid, {"training-tenant": "tenant-b"})
    assert wait_for(lambda: lands_in(B, 5), 5), "label change not applied"

    # The API server goes away: the last known mapping stays enforced.
    api.go_down()
    time.sleep(1.5)
    assert lands_in(B, 5)
    assert wait_for(lambda: "shaperd_kubernetes_synced 0.0" in metrics(), 10)
    api.come_back()
    assert wait_for(lambda: "shaperd_kubernetes_synced 1.0" in metrics(), 15)

    # Deleted: nothing of it is left on its interface.
    api.delete_pod(uid)
    assert wait_for(lambda: "shpdm_" not in bed.exec("tc", "filter", "show", "dev", "cali7", "ingress").stdout, 5)
    assert not lands_in(B)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=10) == 0, daemon.stderr.read()[-3000:]
