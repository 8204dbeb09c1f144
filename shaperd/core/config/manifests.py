"""A file or ConfigMap of several YAML documents, read as a set of Kubernetes objects.

Owns which document supplies what: the ConfigMap with the key
``traffic-shaping.yaml`` (or a plain tenants document) supplies the tenants,
exactly one per set; CiliumNetworkPolicy objects with ``bandwidth`` become the
destination scopes of the tenants whose pods they select (shaperd/core/config/cilium.py);
every other document is listed as ignored, one line each, and is not an error.
A single document keeps the old path (config.load_text).

Pure: parses the text it is given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from shaperd.core.config import cilium
from shaperd.core.config.model import CONFIGMAP_KEY, Config
from shaperd.core.config.validate import from_dict
from shaperd.core.config.yamldoc import _yaml, load_all
from shaperd.core.errors import ConfigError, ConfigProblem


def _all_documents(text: str, source: str) -> list[Any]:
    return load_all(text, source)


def _ref(doc: dict) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    ns = meta.get("namespace")
    return f"{doc.get('kind')} {ns + '/' if ns else ''}{meta.get('name', '?')}"


def load_documents(text: str, source: str) -> Config | None:
    """The set's Config, or None when the text is a single document (the caller's path)."""
    docs = _all_documents(text, source)
    if len(docs) <= 1:
        return None
    return load_set(docs, source)


def parse_documents(text: str, source: str) -> list[Any]:
    """The text's non-empty documents, parsed once (load_text used to parse a single document twice)."""
    return _all_documents(text, source)


def load_set(docs: list[Any], source: str) -> Config:
    """Several parsed documents -> one Config (tenants, plus Cilium scopes), or a ConfigError."""
    problems: list[ConfigProblem] = []
    tenants_docs: list[tuple[str, Any, str]] = []  # (where, tenants document, prefix for field paths)
    policies: list[cilium.BandwidthPolicy] = []
    ignored: list[str] = []
    for n, doc in enumerate(docs, 1):
        where = f"document {n}"
        if not isinstance(doc, dict):
            ignored.append(f"{where}: a {type(doc).__name__}, not a Kubernetes object: ignored")
            continue
        kind = doc.get("kind")
        if kind is None and "tenants" in doc:
            tenants_docs.append((f"{where} (tenants file)", doc, f"{where}:"))
        elif kind == "ConfigMap" and isinstance(doc.get("data"), dict) and CONFIGMAP_KEY in doc["data"]:
            inner = doc["data"][CONFIGMAP_KEY]
            prefix = f"{where} ({_ref(doc)}) data.{CONFIGMAP_KEY}:"
            if not isinstance(inner, str):
                problems.append(ConfigProblem(prefix[:-1], "expected the file as a string"))
                continue
            tenants_docs.append((f"{where} ({_ref(doc)})", _yaml(inner, f"{source} ({prefix[:-1]})"), prefix))
        elif isinstance(kind, str) and cilium.is_policy(doc):
            pol, probs = cilium.read_policy(doc, f"{where} ({_ref(doc)})")
            problems.extend(probs)
            if pol is not None:
                policies.append(pol)
        else:
            why = f"no key {CONFIGMAP_KEY}" if kind == "ConfigMap" else "a kind shaperd does not read"
            ignored.append(f"{where}: {_ref(doc) if kind else 'untyped document'}: ignored ({why})")
    if len(tenants_docs) > 1:
        problems.append(ConfigProblem("", "two tenants files in one set: " + ", ".join(w for w, _, _ in tenants_docs)
                                      + "; expected exactly one"))
    elif not tenants_docs:
        problems.append(ConfigProblem("", f"no tenants file in the set: expected a ConfigMap with the key "
                                          f"{CONFIGMAP_KEY!r} or a document with 'tenants'"))
    if problems:
        raise ConfigError(source, problems)
    _, doc, prefix = tenants_docs[0]
    cfg = from_dict(doc, source, prefix)
    out = apply_policies(cfg, policies, source)
    return dataclasses.replace(out, ignored=tuple(ignored) + out.ignored)


def apply_policies(cfg: Config, policies: list[cilium.BandwidthPolicy], source: str) -> Config:
    """Add each policy's destinations to every tenant whose podLabels it selects; notes for the rest."""
    tenants = list(cfg.tenants)
    notes: list[str] = []
    problems: list[ConfigProblem] = []
    for pol in policies:
        notes.extend(pol.notes)
        hit = [i for i, t in enumerate(tenants) if cilium.selects(pol, t.effective_pod_labels())]
        if not hit:
            labels = ",".join(f"{k}={v}" for k, v in pol.match_labels.items())
            notes.append(f"{pol.ref}: endpointSelector {labels} selects no tenant's podLabels: ignored")
            continue
        for i in hit:
            t = tenants[i]
            have = {net: d.origin for d in t.destinations for net in d.cidrs}
            for d in pol.destinations:
                clash = [str(net) for net in d.cidrs if net in have]
                if clash:
                    problems.append(ConfigProblem(f"tenants[{i}].destinations", f"{', '.join(clash)} of {pol.ref} "
                                                  f"is already scoped for tenant {t.name!r} by {have[d.cidrs[0]]}"))
                    continue
                have.update({net: d.origin for net in d.cidrs})
                t = dataclasses.replace(t, destinations=t.destinations + (d,))
            tenants[i] = t
    if problems:
        raise ConfigError(source, problems)
    return dataclasses.replace(cfg, tenants=tuple(tenants), ignored=tuple(notes))
