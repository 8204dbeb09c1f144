"""CiliumNetworkPolicy bandwidth read from the cluster (``shaperd run --cilium-policies``).

The source design keeps the tenants ConfigMap and the CiliumNetworkPolicy as
two objects; with ``--config-map`` only the first is read. This view lists
and watches ``cilium.io/v2`` CiliumNetworkPolicies (all namespaces) and
CiliumClusterwideNetworkPolicies through the generic watch (resources.py)
and adds each one's bandwidth scopes to the tenants it selects, exactly as a
policy in the same file would (shaperd/core/config/cilium.py, shaperd/core/config/manifests.py). A
policy that does not read, or that scopes a prefix the tenant already has, is
skipped with one log line per version; the other policies and tenants are
unaffected. Without Cilium's CRDs (404) this is said once.

Must not: write to the API or interpret Cilium's own (non-bandwidth) rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shaperd.core import log
from shaperd.core.config.cilium import is_policy, read_policy
from shaperd.core.config import Config
from shaperd.core.errors import ConfigError
from shaperd.core.config.manifests import apply_policies
from shaperd.discovery.kubernetes.resources import ResourceWatcher

_log = log.get("shaperd.k8s")
CNPS = "/apis/cilium.io/v2/ciliumnetworkpolicies"
CCNPS = "/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies"


class CiliumPolicyView:
    def __init__(self, on_change: Callable[[], None], **watch_kw: Any):
        self.watchers = [ResourceWatcher(CNPS, on_change, what="cilium network policies", **watch_kw),
                         ResourceWatcher(CCNPS, on_change, what="cilium clusterwide network policies", **watch_kw)]
        self._said: set[tuple[str, str]] = set()

    def start(self) -> None:
        for w in self.watchers:
            w.start()

    def stop(self) -> None:
        for w in self.watchers:
            w.stop()

    @property
    def has_synced(self) -> bool:
        return all(w.has_synced for w in self.watchers)

    def effective(self, cfg: Config) -> Config:
        """``cfg`` plus the bandwidth scopes of every readable policy that selects a tenant."""
        for w in self.watchers:
            for key, obj in sorted(w.snapshot().items()):
                obj = dict(obj, kind=obj.get("kind") or ("CiliumNetworkPolicy" if w.path == CNPS
                                                          else "CiliumClusterwideNetworkPolicy"),
                           apiVersion=obj.get("apiVersion") or "cilium.io/v2")
                if not is_policy(obj) or "bandwidth" not in repr(obj.get("spec")):
                    continue  # an ordinary Cilium policy: not shaperd's business
                rv = str((obj.get("metadata") or {}).get("resourceVersion"))
                pol, problems = read_policy(obj, f"{obj['kind']} {key}")
                if pol is None:
                    self._once(key, rv, "cilium policy skipped", [str(p) for p in problems])
                    continue
                try:
                    cfg = apply_policies(cfg, [pol], pol.ref)
                except ConfigError as e:
                    self._once(key, rv, "cilium policy skipped", [str(p) for p in e.problems])
        return cfg

    def _once(self, key: str, rv: str, event: str, problems: list[str]) -> None:
        if (key, rv) not in self._said:
            self._said.add((key, rv))
            _log.warning(event, policy=key, problems=problems, detail="the other policies and tenants are unaffected")
