"""RBAC against the requests the agent really makes, as the fake API server recorded them.

``shaperd run`` is started with the DaemonSet's own arguments (daemonset/base
plus every component that adds one) and a kubeconfig pointing at the fake
API (tests/k8s_fake.py); the Daemon class is replaced by a stand-in that
keeps what the command line built for it, so the pod watcher, the tenants
ConfigMap source, the Cilium policy view and the Volcano view are exactly
the objects the agent would run. Each is then driven through its paths:
the first list, a watch that delivers an event, and the relist after the
server has forgotten the version the watch resumed from (410 Gone); the
startup taint's remover reads its node and patches the taint off.

Every request the fake recorded, as the API server's authorizer sees it
(verb, group, resource, namespace, name), must be allowed by the roles in
daemonset/ bound to the agent's service account (tests/rbac.py), and every
rule those roles grant must have been needed by some request.
"""

from __future__ import annotations

import threading
import time

import pytest
import structlog
import yaml

from shaperd.cli import main as cli
from shaperd.daemon import service

from .. import rbac
from ..k8s_fake import Access, make_pod, write_kubeconfig

NODE = "node-1"
DEADLINE_S = 60.0  # bounds a failure only
CNPS = "/apis/cilium.io/v2/ciliumnetworkpolicies"
CCNPS = "/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies"
PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/podgroups"
QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"


def daemonset_args() -> list[str]:
    """The agent container's args in daemonset/base, plus what each component's patch appends to them."""
    ds = yaml.safe_load((rbac.DAEMONSET / "base" / "daemonset.yaml").read_text())
    args = list(ds["spec"]["template"]["spec"]["containers"][0]["args"])
    for kust in sorted(rbac.DAEMONSET.glob("components/*/kustomization.yaml")):
        for patch in yaml.safe_load(kust.read_text()).get("patches", []):
            ops = yaml.safe_load(patch.get("patch", "")) or []
            for op in ops if isinstance(ops, list) else []:  # a strategic-merge patch (seccomp-localhost) adds no args
                if op.get("op") == "add" and op.get("path", "").endswith("/containers/0/args/-"):
                    args.append(op["value"])
    return args


class _Built:
    """Stands in for the Daemon: keeps what ``shaperd run`` built for it, runs nothing."""

    seen: dict = {}

    def __init__(self, config, make_reconciler, **kw):
        _Built.seen = kw

    def run(self) -> int:
        return 0


@pytest.fixture
def agent(api, tmp_path, monkeypatch):
    """What ``shaperd run`` with the DaemonSet's args builds, pointed at the fake API server."""
    args = daemonset_args()
    assert "--config-map" in args and "--cilium-policies" in args and "--remove-taint" in args  # the components covered
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    monkeypatch.setenv("NODE_NAME", NODE)  # the DaemonSet's downward API
    monkeypatch.setattr(service, "Daemon", _Built)
    saved = structlog.get_config()  # --log-json configures logging onto this test's stderr
    try:
        assert cli.main(args + ["--kubeconfig", str(kubeconfig), "--metrics-address", ""]) == 0
    finally:
        structlog.configure(**saved)
    return _Built.seen


def _wait(cond, ev: threading.Event) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ev.wait(min(left, 0.2))
        ev.clear()
    return True


def _lists(api, path: str) -> int:
    return sum(1 for r in api.requests if r["path"] == path and not r["watch"])


def _watches(api, path: str) -> int:
    return sum(1 for r in api.requests if r["path"] == path and r["watch"])


def test_every_request_the_agent_makes_is_allowed_and_every_rule_is_needed(api, agent):
    cm_ns, cm_name = agent["config_source"].namespace, agent["config_source"].name
    cms = f"/api/v1/namespaces/{cm_ns}/configmaps"
    for path in (cms, CNPS, CCNPS, PODGROUPS, QUEUES):
        api.collection(path)
    api.put_object(cms, {"metadata": {"name": cm_name, "namespace": cm_ns},
                         "data": {"traffic-shaping.yaml": "tenants: [{name: a, bandwidthGuarantee: 1Gbps}]"}})
    api.put_object(cms, {"metadata": {"name": "someone-elses", "namespace": cm_ns}, "data": {}})
    api.add_pod(make_pod("p0", NODE, labels={"training-tenant": "a"}))
    api.add_node(NODE, taints=[{"key": "shaperd.io/agent-not-ready", "effect": "NoSchedule"}])
    api.add_node("node-2", taints=[{"key": "shaperd.io/agent-not-ready", "effect": "NoSchedule"}])

    ev = threading.Event()
    pods = agent["pod_watcher_factory"](ev.set)
    source = agent["config_source"]
    cilium = agent["cilium_factory"](ev.set)
    volcano = agent["volcano_factory"](ev.set)  # the daemon starts it once a tenant names a Volcano queue
    running = []
    try:
        pods.start()
        running.append(pods)
        source.start(ev.set)
        running.append(source)
        for view in (cilium, volcano):
            view.start()
            running.append(view)
        assert _wait(lambda: pods.has_synced and source.has_synced and cilium.has_synced and volcano.has_synced, ev)
        watched = (cms, CNPS, CCNPS, PODGROUPS, QUEUES, "/api/v1/pods")
        assert _wait(lambda: all(_watches(api, p) >= 1 for p in watched), ev)
        # Events through the open watches.
        api.add_pod(make_pod("p1", NODE))
        api.put_object(cms, {"metadata": {"name": cm_name, "namespace": cm_ns},
                             "data": {"traffic-shaping.yaml": "tenants: [{name: b, bandwidthGuarantee: 1Gbps}]"}})
        api.put_object(CNPS, {"metadata": {"name": "pol", "namespace": "kubeflow"}, "spec": {}})
        api.put_object(CCNPS, {"metadata": {"name": "cpol"}, "spec": {}})
        api.put_object(PODGROUPS, {"metadata": {"name": "pg", "namespace": "team"}, "spec": {"queue": "q"}})
        api.put_object(QUEUES, {"metadata": {"name": "q"}, "spec": {"weight": 3}})
        assert _wait(lambda: "p1" in {p.name for p in pods.snapshot().values()}
                     and [t.name for t in source.load().tenants] == ["b"]
                     and all(len(w.snapshot()) == 1 for w in cilium.watchers)
                     and volcano.podgroups.snapshot() and volcano.queues.snapshot(), ev)
        # The server forgets history and cuts every watch: each resumes, gets 410 Gone, and lists again.
        lists_before = {p: _lists(api, p) for p in watched}
        api.unrelated_writes()  # past every version a watch holds, so each of them is too old now
        api.compact()
        api.drop_watches()
        assert _wait(lambda: all(_lists(api, p) > lists_before[p] for p in watched), ev)
        # The startup taint (daemonset/components/startup-taint): after the first enforcing reconcile.
        taint = agent["startup_taint"]
        taint.enforced()
        running.append(taint)
        assert taint.done.wait(DEADLINE_S) and taint.state == "removed"
    finally:
        for r in running:
            r.stop()

    accesses = api.accesses()
    grants = rbac.agent_grants()
    # Lists and watches, and the startup taint's one read and one patch, of its own node only.
    assert {a.verb for a in accesses} == {"list", "watch", "get", "patch"}
    assert {a for a in accesses if a.resource == "nodes"} == {Access("get", "", "nodes", "", NODE),
                                                             Access("patch", "", "nodes", "", NODE)}
    assert api.node_taints("node-2") and not api.node_taints(NODE)
    assert rbac.denied(grants, accesses) == []
    # Least privilege: no grant the agent never needed (a new rule needs a request here, or its reason here).
    assert rbac.unused(grants, accesses) == []
    # The ConfigMap was only ever asked for by name (what lets resourceNames authorise a list and a watch).
    assert {a for a in accesses if a.resource == "configmaps"} == {
        Access("list", "", "configmaps", cm_ns, cm_name), Access("watch", "", "configmaps", cm_ns, cm_name)}


def test_the_checker_refuses_what_the_roles_do_not_grant():
    """tests/rbac.py is an authorizer, not a rubber stamp: writes, other names, other namespaces are refused."""
    grants = rbac.agent_grants()
    ok = Access("list", "", "configmaps", "kubeflow", "training-network-isolation")
    assert rbac.denied(grants, [ok]) == []
    for bad in (ok._replace(verb="get"), ok._replace(verb="update"), ok._replace(name="another"),
                ok._replace(name=""), ok._replace(namespace="default"), Access("list", "", "secrets"),
                Access("create", "", "pods"), Access("get", "", "pods", "default", "p0"),
                Access("list", "cilium.io", "ciliumendpoints"), Access("get", path="/version"),
                Access("update", "", "nodes", "", NODE), Access("patch", "", "nodes/status", "", NODE),
                Access("delete", "", "nodes", "", NODE), Access("list", "", "nodes")):
        assert rbac.denied(grants, [bad]) == [bad], bad


def test_the_fake_records_the_verb_the_authorizer_would_check():
    from ..k8s_fake import request_access as ra

    assert ra("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=n"}) == Access("list", "", "pods")
    assert ra("GET", "/api/v1/pods", {"watch": "true"}) == Access("watch", "", "pods")
    assert ra("GET", "/api/v1/namespaces/k/configmaps", {"fieldSelector": "metadata.name=x"}) == Access(
        "list", "", "configmaps", "k", "x")
    assert ra("GET", "/api/v1/namespaces/k/configmaps/x", {}) == Access("get", "", "configmaps", "k", "x")
    assert ra("GET", "/api/v1/watch/namespaces/k/pods", {}) == Access("watch", "", "pods", "k")
    assert ra("GET", "/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies", {}) == Access(
        "list", "cilium.io", "ciliumclusterwidenetworkpolicies")
    assert ra("PATCH", "/api/v1/namespaces/k/pods/p/status", {}) == Access("patch", "", "pods/status", "k", "p")
    assert ra("DELETE", "/api/v1/namespaces/k/pods", {}) == Access("deletecollection", "", "pods", "k")
    assert ra("GET", "/api/v1/namespaces/k", {}) == Access("get", "", "namespaces", "k", "k")
    assert ra("GET", "/apis", {}) == Access("get", path="/apis")


def test_a_write_is_recorded_and_refused(api):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{api.url}/api/v1/namespaces/k/configmaps", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    assert api.accesses() == [Access("create", "", "configmaps", "k")]
