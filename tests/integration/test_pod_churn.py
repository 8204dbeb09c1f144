"""Pod churn through the daemon ends in exactly the kernel state a fresh start makes.

The real daemon (``shaperd run --netns NODE --node-name node-1 --kubeconfig K``,
in this namespace so it reaches the fake API server on loopback) follows pods
that are created and deleted over and over (bench/pod_churn.py does 1,000
cycles and measures memory; this is its correctness half, with asserts). Each
cycle makes a routed veth and the pod, waits until shaperd has put its mark
program on the veth and its address filters on the uplink, deletes it (API
first or veth first, alternating: the CNI and the API server race in real
clusters) and waits until nothing of it is left. At the end the node's
normalised tc state must equal the state before the churn and the state that
a teardown plus a fresh apply of the same config and pods makes.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from shaperd.core.config import load_text
from shaperd.engine.probe import probe_capabilities
from tests.k8s_fake import write_kubeconfig
from tests.routed_pods import (CFG, NODE_NAME, Kernel, PodSpec, add_routed_pods, enforced, gone, remove_routed_pod,
                               state_diff, tenant_for)

from .conftest import PY, needs_root, wait_for

pytestmark = needs_root

CYCLES = 40
STEADY = 6  # tenant-a by label, tenant-b by namespace, one in no tenant


def _ops(report) -> list[str]:
    return [f"{op.device}: {op.describe()} ({op.reason})" for d in report.devices for op in d.ops]


def test_churn_ends_in_the_state_a_fresh_start_makes(bed, tmp_path, api):
    caps = probe_capabilities()  # before any netlink socket of ours is open
    if not caps.bpf:
        pytest.skip("cls_bpf not available: no mark programs to churn on this kernel")
    cfg = load_text(CFG)
    pods_ns = bed.ns(f"{bed.tag}-pods")
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    steady = [PodSpec("s", i, tenant_for(i)) for i in range(STEADY)]
    add_routed_pods(bed.node, pods_ns, steady)
    for p in steady:
        api.add_pod(p.api_object())
    (tmp_path / "t.yaml").write_text(CFG)
    log_path = tmp_path / "daemon.log"
    with open(log_path, "w") as log:  # a file, not a pipe: 40 cycles of JSON lines would fill a pipe
        daemon = bed.spawn([PY, "-m", "shaperd", "--log-json", "run", "--config", str(tmp_path / "t.yaml"),
                            "--netns", bed.node, "--node-name", NODE_NAME,
                            "--kubeconfig", str(write_kubeconfig(tmp_path / "kubeconfig", api.url)),
                            # no periodic resync to paper over a missed event; no port to collide on
                            "--resync-interval", "600", "--metrics-address", ""],
                           stdout=subprocess.DEVNULL, stderr=log)

    def tail() -> str:
        return log_path.read_text()[-3000:]

    with Kernel(bed.node) as k:
        tenant_steady = [p for p in steady if p.tenant]
        assert wait_for(lambda: all(enforced(k, p) for p in tenant_steady), 30), tail()
        infos = [p.info() for p in steady]
        fresh = k.reconciler(caps, lambda: infos)
        assert wait_for(lambda: not _ops(fresh.diff(cfg)), 10), _ops(fresh.diff(cfg))
        before_churn = k.state()

        for c in range(1, CYCLES + 1):
            pod = PodSpec("c", c, "tenant-a" if c % 2 else "tenant-b")
            add_routed_pods(bed.node, pods_ns, [pod])
            api.add_pod(pod.api_object())
            assert wait_for(lambda: enforced(k, pod), 10), f"cycle {c}: {pod.name} never enforced\n{tail()}"
            api_first = c % 2 == 0
            if not api_first:
                remove_routed_pod(bed.node, pod)
                k.forget(pod.host_if)
            api.delete_pod(pod.uid)
            assert wait_for(lambda: gone(k, pod, api_first), 10), f"cycle {c}: {pod.name} left behind\n{tail()}"
            if api_first:
                remove_routed_pod(bed.node, pod)
                k.forget(pod.host_if)
            assert daemon.poll() is None, tail()

        # Converged when a fresh Reconciler, told the same pods, finds nothing to do.
        assert wait_for(lambda: not _ops(fresh.diff(cfg)), 10), _ops(fresh.diff(cfg))
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=15) == 0, tail()
        churned = k.state()
        assert state_diff(before_churn, churned) == {}

        torn = k.reconciler(caps, lambda: infos).teardown()
        assert torn.ok, torn.devices
        left = k.state()
        assert not [q for q in left["qdiscs"] if q[3] == "htb"] and not left["classes"]
        assert not [f for f in left["filters"] if "shpd" in repr(f)]

        again = k.reconciler(caps, lambda: infos).apply(cfg)
        assert again.ok and again.changes > 0, again.devices
        assert state_diff(churned, k.state()) == {}
