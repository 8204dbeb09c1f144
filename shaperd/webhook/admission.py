"""AdmissionReview v1 of a Pod -> the response that adds its tenant's NCCL environment. Pure: no I/O.

The pod's tenant comes from the same matching the agent uses
(``tenancy.pod_tenants``: labels, else namespace; two tenants = neither). Its
environment is the node-independent part (``nccl.tenant_env(node=False)``:
SL, TC, passthrough): NCCL_IB_HCA, the GID index and the socket interface
name this node's devices, so they come from the per-node env file instead.

The JSONPatch adds each variable to every container and init container that
does not set it already (by name, in ``env``). A container with ``envFrom`` is
left alone by default: the keys of the ConfigMaps and Secrets it names are not
in the review, and an ``env`` entry would win over them, so adding ours could
override the pod's value (``env_from="add"`` adds them anyway).

Anything malformed, and anything not a Pod CREATE, is allowed with no patch
(failurePolicy Ignore semantics), with the reason for the log line.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from shaperd.rdma import nccl
from shaperd.rdma import plan as rdma_plan
from shaperd.core.config import Config
from shaperd.core.inventory import Inventory, Pod
from shaperd.core.tenancy import Tenancy, pod_tenants

API_VERSION = "admission.k8s.io/v1"
ENV_FROM_CHOICES = ("skip", "add")


class Malformed(Exception):
    pass


@dataclass(frozen=True)
class Verdict:
    """What to send back, and what the log line says about it."""

    response: dict
    uid: str = ""
    pod: str = ""
    tenant: str | None = None
    added: dict[str, tuple[str, ...]] = field(default_factory=dict)  # container -> variables added
    kept: dict[str, tuple[str, ...]] = field(default_factory=dict)  # container -> variables it sets itself
    skipped: tuple[str, ...] = ()  # containers left alone (envFrom)
    why: str = ""  # why nothing was patched, when nothing was
    malformed: bool = False

    @property
    def patched(self) -> bool:
        return "patch" in self.response.get("response", {})


def response(uid: str, patch: list | None = None) -> dict:
    r: dict = {"uid": uid, "allowed": True}
    if patch:
        r["patchType"] = "JSONPatch"
        r["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": r}


def allow(body: bytes, why: str, malformed: bool = True) -> Verdict:
    """Allowed, no patch: the review's uid if it can be read, else empty (the API server then ignores it)."""
    uid = ""
    try:
        req = json.loads(body).get("request")
        uid = req["uid"] if isinstance(req, dict) and isinstance(req.get("uid"), str) else ""
    except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        pass
    return Verdict(response(uid), uid=uid, why=why, malformed=malformed)


class Mutator:
    """One tenants file's answers: built once per version of the file, then used for every review."""

    def __init__(self, cfg: Config, env_from: str = "skip"):
        if env_from not in ENV_FROM_CHOICES:
            raise ValueError(f"env_from: expected one of {', '.join(ENV_FROM_CHOICES)}, got {env_from!r}")
        self.cfg = cfg
        self.env_from = env_from
        p = rdma_plan.plan(cfg, Inventory(), Tenancy())  # no node: nothing node-specific can come out
        self.envs = {t.tenant: nccl.tenant_env(t, node=False).values for t in p.tenants}

    def review(self, body: bytes) -> Verdict:
        try:
            return self._review(body)
        except Malformed as e:
            return allow(body, str(e))
        except RecursionError:
            return allow(body, "the review is nested too deeply to read")

    def _review(self, body: bytes) -> Verdict:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise Malformed(f"the body is not JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("apiVersion") != API_VERSION or doc.get("kind") != "AdmissionReview":
            raise Malformed(f"not an {API_VERSION} AdmissionReview")
        req = _dict(doc.get("request"), "request")
        uid = req.get("uid")
        if not isinstance(uid, str) or not uid:
            raise Malformed("request.uid: missing")
        kind = _dict(req.get("kind"), "request.kind")
        if (kind.get("group"), kind.get("kind")) != ("", "Pod") or req.get("subResource"):
            return Verdict(response(uid), uid=uid, why="not a Pod")
        if req.get("operation") != "CREATE":
            return Verdict(response(uid), uid=uid, why=f"operation {req.get('operation')}, not CREATE")
        pod = _dict(req.get("object"), "request.object")
        meta = _dict(pod.get("metadata") or {}, "request.object.metadata")
        spec = _dict(pod.get("spec"), "request.object.spec")
        namespace = req.get("namespace") or meta.get("namespace") or ""
        name = meta.get("name") or (str(meta.get("generateName") or "") + "*")
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise Malformed("request.object.metadata.labels: expected a mapping of strings")
        if not isinstance(namespace, str):
            raise Malformed("request.namespace: expected a string")
        ref = f"{namespace}/{name}"
        hits, warnings = pod_tenants(self.cfg, (Pod(uid=uid, namespace=namespace, name=str(name),
                                                    labels=tuple(sorted(labels.items()))),))
        tenant = hits.get(uid)
        if tenant is None:
            return Verdict(response(uid), uid=uid, pod=ref, why="; ".join(warnings) or "the pod is of no tenant")
        return self._patch(uid, ref, tenant, spec)

    def _patch(self, uid: str, ref: str, tenant: str, spec: dict) -> Verdict:
        values = self.envs[tenant]
        patch: list[dict] = []
        added: dict[str, tuple[str, ...]] = {}
        kept: dict[str, tuple[str, ...]] = {}
        skipped: list[str] = []
        for fld in ("initContainers", "containers"):
            containers = spec.get(fld)
            if containers is None:
                continue
            if not isinstance(containers, list):
                raise Malformed(f"spec.{fld}: expected a list")
            for i, c in enumerate(containers):
                where = f"spec.{fld}[{i}]"
                c = _dict(c, where)
                cname = str(c.get("name") or where)
                if c.get("envFrom") and self.env_from == "skip":
                    skipped.append(cname)
                    continue
                env = c.get("env")
                if env is not None and not isinstance(env, list):
                    raise Malformed(f"{where}.env: expected a list")
                have = {_dict(e, f"{where}.env[{j}]").get("name") for j, e in enumerate(env or ())}
                add = [{"name": k, "value": v} for k, v in values.items() if k not in have]
                if have & values.keys():
                    kept[cname] = tuple(k for k in values if k in have)
                if not add:
                    continue
                added[cname] = tuple(e["name"] for e in add)
                path = f"/spec/{fld}/{i}/env"
                if env is None:  # absent (or null): the whole list in one op
                    patch.append({"op": "add", "path": path, "value": add})
                else:
                    patch.extend({"op": "add", "path": path + "/-", "value": e} for e in add)
        why = "" if patch else "every container already sets these variables, or uses envFrom"
        return Verdict(response(uid, patch), uid=uid, pod=ref, tenant=tenant, added=added, kept=kept,
                       skipped=tuple(skipped), why=why)


def _dict(v, where: str) -> dict:
    if not isinstance(v, dict):
        raise Malformed(f"{where}: expected an object")
    return v
