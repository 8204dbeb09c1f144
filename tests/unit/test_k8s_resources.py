"""The generic list-then-watch (discovery/kubernetes/resources.py) and the ConfigMap source, against the fake API."""

from __future__ import annotations

import threading

import pytest

from shaperd.discovery.kubernetes.configmap import ConfigMapSource, parse_ref
from shaperd.discovery.kubernetes.resources import ResourceWatcher
from shaperd.core.errors import ConfigError

CMS = "/api/v1/namespaces/kubeflow/configmaps"
PGS = "/apis/scheduling.volcano.sh/v1beta1/podgroups"


def _cfg(api):
    from shaperd.discovery.kubernetes.kubeconfig import ClientConfig

    return ClientConfig(host=api.url)


def _wait(cond, ev: threading.Event, timeout: float = 20.0) -> bool:
    """Wait on change notifications (no sleeps) until ``cond()`` holds or the deadline passes."""
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ev.wait(min(left, 0.2))
        ev.clear()
    return True


def test_list_then_watch_follows_adds_changes_and_deletes(api):
    api.collection(PGS)
    api.put_object(PGS, {"metadata": {"name": "pg1", "namespace": "t"}, "spec": {"queue": "q1"}})
    ev = threading.Event()
    w = ResourceWatcher(PGS, ev.set, client_configuration=_cfg(api))
    w.start()
    try:
        assert _wait(lambda: "t/pg1" in w.snapshot(), ev)
        api.put_object(PGS, {"metadata": {"name": "pg1", "namespace": "t"}, "spec": {"queue": "q2"}})
        assert _wait(lambda: w.snapshot()["t/pg1"]["spec"]["queue"] == "q2", ev)
        api.delete_object(PGS, "t/pg1")
        assert _wait(lambda: w.snapshot() == {}, ev)
        assert w.synced and not w.absent
    finally:
        w.stop()


def test_a_missing_api_group_counts_as_synced_and_empty_and_is_retried_slowly(api):
    ev = threading.Event()
    waits: list[float] = []
    gate = threading.Event()

    def wait(delay_s):  # the retry after a 404: recorded, then released only at stop
        waits.append(delay_s)
        gate.wait(20)

    w = ResourceWatcher(PGS, ev.set, client_configuration=_cfg(api), absent_retry_s=60, wait=wait)
    w.start()
    try:
        assert _wait(lambda: w.has_synced, ev)
        assert w.absent and w.snapshot() == {} and waits == [60]
    finally:
        gate.set()
        w.stop()


def test_configmap_source_reads_only_its_object(api):
    api.collection(CMS)
    api.put_object(CMS, {"metadata": {"name": "other", "namespace": "kubeflow"}, "data": {"x": "y"}})
    ev = threading.Event()
    src = ConfigMapSource("kubeflow/training-network-isolation", client_configuration=_cfg(api))
    src.start(ev.set)
    try:
        assert _wait(lambda: src.has_synced, ev)
        with pytest.raises(ConfigError, match="not found"):
            src.load()
        api.put_object(CMS, {"metadata": {"name": "training-network-isolation", "namespace": "kubeflow"},
                             "data": {"traffic-shaping.yaml": "tenants: [{name: a, bandwidthGuarantee: 1Gbps}]"}})
        assert _wait(lambda: src.watcher.snapshot(), ev)
        assert [t.name for t in src.load().tenants] == ["a"]
        assert set(src.watcher.snapshot()) == {"kubeflow/training-network-isolation"}
    finally:
        src.stop()


@pytest.mark.parametrize("bad", ["kubeflow", "/x", "a/", "a/b/c"])
def test_config_map_refs_are_namespace_slash_name(bad):
    with pytest.raises(ValueError):
        parse_ref(bad)


CNPS = "/apis/cilium.io/v2/ciliumnetworkpolicies"


def test_cilium_policies_from_the_cluster_add_scopes_and_a_bad_one_costs_nobody(api):
    from shaperd.core import config
    from shaperd.discovery.kubernetes.ciliumpolicies import CiliumPolicyView

    def cnp(name, labels, rule):
        return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
                "metadata": {"name": name, "namespace": "kubeflow"},
                "spec": {"endpointSelector": {"matchLabels": labels}, "egress": [rule]}}

    api.collection(CNPS)  # the clusterwide collection is absent: 404, said once, empty
    api.put_object(CNPS, cnp("a-pods", {"training-tenant": "tenant-a"},
                             {"toCIDR": ["10.244.0.0/16"], "bandwidth": "40Gbps"}))
    api.put_object(CNPS, cnp("broken", {"training-tenant": "tenant-b"}, {"toCIDR": ["10.1.0.1/16"], "bandwidth": "1Gbps"}))
    api.put_object(CNPS, cnp("plain", {"app": "x"}, {"toCIDR": ["10.2.0.0/16"]}))  # ordinary policy: ignored
    ev = threading.Event()
    view = CiliumPolicyView(ev.set, client_configuration=_cfg(api))
    view.start()
    try:
        assert _wait(lambda: view.has_synced and len(view.watchers[0].snapshot()) == 3, ev)
        cfg = config.load_text("tenants: [{name: tenant-a, bandwidthGuarantee: 1Gbps}, "
                               "{name: tenant-b, bandwidthGuarantee: 1Gbps}]")
        eff = view.effective(cfg)
        assert [(str(d.cidrs[0]), d.limit_bps) for d in eff.tenant("tenant-a").destinations] == [
            ("10.244.0.0/16", 40 * 10**9)]
        assert eff.tenant("tenant-b").destinations == ()
        assert view.watchers[1].absent
    finally:
        view.stop()
