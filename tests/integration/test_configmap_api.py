"""``shaperd run --config-map kubeflow/training-network-isolation``: the tenants file through the API, live.

The fake API server serves the ConfigMap (list with fieldSelector
metadata.name, watch); the daemon runs in the host namespace (to reach it on
loopback) and acts in the node's. An update reaches the kernel; a bad update
is rejected and logged and the last good config stays enforced. Waits are
conditions with deadlines that only bound a failure.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path


from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from tests import procs, rbac
from tests.k8s_fake import write_kubeconfig

from .conftest import PY, needs_root, wait_for
from .test_core import classes

pytestmark = needs_root

CMS = "/api/v1/namespaces/kubeflow/configmaps"
A = ROOT_HANDLE | assign_minors(["tenant-a", "tenant-b"])["tenant-a"]
DEADLINE = 30.0


def tenants(limit: str, guarantee: str = "4Gbps") -> str:
    return f"""node: {{interfaces: [up0], capacity: 10Gbps}}
tenants:
  - {{name: tenant-a, bandwidthGuarantee: {guarantee}, bandwidthLimit: {limit}, priority: 100}}
  - {{name: tenant-b, bandwidthGuarantee: 2Gbps, bandwidthLimit: 4Gbps, priority: 50}}
"""


def configmap(text: str, name: str = "training-network-isolation") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "kubeflow"},
            "data": {"traffic-shaping.yaml": text}}


def test_configmap_update_reaches_the_kernel_and_a_bad_one_keeps_the_last_good(bed, tmp_path, api):
    api.collection(CMS)
    api.put_object(CMS, configmap(tenants("6Gbps")))
    api.put_object(CMS, configmap("not: [the tenants file", name="something-else"))  # not ours: never read
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    log = tmp_path / "daemon.log"

    def ceil_bps():
        return classes(bed).get(A, {}).get("ceil", 0) * 8

    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(tmp_path / "absent.yaml"), "--netns", bed.node,
         "--config-map", "kubeflow/training-network-isolation", "--kubeconfig", str(kubeconfig),
         "--no-kubernetes", "--metrics-address", "", "--resync-interval", "300"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ) as daemon:
        assert wait_for(lambda: ceil_bps() == 6 * 10**9, DEADLINE), log.read_text()[-3000:]

        t0 = time.monotonic()
        api.put_object(CMS, configmap(tenants("5Gbps")))
        assert wait_for(lambda: ceil_bps() == 5 * 10**9, DEADLINE, interval=0.005), log.read_text()[-3000:]
        print(f"configmap update -> kernel: {(time.monotonic() - t0) * 1000:.0f} ms")

        api.put_object(CMS, configmap(tenants("3Gbps", guarantee="4Gbps")))  # guarantee above limit: bad
        assert wait_for(lambda: "config rejected" in log.read_text(), DEADLINE), log.read_text()[-3000:]
        rejected = [json.loads(l) for l in log.read_text().splitlines() if '"config rejected"' in l]
        assert "tenants[0].bandwidthGuarantee" in " ".join(rejected[-1]["problems"])
        assert rejected[-1]["keeping"] == "last good config"
        assert ceil_bps() == 5 * 10**9

        api.put_object(CMS, configmap(tenants("7Gbps")))  # and a good one after it is taken again
        assert wait_for(lambda: ceil_bps() == 7 * 10**9, DEADLINE), log.read_text()[-3000:]
        # Only the one ConfigMap was asked for, by name (what RBAC resourceNames authorises).
        asked = [r for r in api.requests if r["path"] == CMS]
        assert asked and all(r["query"].get("fieldSelector") == "metadata.name=training-network-isolation"
                             for r in asked)
        daemon.terminate()
        assert daemon.wait(timeout=DEADLINE) == 0
    # Every request the real daemon made is allowed by daemonset/'s RBAC (tests/rbac.py).
    assert rbac.denied(rbac.agent_grants(), api.accesses()) == []


def test_the_source_design_in_a_cluster_configmap_and_cilium_policy_through_the_api(bed, tmp_path, api):
    """The kubeflow deployment: the tenants ConfigMap and the CiliumNetworkPolicy are cluster objects."""
    import yaml

    from shaperd.backends.htb.scopes import scope_minors
    from shaperd.core.config import load_text

    src = (Path(__file__).resolve().parents[2] / "examples" / "kubeflow-source-design.yaml").read_text()
    cm, cnp = yaml.safe_load_all(src)
    # veth reports no usable speed: the node section a real NIC would not need
    cm["data"]["traffic-shaping.yaml"] = "node: {interfaces: [up0], capacity: 100Gbps}\n" + cm["data"][
        "traffic-shaping.yaml"]
    cnps = "/apis/cilium.io/v2/ciliumnetworkpolicies"
    api.collection(CMS)
    api.collection(cnps)
    api.put_object(CMS, cm)
    api.put_object(cnps, cnp)
    scoped = load_text(src)
    leaf = ROOT_HANDLE | scope_minors(scoped.tenants, assign_minors(["tenant-a", "tenant-b"]))[
        "tenant-a\0dst\x0010.244.0.0/16"]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    log = tmp_path / "daemon.log"
    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--netns", bed.node, "--no-kubernetes",
         "--config-map", "kubeflow/training-network-isolation", "--cilium-policies", "--kubeconfig", str(kubeconfig),
         "--metrics-address", "", "--resync-interval", "300"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ):
        assert wait_for(lambda: classes(bed).get(leaf, {}).get("ceil", 0) * 8 == 40 * 10**9, DEADLINE), \
            log.read_text()[-3000:]
        assert classes(bed)[A]["ceil"] * 8 == 60 * 10**9
        api.delete_object(cnps, "kubeflow/tenant-a-bandwidth")  # the policy goes: so does the scope, live
        assert wait_for(lambda: leaf not in classes(bed), DEADLINE), log.read_text()[-3000:]
    # Every request the real daemon made is allowed by daemonset/'s RBAC (tests/rbac.py).
    assert rbac.denied(rbac.agent_grants(), api.accesses()) == []
