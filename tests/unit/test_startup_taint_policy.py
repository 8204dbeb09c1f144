"""The startup-taint admission policy's CEL, run: what the API server would allow the agent to do to a node.

daemonset/components/startup-taint/policy.yaml is evaluated here by cel-python (a CEL
implementation independent of the API server's cel-go) the way the ValidatingAdmissionPolicy
plugin runs it: the matchConditions first (false: the policy does not apply, the request is
allowed by it), then the variables in order, then every validation, each of which must be true.
Objects are plain JSON maps, so ``has()`` of an absent field is false as it is on the real typed
objects. Kubernetes' own CEL libraries are not needed: the expressions use only standard CEL.

Allowed: the agent removing exactly shaperd.io/agent-not-ready:NoSchedule from the node in its
token. Denied: another node, a token without the node name, any other change with or without the
removal. Not evaluated: everyone else.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

celpy = pytest.importorskip("celpy")

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "daemonset" / "components" / "startup-taint" / "policy.yaml"
AGENT = "system:serviceaccount:shaperd-system:shaperd"
TAINT = {"key": "shaperd.io/agent-not-ready", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"}


def policy() -> dict:
    (vap,) = [d for d in yaml.safe_load_all(POLICY.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"]
    return vap["spec"]


def evaluate(old: dict, new: dict, user: str = AGENT, token_node: str | None = "node-1") -> str | None:
    """None if the policy allows the update (or does not apply), else the first failing validation's message."""
    env = celpy.Environment()
    extra = {"authentication.kubernetes.io/node-name": [token_node]} if token_node is not None else {}
    request = {"operation": "UPDATE", "userInfo": {"username": user, "groups": ["system:serviceaccounts"],
                                                   "extra": extra}}
    act = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
           "request": celpy.json_to_cel(request)}

    def run(expr: str, activation: dict):
        return env.program(env.compile(expr)).evaluate(activation)

    spec = policy()
    for cond in spec["matchConditions"]:
        if not bool(run(cond["expression"], act)):
            return None
    variables: dict = {}
    for v in spec["variables"]:
        variables[v["name"]] = run(v["expression"], {**act, "variables": celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): val for k, val in variables.items()})})
    act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): val for k, val in variables.items()})
    for val in spec["validations"]:
        result = run(val["expression"], act)
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            return " ".join(val["message"].split())
    return None


def node(name: str = "node-1", taints=None, **spec) -> dict:
    n = {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": {"a": "1"}},
         "spec": {"podCIDR": "198.18.0.0/24", "podCIDRs": ["198.18.0.0/24"], "providerID": f"fake://{name}",
                  **spec}}
    if taints is not None:
        n["spec"]["taints"] = copy.deepcopy(taints)
    return n


def test_the_agent_may_remove_the_taint_from_its_own_node():
    assert evaluate(node(taints=[NOT_READY, TAINT, GPU]), node(taints=[NOT_READY, GPU])) is None
    assert evaluate(node(taints=[TAINT]), node(taints=[])) is None
    assert evaluate(node(taints=[TAINT]), node()) is None  # the list gone with its last element


def test_not_from_another_node_nor_without_the_node_in_its_token():
    own = "the shaperd agent may change only its own node"
    assert evaluate(node("node-2", taints=[TAINT]), node("node-2", taints=[])).startswith(own)
    assert evaluate(node(taints=[TAINT]), node(taints=[]), token_node=None).startswith(own)  # gate off: closed
    assert evaluate(node(taints=[TAINT]), node(taints=[]), token_node="").startswith(own)


@pytest.mark.parametrize("old_taints,new_taints", [
    ([TAINT, GPU], []),  # another taint removed with it
    ([GPU], []),  # only another one removed
    ([TAINT], [GPU]),  # one added in its place
    ([TAINT], [TAINT, GPU]),  # one added, ours kept
    ([TAINT, GPU, NOT_READY], [NOT_READY, GPU]),  # reordered
    ([TAINT, GPU], [dict(GPU, value="absent")]),  # another one changed
    ([dict(TAINT, effect="NoExecute")], []),  # the same key with another effect
    ([TAINT], [TAINT]),  # not a removal at all (the agent sends none: it would be a no-op write)
])
def test_no_other_change_to_the_taints(old_taints, new_taints):
    assert evaluate(node(taints=old_taints), node(taints=new_taints)) == (
        "the shaperd agent may only remove the taint shaperd.io/agent-not-ready:NoSchedule from its node")


@pytest.mark.parametrize("change", [
    lambda n: n["metadata"]["labels"].update(role="gpu"),
    lambda n: n["metadata"].pop("labels"),
    lambda n: n["metadata"]["annotations"].update(b="2"),
    lambda n: n["metadata"].update(finalizers=["x.example/hold"]),
    lambda n: n["metadata"].update(ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]),
    lambda n: n["spec"].update(unschedulable=True),
    lambda n: n["spec"].update(podCIDR="198.19.0.0/24"),
    lambda n: n["spec"].update(podCIDRs=["2001:db8::/64"]),
    lambda n: n["spec"].update(providerID="fake://elsewhere"),
    lambda n: n["spec"].update(externalID="x"),
    lambda n: n["spec"].update(configSource={"configMap": {"name": "k", "namespace": "kube-system",
                                                           "kubeletConfigKey": "kubelet"}}),
])
def test_nothing_else_changes_with_the_removal(change):
    new = node(taints=[])
    change(new)
    msg = evaluate(node(taints=[TAINT]), new)
    assert msg is not None and msg.startswith("the shaperd agent may not change ")


def test_everyone_else_is_not_evaluated():
    assert evaluate(node(taints=[TAINT]), node(taints=[GPU], unschedulable=True), user="system:node:node-1") is None
    assert evaluate(node("node-2"), node("node-9"), user="system:serviceaccount:other:shaperd") is None
