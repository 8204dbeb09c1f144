"""Volcano end to end: pods in their PodGroup's queue land in that queue's tenant's class, with real
traffic, and a change of a Queue's weight moves the tenant's HTB priority live (fake API server with
PodGroups and Queues, the daemon in the host namespace acting in the node's).
"""

from __future__ import annotations

import subprocess


from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from shaperd.discovery.kubernetes.volcano import PODGROUPS, QUEUES
from tests import procs, rbac
from tests.k8s_fake import make_pod, write_kubeconfig

from .conftest import PY, SENDER, needs_root, run, wait_for
from .test_core import classes

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - name: tenant-a
    bandwidthGuarantee: 4Gbps
    priority: 1
    priorityFrom: volcanoQueue
    match: {volcanoQueues: [tenant-a-training]}
  - name: tenant-b
    bandwidthGuarantee: 2Gbps
    priority: 1
    priorityFrom: volcanoQueue
    match: {volcanoQueues: [tenant-b-training]}
"""
MINORS = assign_minors(["tenant-a", "tenant-b"])
A, B = ROOT_HANDLE | MINORS["tenant-a"], ROOT_HANDLE | MINORS["tenant-b"]
DEADLINE = 30.0


def queue(name: str, weight: int) -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"weight": weight}}


def podgroup(name: str, ns: str, q: str) -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns}, "spec": {"queue": q, "minMember": 1}}


def _pod_ns(bed, veth: str, addr: str) -> str:
    ns = bed.ns(f"{bed.tag}-{veth}")
    run("ip", "-n", bed.node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "-n", bed.node, "addr", "add", f"{addr[:-1]}1/24", "dev", veth)
    run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
    run("ip", "-n", bed.node, "link", "set", veth, "up")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", ns, "route", "add", "default", "via", f"{addr[:-1]}1")
    return ns


def test_volcano_pods_land_in_their_queues_tenants_and_weight_moves_priority(bed, tmp_path, api):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    ns_a = _pod_ns(bed, "cali1", "198.18.40.2")
    ns_b = _pod_ns(bed, "cali2", "198.18.41.2")
    api.collection(PODGROUPS)
    api.collection(QUEUES)
    api.put_object(QUEUES, queue("tenant-a-training", 10))
    api.put_object(QUEUES, queue("tenant-b-training", 5))
    api.put_object(PODGROUPS, podgroup("job-a", "team-a", "tenant-a-training"))
    # a's pod through its PodGroup; b's through the queue-name label (no PodGroup)
    pa = make_pod("worker-a", "node-1", namespace="team-a", ips=("198.18.40.2",))
    pa["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "job-a"}
    api.add_pod(pa)
    api.add_pod(make_pod("worker-b", "node-1", namespace="team-b", ips=("198.18.41.2",),
                         labels={"volcano.sh/queue-name": "tenant-b-training"}))
    log = tmp_path / "daemon.log"

    def tail() -> str:
        return log.read_text()[-3000:]

    def lands_in(ns: str, cid: int, n: int = 10) -> bool:
        before = classes(bed).get(cid, {"packets": 0})["packets"]
        procs.run(["ip", "netns", "exec", ns, PY, "-c", SENDER, "-", "198.18.0.2", "200", str(n)])
        return classes(bed).get(cid, {"packets": 0})["packets"] - before == n

    def prios() -> tuple[int, int]:
        got = classes(bed)
        return got.get(A, {}).get("prio", -1), got.get(B, {}).get("prio", -1)

    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
         "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "300",
         "--metrics-address", "", "--no-pod-resources"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ):
        assert wait_for(lambda: prios() == (0, 1), DEADLINE), tail()  # weight 10 over 5
        assert wait_for(lambda: lands_in(ns_a, A), DEADLINE), f"PodGroup pod not in tenant-a: {tail()}"
        assert wait_for(lambda: lands_in(ns_b, B), DEADLINE), f"queue-label pod not in tenant-b: {tail()}"

        api.put_object(QUEUES, queue("tenant-b-training", 20))  # live: b now outweighs a
        assert wait_for(lambda: prios() == (1, 0), DEADLINE), tail()
        assert lands_in(ns_a, A) and lands_in(ns_b, B)

        api.put_object(PODGROUPS, podgroup("job-a", "team-a", "tenant-b-training"))  # the job moves queue
        assert wait_for(lambda: lands_in(ns_a, B), DEADLINE), tail()
    # Every request the real daemon made is allowed by daemonset/'s RBAC (tests/rbac.py).
    assert rbac.denied(rbac.agent_grants(), api.accesses()) == []


def test_without_volcano_installed_it_says_so_once_and_keeps_working(bed, tmp_path, api):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    log = tmp_path / "daemon.log"
    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
         "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "300",
         "--metrics-address", "", "--no-pod-resources"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ):
        assert wait_for(lambda: A in classes(bed) and '"reconciled"' in log.read_text(), DEADLINE), log.read_text()
        absent = [l for l in log.read_text().splitlines() if "k8s_resource_absent" in l]
        assert len(absent) == 2 and all("not installed" in l for l in absent)  # podgroups, queues: once each
    # Every request the real daemon made is allowed by daemonset/'s RBAC (tests/rbac.py).
    assert rbac.denied(rbac.agent_grants(), api.accesses()) == []
