"""The webhook's decision, pure: AdmissionReview of a Pod in, JSONPatch out (applied here with the
independent ``jsonpatch`` package, RFC 6902)."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
import pytest

from shaperd.core import config
from shaperd.webhook.admission import Mutator

CFG = config.load_text("""
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    priority: 100
    match: {interfaces: [eth0]}
    rdma:
      devices: ["mlx5_0:1"]
      nccl: {NCCL_IB_TIMEOUT: "22", NCCL_SOCKET_IFNAME: "=net1", NCCL_IB_GID_INDEX: "3"}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
    match: {namespaces: [team-b]}
    rdma: {serviceLevel: 3, trafficClass: 106, nccl: {NCCL_IB_RETRY_CNT: "7"}}
""")
ENV_A = {"NCCL_IB_SL": "0", "NCCL_IB_TC": "106", "NCCL_IB_TIMEOUT": "22"}
ENV_B = {"NCCL_IB_SL": "3", "NCCL_IB_TC": "106", "NCCL_IB_RETRY_CNT": "7"}


def review(pod: dict, namespace="default", operation="CREATE", uid="u-1", kind="Pod") -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": kind},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": namespace, "operation": operation, "object": pod},
    }).encode()


def pod(labels=None, containers=None, init=None) -> dict:
    spec = {"containers": containers if containers is not None else [{"name": "main", "image": "x"}]}
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "job-", "labels": labels or {}},
            "spec": spec}


def patched(verdict, obj: dict) -> dict:
    r = verdict.response["response"]
    assert r["allowed"] is True and r["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(obj, json.loads(base64.b64decode(r["patch"])))


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def test_every_container_and_init_container_gets_the_tenants_node_independent_env():
    p = pod({"training-tenant": "tenant-a"}, init=[{"name": "setup"}],
            containers=[{"name": "main"}, {"name": "side", "env": [{"name": "OTHER", "value": "1"}]}])
    v = Mutator(CFG).review(review(p))
    assert v.tenant == "tenant-a" and v.uid == "u-1" and v.response["response"]["uid"] == "u-1"
    out = patched(v, copy.deepcopy(p))
    assert env_of(out["spec"]["initContainers"][0]) == ENV_A
    assert env_of(out["spec"]["containers"][0]) == ENV_A
    assert env_of(out["spec"]["containers"][1]) == {"OTHER": "1", **ENV_A}  # appended after the pod's own
    # Node-specific names never come from the webhook, not even as passthrough: they name this node's devices.
    assert not {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX"} & set(env_of(out["spec"]["containers"][0]))


def test_a_variable_the_container_sets_is_never_overridden_even_from_a_secret():
    own = [{"name": "NCCL_IB_SL", "value": "5"},
           {"name": "NCCL_IB_TIMEOUT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    p = pod({"training-tenant": "tenant-a"}, containers=[{"name": "main", "env": copy.deepcopy(own)}])
    v = Mutator(CFG).review(review(p))
    out = patched(v, copy.deepcopy(p))
    env = out["spec"]["containers"][0]["env"]
    assert env[:2] == own and [e["name"] for e in env[2:]] == ["NCCL_IB_TC"]
    assert v.kept == {"main": ("NCCL_IB_SL", "NCCL_IB_TIMEOUT")} and v.added == {"main": ("NCCL_IB_TC",)}


def test_a_second_review_of_the_mutated_pod_adds_nothing():
    """reinvocationPolicy IfNeeded: the webhook may see its own output again."""
    p = pod({"training-tenant": "tenant-a"})
    m = Mutator(CFG)
    once = patched(m.review(review(p)), copy.deepcopy(p))
    again = m.review(review(once))
    assert again.tenant == "tenant-a" and not again.patched and "patch" not in again.response["response"]


def test_containers_with_env_from_are_skipped_by_default_and_added_with_env_from_add():
    c = [{"name": "cfg", "envFrom": [{"configMapRef": {"name": "train"}}]}, {"name": "plain"}]
    p = pod({"training-tenant": "tenant-a"}, containers=c)
    v = Mutator(CFG).review(review(p))
    out = patched(v, copy.deepcopy(p))
    assert "env" not in out["spec"]["containers"][0] and env_of(out["spec"]["containers"][1]) == ENV_A
    assert v.skipped == ("cfg",)
    out = patched(Mutator(CFG, env_from="add").review(review(p)), copy.deepcopy(p))
    assert env_of(out["spec"]["containers"][0]) == ENV_A
    with pytest.raises(ValueError):
        Mutator(CFG, env_from="sometimes")


def test_the_tenant_comes_from_the_namespace_as_in_the_agent():
    p = pod()
    v = Mutator(CFG).review(review(p, namespace="team-b"))
    assert v.tenant == "tenant-b" and env_of(patched(v, p)["spec"]["containers"][0]) == ENV_B


@pytest.mark.parametrize("body,why", [
    (review(pod()), "the pod is of no tenant"),
    (review(pod({"training-tenant": "tenant-a"}), namespace="team-b"), "matches tenants tenant-a, tenant-b"),
    (review(pod({"training-tenant": "tenant-a"}), operation="UPDATE"), "operation UPDATE, not CREATE"),
    (review({"metadata": {}}, kind="Service"), "not a Pod"),
])
def test_no_tenant_or_not_a_pod_create_is_allowed_with_no_patch(body, why):
    v = Mutator(CFG).review(body)
    assert v.response == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "response": {"uid": "u-1", "allowed": True}}
    assert why in v.why and not v.malformed


@pytest.mark.parametrize("body,uid,why", [
    (b"\xff\xfe not json", "", "not JSON"),
    (b"[1, 2]", "", "AdmissionReview"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                 "request": {"uid": "u-9"}}).encode(), "u-9", "not an admission.k8s.io/v1 AdmissionReview"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "", "request"),
    (review(pod({"training-tenant": "tenant-a"}), uid=""), "", "request.uid"),
    (review({"metadata": {"labels": ["x"]}, "spec": {}}), "u-1", "labels"),
    (review({"metadata": {"labels": {"training-tenant": "tenant-a"}}, "spec": {"containers": {"a": 1}}}),
     "u-1", "spec.containers: expected a list"),
    (review({"metadata": {"labels": {"training-tenant": "tenant-a"}}, "spec": {"containers": [{"env": 3}]}}),
     "u-1", "spec.containers[0].env: expected a list"),
    (review({"metadata": {"labels": {"training-tenant": "tenant-a"}}, "spec": {"containers": ["x"]}}),
     "u-1", "spec.containers[0]: expected an object"),
    (b"[" * 100000 + b"]" * 100000, "", ""),
])
def test_malformed_reviews_are_allowed_with_no_patch_and_a_reason(body, uid, why):
    v = Mutator(CFG).review(body)
    assert v.malformed and why in v.why and v.why
    assert v.response["response"] == {"uid": uid, "allowed": True}
