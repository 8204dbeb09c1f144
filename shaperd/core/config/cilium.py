"""CiliumNetworkPolicy bandwidth as tenant destination scopes.

Owns the reading of one policy object (``cilium.io/v2`` CiliumNetworkPolicy or
CiliumClusterwideNetworkPolicy) into (endpoint labels, destinations): the
source design caps a tenant's egress towards the pod network with
``spec.endpointSelector.matchLabels``, ``spec.egress[].toCIDR`` and
``bandwidth``. Upstream Cilium has no such field (its bandwidth manager reads
the ``kubernetes.io/egress-bandwidth`` pod annotation); shaperd reads the
design's: ``bandwidth`` in an egress rule, or in ``spec`` for every egress
rule, as a rate ("40Gbps") or as ``{egress: 40Gbps}``. Destinations come from
``toCIDR`` and ``toCIDRSet[].cidr`` (``except`` is not supported and is
refused). Label keys may carry Cilium's ``k8s:`` source prefix.

Which tenant a policy applies to is decided by shaperd/core/config/manifests.py. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Mapping

from shaperd.core.config.model import Destination, IPNetwork
from shaperd.core.errors import ConfigProblem
from shaperd.core.units import UnitError, parse_rate

KINDS = frozenset({"CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy"})
API_GROUP = "cilium.io/"


@dataclass(frozen=True)
class BandwidthPolicy:
    """What shaperd takes from one policy: the endpoint labels it selects and the capped destinations."""

    ref: str  # "CiliumNetworkPolicy kubeflow/tenant-a-pod-network"
    match_labels: Mapping[str, str]
    destinations: tuple[Destination, ...]
    # Why parts of the policy were not used (no bandwidth on a rule, ...): notes, not errors.
    notes: tuple[str, ...] = ()


def is_policy(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") in KINDS and str(doc.get("apiVersion", "")).startswith(API_GROUP)


def _rate(obj: Any) -> Any:
    return obj.get("egress") if isinstance(obj, dict) else obj


def read_policy(doc: Mapping[str, Any], path: str) -> tuple[BandwidthPolicy | None, list[ConfigProblem]]:
    """One policy document -> its bandwidth scopes; problems carry field paths under ``path``."""
    problems: list[ConfigProblem] = []

    def bad(where: str, msg: str) -> None:
        problems.append(ConfigProblem(f"{path}.{where}", msg))

    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    ns = meta.get("namespace")
    ref = f"{doc.get('kind')} {ns + '/' if ns else ''}{meta.get('name', '?')}"
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        bad("spec", "expected a mapping")
        return None, problems
    sel = spec.get("endpointSelector")
    if not isinstance(sel, dict):
        bad("spec.endpointSelector", "required; expected a mapping with matchLabels")
        return None, problems
    if sel.get("matchExpressions"):
        bad("spec.endpointSelector.matchExpressions", "not supported for bandwidth; use matchLabels")
    labels_raw = sel.get("matchLabels")
    if not isinstance(labels_raw, dict) or not labels_raw or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels_raw.items()
    ):
        bad("spec.endpointSelector.matchLabels", "expected a non-empty mapping of label name to string value")
        return None, problems
    labels = {k.removeprefix("k8s:"): v for k, v in labels_raw.items()}
    default_rate = _rate(spec.get("bandwidth"))
    rules = spec.get("egress") or []
    if not isinstance(rules, list):
        bad("spec.egress", "expected a list of egress rules")
        return None, problems
    dests: list[Destination] = []
    notes: list[str] = []
    for i, rule in enumerate(rules):
        where = f"spec.egress[{i}]"
        if not isinstance(rule, dict):
            bad(where, "expected a mapping")
            continue
        raw_rate = _rate(rule.get("bandwidth")) if "bandwidth" in rule else default_rate
        cidrs: list[IPNetwork] = []
        for j, c in enumerate(rule.get("toCIDR") or []):
            cidrs.extend(_net(c, f"{where}.toCIDR[{j}]", bad))
        for j, entry in enumerate(rule.get("toCIDRSet") or []):
            if not isinstance(entry, dict) or "cidr" not in entry:
                bad(f"{where}.toCIDRSet[{j}]", "expected {cidr: PREFIX}")
                continue
            if entry.get("except"):
                bad(f"{where}.toCIDRSet[{j}].except", "not supported for bandwidth scopes; list the prefixes instead")
            cidrs.extend(_net(entry["cidr"], f"{where}.toCIDRSet[{j}].cidr", bad))
        if raw_rate is None:
            notes.append(f"{ref}: {where} has no bandwidth; not a shaperd scope")
            continue
        if not cidrs:
            notes.append(f"{ref}: {where} has no toCIDR/toCIDRSet; its bandwidth is not used")
            continue
        try:
            limit = parse_rate(raw_rate)
        except UnitError as e:
            bad(f"{where}.bandwidth", str(e))
            continue
        dests.append(Destination(cidrs=tuple(cidrs), limit_bps=limit, origin=ref))
    if problems:
        return None, problems
    return BandwidthPolicy(ref=ref, match_labels=labels, destinations=tuple(dests), notes=tuple(notes)), []


def _net(text: Any, where: str, bad) -> list[IPNetwork]:
    try:
        return [ipaddress.ip_network(str(text), strict=True)]
    except ValueError as e:
        bad(where, f"expected an IPv4 or IPv6 prefix such as 10.244.0.0/16: {e}")
        return []


def selects(policy: BandwidthPolicy, pod_labels: Mapping[str, str]) -> bool:
    """Whether the policy's endpointSelector selects every pod carrying ``pod_labels`` (a tenant's podLabels)."""
    return all(pod_labels.get(k) == v for k, v in policy.match_labels.items())
