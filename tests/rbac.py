"""The agent's RBAC as Kubernetes would evaluate it, from the YAML shipped in daemonset/.

Reads every Role, ClusterRole, RoleBinding and ClusterRoleBinding in
daemonset/base/ and daemonset/components/*/ (the base and every optional
component an overlay may add), keeps the bindings whose subjects include the
DaemonSet's service account, and turns their rules into grants scoped like
the API server's RBAC authorizer scopes them: a ClusterRoleBinding in every
namespace and cluster-wide, a RoleBinding only in its namespace. ``allows``
answers for one request as tests/k8s_fake.py recorded it (``Access``);
``unused`` lists the grants no recorded request needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from .k8s_fake import Access

ROOT = Path(__file__).resolve().parents[1]
DAEMONSET = ROOT / "daemonset"


@dataclass(frozen=True)
class Grant:
    """One verb on one resource of one API group, in ``namespace`` ("*": every namespace and cluster-wide)."""

    role: str  # "ClusterRole/NAME" or "Role/NS/NAME", for messages
    namespace: str
    group: str
    resource: str
    verb: str
    names: tuple[str, ...] = ()  # resourceNames; () is every name

    def allows(self, a: Access) -> bool:
        if a.path:  # non-resource URLs need nonResourceURLs rules, which the agent's roles have none of
            return False
        if self.namespace != "*" and a.namespace != self.namespace:
            return False
        return (self.group in (a.group, "*") and self.resource in (a.resource, "*") and self.verb in (a.verb, "*")
                and (not self.names or a.name in self.names))


def _docs(paths) -> list[dict]:
    out = []
    for p in paths:
        out.extend(d for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict))
    return out


def shipped_files() -> list[Path]:
    return sorted(DAEMONSET.glob("base/*.yaml")) + sorted(DAEMONSET.glob("components/*/*.yaml"))


def service_account() -> tuple[str, str]:
    """(namespace, name) of the agent's service account: the DaemonSet's serviceAccountName."""
    (ds,) = [d for d in _docs(shipped_files()) if d.get("kind") == "DaemonSet"]
    return ds["metadata"]["namespace"], ds["spec"]["template"]["spec"]["serviceAccountName"]


def agent_grants() -> list[Grant]:
    docs = _docs(shipped_files())
    ns, sa = service_account()
    me = {"kind": "ServiceAccount", "name": sa, "namespace": ns}
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in docs if d.get("kind") in ("Role", "ClusterRole")}
    grants: list[Grant] = []
    for b in docs:
        if b.get("kind") not in ("RoleBinding", "ClusterRoleBinding") or me not in b.get("subjects", []):
            continue
        scope = "*" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        key = (ref["kind"], "" if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"], ref["name"])
        role = roles[key]  # a binding to a role that is not shipped is a broken manifest: KeyError says which
        label = "/".join(x for x in key if x)
        for rule in role.get("rules", []):
            assert not rule.get("nonResourceURLs"), f"{label}: nonResourceURLs in the agent's role"
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule.get("verbs", []):
                        grants.append(Grant(label, scope, group, resource, verb, tuple(rule.get("resourceNames", ()))))
    return grants


def denied(grants: list[Grant], accesses: list[Access]) -> list[Access]:
    return [a for a in accesses if not any(g.allows(a) for g in grants)]


def unused(grants: list[Grant], accesses: list[Access]) -> list[Grant]:
    return [g for g in grants if not any(g.allows(a) for a in accesses)]
