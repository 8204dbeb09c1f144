"""daemonset/: every overlay renders with kustomize and passes what an API server would check.

Three layers, because offline schema validation alone once passed a manifest the API
server refuses (a Bidirectional mount on an unprivileged container):
1. the rendered objects, strict, against the Kubernetes 1.29, 1.30 and 1.31 schemas
   (kubernetes-validate, offline). CRD kinds (ServiceMonitor, PrometheusRule, cert-manager's
   Issuer and Certificate) have no schema there: they get a structural check of the
   fields their controllers require instead. The startup taint's ValidatingAdmissionPolicy
   (admissionregistration.k8s.io/v1) exists from 1.30: validated for 1.30 and 1.31, and shown
   refused by 1.29 (which has only v1beta1);
2. API-server validation rules no schema holds (mount propagation, no_new_privs with
   privileged or SYS_ADMIN) and Pod Security admission (the namespace's level admits the pods);
3. the project's own rules: pullable image references, the tenants ConfigMap outside every
   overlay, least-privilege RBAC, the PrometheusRule generated from deploy/prometheus.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import subprocess
from pathlib import Path

import pytest
import yaml

from shaperd.core import config
from shaperd.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DS = ROOT / "daemonset"
OVERLAYS = sorted(p.name for p in (DS / "overlays").iterdir() if (p / "kustomization.yaml").exists())
K8S_VERSIONS = ["1.29.0", "1.30.0", "1.31.0"]
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
# Served as admissionregistration.k8s.io/v1 from 1.30 (GA); 1.29 has only v1beta1, off by default.
# Validated for 1.30+, and checked to be refused by 1.29 (test_the_admission_policy_needs_1_30).
SINCE_1_30 = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def _validated_kinds(version: str) -> set[str]:
    """The kinds kubernetes-validate has no schema for at ``version`` (skipped, each for its reason)."""
    return CRD_KINDS | (SINCE_1_30 if version.startswith("1.29.") else set())


def _kustomize_cmd() -> list[str] | None:
    """kubectl's built-in kustomize (v4+: components), else a kustomize binary; None if neither."""
    if shutil.which("kubectl"):
        r = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True, timeout=30,
                           start_new_session=True)
        m = re.search(r"Kustomize Version: v(\d+)", r.stdout)
        if m and int(m.group(1)) >= 4:
            return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


KUSTOMIZE = _kustomize_cmd()
needs_kustomize = pytest.mark.skipif(
    KUSTOMIZE is None, reason="no kustomize v4+ (kubectl kustomize or kustomize build) on PATH; see scripts/setup")


COMPONENTS = sorted(p.name for p in (DS / "components").iterdir() if (p / "kustomization.yaml").exists())


def render(overlay: str | Path) -> list[dict]:
    path = overlay if isinstance(overlay, Path) else DS / "overlays" / overlay
    r = subprocess.run([*KUSTOMIZE, str(path)], capture_output=True, text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> list[dict]:
    """The base with every component, as an operator's own overlay would combine them."""
    if KUSTOMIZE is None:
        pytest.skip("no kustomize v4+ on PATH")
    return render(overlay(tmp_path_factory.mktemp("overlay"), COMPONENTS))


def overlay(tmp: Path, components: list[str], resources: tuple[str, ...] = ("base",), **extra) -> Path:
    """An operator's overlay in tmp of the base (or an overlay) and these components, plus extra fields."""
    rel = os.path.relpath(DS, tmp)  # kustomize refuses absolute paths to bases and components
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": [f"{rel}/{r}" for r in resources], "components": [f"{rel}/components/{c}" for c in components],
           "images": [{"name": "shaperd", "newName": "ghcr.io/shaperd/shaperd", "newTag": "0.1.0"}]}
    for k, v in extra.items():
        doc[k] = [f"{rel}/{x}" for x in v] if k == "transformers" else v
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return tmp


@pytest.fixture(scope="module")
def rendered(everything) -> dict[str, list[dict]]:
    """Every overlay, and "+all": the base with every component."""
    return {**{o: render(o) for o in OVERLAYS}, "+all": everything}


def test_the_components_are_the_documented_ones():
    assert COMPONENTS == ["cilium-policies", "config-map", "gke-quota", "monitoring", "monitoring-selector",
                          "rdma-webhook", "seccomp-localhost", "startup-taint", "volcano"]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def pod_specs(docs: list[dict]):
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            yield d, d["spec"]["template"]["spec"]


def containers(spec: dict):
    yield from spec.get("initContainers", []) + spec.get("containers", [])


def test_the_overlays_are_the_documented_ones():
    assert OVERLAYS == ["default", "full", "monitoring", "rdma-webhook"]


# ---- 1. schemas ------------------------------------------------------------------------------

@needs_kustomize
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_builtin_object_is_valid_strict_for(version, rendered):
    kv = pytest.importorskip("kubernetes_validate")
    checked = 0
    for overlay, docs in rendered.items():
        for d in docs:
            if d["kind"] in _validated_kinds(version):
                continue
            try:
                kv.validate(d, version, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{overlay}: {d['kind']}/{d['metadata']['name']} invalid for {version}: {e.message}")
            checked += 1
    assert checked >= 5 * 6  # every rendering's namespace, RBAC, DaemonSet and Service at least


def test_a_bad_manifest_is_refused_by_the_validator():
    # The check above can fail: an unknown field under strict, and a wrong type.
    kv = pytest.importorskip("kubernetes_validate")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": "x"}]}}
    with pytest.raises(kv.ValidationError):
        kv.validate(svc, "1.30.0", strict=True)
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kv.ValidationError):
        kv.validate(svc, "1.30.0", strict=True)


@needs_kustomize
def test_crd_objects_carry_what_their_controllers_require(rendered):
    docs = rendered["full"]
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    svc = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "shaperd-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # No namespaceSelector: the operator looks in the ServiceMonitor's own namespace, the Service's.
    assert "namespaceSelector" not in sm["spec"] and sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    (pr,) = by_kind(docs, "PrometheusRule")
    assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["spec"]["groups"]
    for g in pr["spec"]["groups"]:
        assert g["name"] and all(("alert" in r) ^ ("record" in r) and r["expr"] for r in g["rules"])
    for kind in ("Issuer", "Certificate"):
        objs = by_kind(docs, kind)
        assert len(objs) == 2 and all(o["apiVersion"] == "cert-manager.io/v1" and o["spec"] for o in objs)


# ---- 2. what the API server and Pod Security admission check --------------------------------

PSA_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def baseline_violations(spec: dict) -> list[str]:
    """What the Pod Security "baseline" level forbids in this pod (the parts shaperd could hit)."""
    out = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"hostPath volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    for c in containers(spec):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"privileged container {c['name']}")
        added = {a.removeprefix("CAP_") for a in sc.get("capabilities", {}).get("add", [])}
        out += [f"capability {a} in {c['name']}" for a in sorted(added - PSA_BASELINE_CAPS)]
        out += [f"hostPort in {c['name']}" for p in c.get("ports", []) if p.get("hostPort")]
    return out


def api_server_errors(spec: dict) -> list[str]:
    """pkg/apis/core/validation rules that no OpenAPI schema holds."""
    out = []
    for c in containers(spec):
        sc = c.get("securityContext", {})
        privileged = bool(sc.get("privileged"))
        for m in c.get("volumeMounts", []):
            if m.get("mountPropagation") == "Bidirectional" and not privileged:
                out.append(f"{c['name']}: Bidirectional mount propagation of {m['name']} is available only to "
                           "privileged containers")
        if sc.get("allowPrivilegeEscalation") is False:
            if privileged:
                out.append(f"{c['name']}: allowPrivilegeEscalation false with privileged true")
            # The API server matches the literal CAP_SYS_ADMIN; SYS_ADMIN is the same capability
            # (and no_new_privs no barrier for it), so both spellings are refused here.
            if {"SYS_ADMIN", "CAP_SYS_ADMIN"} & set(sc.get("capabilities", {}).get("add", [])):
                out.append(f"{c['name']}: allowPrivilegeEscalation false with SYS_ADMIN")
    return out


def test_the_rule_checks_catch_the_manifest_that_was_refused():
    bad = {"containers": [{"name": "a", "securityContext": {"allowPrivilegeEscalation": False,
                                                          "capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}},
                           "volumeMounts": [{"name": "n", "mountPath": "/run/netns",
                                             "mountPropagation": "Bidirectional"}]}],
           "hostNetwork": True, "volumes": [{"name": "n", "hostPath": {"path": "/run/netns"}}]}
    assert len(api_server_errors(bad)) == 2
    assert set(baseline_violations(bad)) == {"host namespace hostNetwork", "hostPath volume n",
                                             "capability NET_ADMIN in a", "capability SYS_ADMIN in a"}


@needs_kustomize
def test_no_pod_breaks_an_api_server_rule(rendered):
    for overlay, docs in rendered.items():
        for obj, spec in pod_specs(docs):
            assert api_server_errors(spec) == [], f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"


@needs_kustomize
def test_pod_security_admission_admits_every_pod(rendered):
    for overlay, docs in rendered.items():
        namespaces = {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in by_kind(docs, "Namespace")}
        for obj, spec in pod_specs(docs):
            labels = namespaces[obj["metadata"]["namespace"]]
            level = labels.get("pod-security.kubernetes.io/enforce")
            if baseline_violations(spec):
                assert level == "privileged", (overlay, obj["metadata"]["name"], baseline_violations(spec))
        # The agent needs the host's network: without the label a baseline cluster rejects it.
        (agent,) = [o for o, _ in pod_specs(docs) if o["kind"] == "DaemonSet"]
        assert baseline_violations(agent["spec"]["template"]["spec"])


@needs_kustomize
def test_the_agent_is_hardened_and_each_capability_is_needed(rendered):
    (ds,) = by_kind(rendered["default"], "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "BPF"]}
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["priorityClassName"] == "system-node-critical" and {"operator": "Exists"} in spec["tolerations"]
    assert all("mountPropagation" not in m for m in c["volumeMounts"])
    # The probe's evidence of sch_fq/mq without SYS_ADMIN (kernel/qdisc_kinds.py): the host's module tree,
    # read-only, where Roots() reads it (shaperd/core/roots.py).
    from shaperd.core.roots import Roots

    mods = next(m for m in c["volumeMounts"] if m["mountPath"] == str(Roots().modules))
    assert mods.get("readOnly") is True
    (vol,) = [v for v in spec["volumes"] if v["name"] == mods["name"]]
    assert vol["hostPath"]["path"] == "/lib/modules" and vol["hostPath"].get("type") in (None, "", "Directory")
    req, lim = c["resources"]["requests"], c["resources"]["limits"]
    mib = lambda q: int(q.removesuffix("Mi"))  # noqa: E731
    # request >= the measured 58.7 MiB RSS (bench/pod_churn.py --kubelet) and a quarter; limit >= the largest
    # accepted tenants file's 167 MiB parse peak plus that RSS (BENCHMARKS.md "Agent memory")
    assert mib(req["memory"]) >= 73 and mib(lim["memory"]) >= 167 + 59
    args = build_parser().parse_args(c["args"])
    assert args.cmd == "run" and Path(args.config).parent == Path(
        next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "tenants"))


# ---- 3. the project's rules -----------------------------------------------------------------

IMAGE = re.compile(r"^(?P<registry>[a-z0-9.-]+\.[a-z]{2,}|localhost)(:\d+)?/(?P<repo>[a-z0-9._/-]+)"
                   r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(@sha256:[0-9a-f]{64})?$")


def pullable(ref: str) -> bool:
    m = IMAGE.match(ref)
    return bool(m) and ("@sha256:" in ref or (m["tag"] not in (None, "latest") and any(ch.isdigit() for ch in m["tag"])))


def test_the_image_rule():
    assert pullable("ghcr.io/shaperd/shaperd:0.1.0") and pullable("registry.local:5000/x/y@sha256:" + "a" * 64)
    assert not pullable("shaperd:0.1.0") and not pullable("ghcr.io/shaperd/shaperd:latest")
    assert not pullable("ghcr.io/shaperd/shaperd")


@needs_kustomize
def test_every_image_is_a_pullable_reference_with_a_real_tag(rendered):
    for overlay, docs in rendered.items():
        for obj, spec in pod_specs(docs):
            for c in containers(spec):
                assert pullable(c["image"]), f"{overlay}: {obj['metadata']['name']}/{c['name']}: {c['image']}"


SECCOMP_CM = "shaperd-seccomp-"  # daemonset/components/seccomp-localhost's ConfigMap (name + content hash)


@needs_kustomize
def test_no_overlay_carries_the_tenants_so_an_upgrade_keeps_them(rendered):
    tenants = yaml.safe_load((DS / "tenants" / "traffic-shaping.yaml").read_text())
    cfg = config.load_text(tenants["data"]["traffic-shaping.yaml"], "daemonset/tenants")
    assert [t.name for t in cfg.tenants] == ["tenant-a", "tenant-b"]
    for overlay, docs in rendered.items():
        # The one ConfigMap a component ships is seccomp-localhost's profile (generated, hashed), never tenants.
        assert all(c["metadata"]["name"].startswith(SECCOMP_CM) for c in by_kind(docs, "ConfigMap")), overlay
        for obj, spec in pod_specs(docs):
            cms = [v["configMap"]["name"] for v in spec.get("volumes", [])
                   if "configMap" in v and not v["configMap"]["name"].startswith(SECCOMP_CM)]
            assert cms == [tenants["metadata"]["name"]], (overlay, obj["metadata"]["name"])
            assert obj["metadata"]["namespace"] == tenants["metadata"]["namespace"]


@needs_kustomize
def test_rbac_is_list_and_watch_of_pods_only(rendered):
    (role,) = by_kind(rendered["default"], "ClusterRole")
    # That these are the requests the agent makes: tests/unit/test_rbac_requests.py (against the fake API).
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    (binding,) = by_kind(rendered["default"], "ClusterRoleBinding")
    (sa,) = by_kind(rendered["default"], "ServiceAccount")
    (ds,) = by_kind(rendered["default"], "DaemonSet")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_the_prometheusrule_is_generated_from_the_rules_file():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-prometheusrule"), "--check"], capture_output=True,
                       text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr
    pr = yaml.safe_load((DS / "components" / "monitoring" / "prometheusrule.yaml").read_text())
    src = yaml.safe_load((ROOT / "deploy" / "prometheus" / "shaperd-alerts.yaml").read_text())
    assert pr["spec"]["groups"] == src["groups"]


@needs_kustomize
def test_the_agents_arguments_suit_the_cli_in_every_rendering(rendered):
    for overlay, docs in rendered.items():
        (ds,) = by_kind(docs, "DaemonSet")
        args = build_parser().parse_args(ds["spec"]["template"]["spec"]["containers"][0]["args"])
        assert args.cmd == "run", overlay
    (ds,) = by_kind(rendered["+all"], "DaemonSet")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cilium-policies" in args and args[args.index("--config-map") + 1] == "kubeflow/training-network-isolation"


@needs_kustomize
def test_every_role_is_read_only_and_bound_to_the_agent(rendered):
    docs = rendered["+all"]
    roles = by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
    assert len(roles) == 5  # pods, Volcano, Cilium policies, the one ConfigMap, the startup taint's nodes
    for r in roles:
        if r["metadata"]["name"] == "shaperd-startup-taint":
            # The one write: bounded to its own node and that taint by the admission policy (below).
            assert r["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
            continue
        for rule in r["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, r["metadata"]["name"]
    for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "shaperd", "namespace": "shaperd-system"}]


# ---- 4. manifests that move and are picked up ------------------------------------------------

# Every component, config-map included: its Role and RoleBinding stay in the ConfigMap's namespace
# (kubeflow), put back there by daemonset/namespace-refs after `namespace:` moved them.
MOVABLE = COMPONENTS
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


@pytest.fixture(scope="module")
def moved(tmp_path_factory) -> tuple[str, str]:
    """The base and every component with `namespace: netshape`: with daemonset/namespace-refs, without."""
    if KUSTOMIZE is None:
        pytest.skip("no kustomize v4+ on PATH")
    out = []
    for refs in (["namespace-refs"], []):
        d = overlay(tmp_path_factory.mktemp("moved"), MOVABLE, namespace="netshape", transformers=refs)
        r = subprocess.run([*KUSTOMIZE, str(d)], capture_output=True, text=True, timeout=60, start_new_session=True)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout)
    return out[0], out[1]


@needs_kustomize
def test_a_namespace_overlay_with_the_namespace_refs_names_shaperd_system_nowhere(moved):
    text, without = moved
    assert "shaperd-system" not in text
    # The check can fail: kustomize's namespace: alone leaves the names inside strings.
    assert without.count("shaperd-system") >= 5
    # ... and moves the config-map component's Role away from its ConfigMap.
    kinds_without = {(d["kind"], d["metadata"].get("namespace")) for d in yaml.safe_load_all(without) if d
                     and d["metadata"]["name"] == "shaperd-tenants-reader"}
    assert kinds_without == {("Role", "netshape"), ("RoleBinding", "netshape")}
    docs = [d for d in yaml.safe_load_all(text) if d]
    (ns,) = by_kind(docs, "Namespace")
    assert ns["metadata"]["name"] == "netshape"
    tenants_reader = [d for d in docs if d["metadata"]["name"] == "shaperd-tenants-reader"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] not in CLUSTER_SCOPED
            and d not in tenants_reader} == {"netshape"}
    # The config-map component's Role and RoleBinding stay with the ConfigMap; the binding's subject moved.
    assert sorted((d["kind"], d["metadata"]["namespace"]) for d in tenants_reader) == [
        ("Role", "kubeflow"), ("RoleBinding", "kubeflow")]
    (rb,) = by_kind(docs, "RoleBinding")
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "shaperd", "namespace": "netshape"}]
    (cert,) = [c for c in by_kind(docs, "Certificate") if c["metadata"]["name"] == "shaperd-webhook"]
    assert cert["spec"]["dnsNames"] == ["shaperd-webhook.netshape.svc", "shaperd-webhook.netshape.svc.cluster.local"]
    (mwc,) = by_kind(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "netshape/shaperd-webhook-ca"
    (vap,) = by_kind(docs, "ValidatingAdmissionPolicy")
    assert vap["spec"]["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:netshape:shaperd'")
    (hook,) = mwc["webhooks"]
    assert hook["clientConfig"]["service"]["namespace"] == "netshape"
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["kube-system", "kube-public", "kube-node-lease", "netshape", "cert-manager"]
    for b in by_kind(docs, "ClusterRoleBinding"):
        assert {s["namespace"] for s in b["subjects"]} == {"netshape"}
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "netshape" and "namespaceSelector" not in sm["spec"]
    # The pods are admitted where they moved: the namespace keeps its Pod Security level.
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@needs_kustomize
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_moved_rendering_is_valid_strict_for(version, moved):
    kv = pytest.importorskip("kubernetes_validate")
    docs = [d for d in yaml.safe_load_all(moved[0]) if d]
    checked = 0
    for d in docs:
        if d["kind"] in _validated_kinds(version):
            continue
        try:
            kv.validate(d, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']} invalid for {version}: {e.message}")
        checked += 1
    assert checked >= 10
    for obj, spec in pod_specs(docs):
        assert api_server_errors(spec) == [], obj["metadata"]["name"]


@needs_kustomize
def test_the_monitoring_selector_component_labels_the_servicemonitor_and_the_rules_only(tmp_path):
    docs = render(overlay(tmp_path, ["monitoring", "monitoring-selector"]))
    labelled = {(d["kind"], d["metadata"]["name"]) for d in docs if "release" in d["metadata"].get("labels", {})}
    assert labelled == {("ServiceMonitor", "shaperd"), ("PrometheusRule", "shaperd")}
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (obj,) = by_kind(docs, kind)
        # kube-prometheus-stack's default selectors: release: <Helm release name>
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "shaperd"
    # Without it, the objects carry no release label (what a default kube-prometheus-stack ignores).
    plain = render("monitoring")
    assert not any("release" in d["metadata"].get("labels", {}) for d in plain)


@needs_kustomize
def test_the_gke_quota_admits_the_agents_priority_class_in_its_namespace(tmp_path):
    docs = render(overlay(tmp_path, ["gke-quota"]))
    (ds,) = by_kind(docs, "DaemonSet")
    (quota,) = by_kind(docs, "ResourceQuota")
    assert quota["metadata"]["namespace"] == ds["metadata"]["namespace"]
    (scope,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert scope["scopeName"] == "PriorityClass" and scope["operator"] == "In"
    assert ds["spec"]["template"]["spec"]["priorityClassName"] in scope["values"]
    assert int(quota["spec"]["hard"]["pods"]) >= 5000  # Kubernetes' largest supported cluster, one agent a node


def _selects(selector: dict, labels: dict) -> bool:
    return selector["matchLabels"].items() <= labels.items() and not selector.get("matchExpressions")


@needs_kustomize
def test_the_webhook_survives_a_drain_and_is_spread_across_nodes(rendered):
    docs = rendered["rdma-webhook"]
    (dep,) = by_kind(docs, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["replicas"] >= 2
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert _selects(pdb["spec"]["selector"], labels)
    (spread,) = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert _selects(spread["labelSelector"], labels)


@needs_kustomize
def test_the_agent_and_the_webhook_have_a_startup_probe_ahead_of_liveness(rendered):
    docs = rendered["+all"]
    for obj, spec in pod_specs(docs):
        (c,) = spec["containers"]
        start, live = c["startupProbe"], c["livenessProbe"]
        assert start["httpGet"] == live["httpGet"], obj["metadata"]["name"]
        # Longer to start than liveness would allow once running.
        budget = start["periodSeconds"] * start["failureThreshold"]
        assert budget >= 60 and budget > live["periodSeconds"] * live["failureThreshold"], obj["metadata"]["name"]
    assert {o["metadata"]["name"] for o, _ in pod_specs(docs)} == {"shaperd", "shaperd-webhook"}


# ---- 5. the webhook's CA, the startup taint ---------------------------------------------------

def _hours(d: str) -> float:
    m = re.fullmatch(r"(\d+)h", d)
    assert m, d
    return float(m.group(1))


def _named(docs: list[dict], kind: str, name: str) -> dict:
    (obj,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return obj


@needs_kustomize
def test_the_webhook_trusts_a_ca_that_survives_the_serving_certificates_renewals(rendered):
    docs = rendered["rdma-webhook"]
    (dep,) = by_kind(docs, "Deployment")
    ns = dep["metadata"]["namespace"]
    (mwc,) = by_kind(docs, "MutatingWebhookConfiguration")
    inject_ns, inject_name = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    ca = _named(docs, "Certificate", inject_name)
    # The caBundle comes from the CA: a Certificate with isCA, issued by the self-signed Issuer.
    assert inject_ns == ns and ca["spec"]["isCA"] is True
    root = _named(docs, "Issuer", ca["spec"]["issuerRef"]["name"])
    assert "selfSigned" in root["spec"] and ca["spec"]["issuerRef"]["kind"] == "Issuer"
    # The CA Issuer signs with the CA's secret; the serving certificate (the one the pod mounts) is its.
    (ca_issuer,) = [i for i in by_kind(docs, "Issuer") if i["spec"].get("ca", {}).get("secretName") ==
                    ca["spec"]["secretName"]]
    (tls_vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    leaf = [c for c in by_kind(docs, "Certificate") if c["spec"]["secretName"] == tls_vol["secret"]["secretName"]]
    (leaf,) = leaf
    assert leaf["spec"]["issuerRef"] == {"kind": "Issuer", "name": ca_issuer["metadata"]["name"]}
    assert not leaf["spec"].get("isCA") and leaf is not ca
    # Short leaf, long CA; the CA keeps its key when it renews, so leaves it signed earlier still verify.
    assert _hours(leaf["spec"]["duration"]) <= 24 * 90 < 24 * 365 * 5 <= _hours(ca["spec"]["duration"])
    assert _hours(leaf["spec"]["renewBefore"]) < _hours(leaf["spec"]["duration"])
    assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"
    assert leaf["spec"]["privateKey"]["rotationPolicy"] == "Always"
    # Every Issuer and Certificate in the webhook's namespace (an Issuer serves its own namespace only).
    assert {o["metadata"]["namespace"] for o in by_kind(docs, "Issuer") + by_kind(docs, "Certificate")} == {ns}


@needs_kustomize
def test_the_self_signed_fallback_component_restores_the_old_chain_and_moves_too(tmp_path):
    rel = os.path.relpath(DS, tmp_path)
    d = overlay(tmp_path, ["rdma-webhook", "rdma-webhook/selfsigned"], namespace="netshape",
                transformers=["namespace-refs"])
    text = subprocess.run([*KUSTOMIZE, str(d)], capture_output=True, text=True, timeout=60,
                          start_new_session=True, check=True).stdout
    assert rel and "shaperd-system" not in text
    docs = [x for x in yaml.safe_load_all(text) if x]
    (cert,) = by_kind(docs, "Certificate")
    (issuer,) = by_kind(docs, "Issuer")
    assert "selfSigned" in issuer["spec"] and cert["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    (mwc,) = by_kind(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "netshape/" + cert["metadata"]["name"]
    assert cert["spec"]["dnsNames"][0] == "shaperd-webhook.netshape.svc"


TAINT_KEY, TAINT_EFFECT = "shaperd.io/agent-not-ready", "NoSchedule"


def _tolerates(tolerations: list[dict], key: str, effect: str) -> bool:
    """core/v1 Toleration.ToleratesTaint for a taint without a value."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("operator", "Equal") == "Exists" and t.get("key") in (None, "", key):
            return True
        if t.get("operator", "Equal") == "Equal" and t.get("key") == key and not t.get("value"):
            return True
    return False


@pytest.fixture(scope="module")
def tainted(tmp_path_factory) -> list[dict]:
    if KUSTOMIZE is None:
        pytest.skip("no kustomize v4+ on PATH")
    return render(overlay(tmp_path_factory.mktemp("taint"), ["startup-taint"]))


@needs_kustomize
def test_the_startup_taint_component_asks_the_agent_to_remove_the_taint_it_tolerates(tainted):
    (ds,) = by_kind(tainted, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    args = build_parser().parse_args(spec["containers"][0]["args"])
    assert (args.remove_taint.key, args.remove_taint.effect) == (TAINT_KEY, TAINT_EFFECT)
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT} in spec["tolerations"]
    # The explicit toleration alone tolerates it (the base's blanket Exists may be narrowed by a site).
    assert _tolerates([{"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT}], TAINT_KEY, TAINT_EFFECT)
    assert not _tolerates([{"key": "other", "operator": "Exists"}], TAINT_KEY, TAINT_EFFECT)
    # NODE_NAME from the downward API: how the agent knows which node is its own.
    (env,) = [e for e in spec["containers"][0]["env"] if e["name"] == "NODE_NAME"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # Without the component, no flag and no node access.
    plain = render("default")
    (pds,) = by_kind(plain, "DaemonSet")
    assert build_parser().parse_args(pds["spec"]["template"]["spec"]["containers"][0]["args"]).remove_taint is None


def _policy(docs):
    (vap,) = by_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    return vap, binding


@needs_kustomize
def test_the_admission_policy_bounds_the_node_patch_to_the_agents_node_and_that_taint(tainted):
    """A review of the CEL's intent in the rendered manifest (the expressions are run against allowed and
    denied node updates in tests/unit/test_startup_taint_policy.py)."""
    vap, binding = _policy(tainted)
    (sa,) = by_kind(tainted, "ServiceAccount")
    spec = vap["spec"]
    assert vap["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert spec["failurePolicy"] == "Fail"  # a policy that cannot be evaluated denies
    # What RBAC grants the agent on nodes is what the policy watches: updates (a PATCH is one) of nodes.
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    # Only the agent's own service account is evaluated.
    (cond,) = spec["matchConditions"]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert cond["expression"] == f"request.userInfo.username == '{user}'"
    exprs = [" ".join(v["expression"].split()) for v in spec["validations"]]
    variables = {v["name"]: " ".join(v["expression"].split()) for v in spec["variables"]}
    # 1. its own node: the name in its bound token (ServiceAccountTokenPodNodeInfo); absent is denied.
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in variables["tokenNode"]
    assert exprs[0] == "variables.tokenNode != '' && object.metadata.name == variables.tokenNode"
    # 2. the taints after = before without exactly that key and effect, order kept.
    assert exprs[1] == ("variables.newTaints == variables.oldTaints.filter(t, "
                        f"!(t.key == '{TAINT_KEY}' && t.effect == '{TAINT_EFFECT}'))")
    assert variables["oldTaints"] == "has(oldObject.spec.taints) ? oldObject.spec.taints : []"
    assert variables["newTaints"] == "has(object.spec.taints) ? object.spec.taints : []"
    # 3. everything else a node update could change, equal.
    checked = set()
    for e in exprs[2:]:
        m = re.fullmatch(r"has\(object\.(\S+)\) == has\(oldObject\.\1\) && \(!has\(object\.\1\) \|\| "
                         r"object\.\1 == oldObject\.\1\)", e)
        assert m, e
        checked.add(m.group(1))
    assert checked == {"metadata.labels", "metadata.annotations", "metadata.ownerReferences", "metadata.finalizers",
                       "spec.unschedulable", "spec.podCIDR", "spec.podCIDRs", "spec.providerID",
                       "spec.configSource", "spec.externalID"}
    # Denials are 403 (the agent backs off), each saying what it refused.
    assert all(v["reason"] == "Forbidden" and v["message"] for v in spec["validations"])


@needs_kustomize
def test_the_admission_policy_needs_1_30(tainted):
    kv = pytest.importorskip("kubernetes_validate")
    vap, binding = _policy(tainted)
    for obj in (vap, binding):
        for version in ("1.30.0", "1.31.0"):
            kv.validate(obj, version, strict=True)
        with pytest.raises(kv.SchemaNotFoundError):  # 1.29 serves no admissionregistration.k8s.io/v1 policy
            kv.validate(obj, "1.29.0", strict=True)
        beta = dict(obj, apiVersion="admissionregistration.k8s.io/v1beta1")
        kv.validate(beta, "1.29.0", strict=True)  # ... only v1beta1 (off unless the API server enables it)


@needs_kustomize
@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_alone_moves_with_the_namespace(component, tmp_path):
    """The namespace-refs transformer works for every combination, not only with every component
    (a replacement whose source is missing fails the whole rendering)."""
    d = overlay(tmp_path, [component], namespace="netshape", transformers=["namespace-refs"])
    r = subprocess.run([*KUSTOMIZE, str(d)], capture_output=True, text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr
    assert "shaperd-system" not in r.stdout
    docs = [x for x in yaml.safe_load_all(r.stdout) if x]
    namespaced = {x["metadata"].get("namespace") for x in docs if x["kind"] not in CLUSTER_SCOPED}
    assert namespaced == ({"netshape", "kubeflow"} if component == "config-map" else {"netshape"})


@needs_kustomize
def test_the_config_map_namespace_is_one_value_in_the_three_places(tmp_path):
    docs = render(overlay(tmp_path, ["config-map"]))
    (ds,) = by_kind(docs, "DaemonSet")
    args = build_parser().parse_args(ds["spec"]["template"]["spec"]["containers"][0]["args"])
    (sa,) = by_kind(docs, "ServiceAccount")
    ns = args.config_map.split("/")[0]
    assert sa["metadata"]["annotations"]["shaperd.io/config-map-namespace"] == ns
    assert {(x["kind"], x["metadata"]["namespace"]) for x in docs if x["metadata"]["name"] == "shaperd-tenants-reader"} \
        == {("Role", ns), ("RoleBinding", ns)}
