"""Loading a tenants file: a path or text (a plain file, a ConfigMap manifest, or several documents) to a Config.

Reads only the file it is given (capped in size, config/limits.py); validation is config/validate.py.
"""

from __future__ import annotations

from pathlib import Path

from shaperd.core.config import limits as config_limits
from shaperd.core.config.manifests import load_set, parse_documents
from shaperd.core.config.model import CONFIGMAP_KEY, Config
from shaperd.core.config.validate import from_dict
from shaperd.core.config.yamldoc import _yaml
from shaperd.core.errors import ConfigError, ConfigProblem


def load_file(path: str | Path) -> Config:
    """Read and validate a tenants file (or a ConfigMap manifest holding one)."""
    p = Path(path)
    try:
        text = config_limits.read_capped(p).decode("utf-8")
    except OSError as e:
        raise ConfigError(str(p), [ConfigProblem("", f"cannot read file: {e.strerror or e}")]) from e
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), [ConfigProblem("", f"not UTF-8 text: {e}")]) from e
    return load_text(text, str(p))


def load_text(text: str, source: str = "<memory>") -> Config:
    # A file of several documents is a set of Kubernetes objects (config/manifests.py).
    docs = parse_documents(text, source)
    if len(docs) > 1:
        return load_set(docs, source)
    doc = docs[0] if docs else None
    prefix = ""
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        data = doc.get("data")
        if not isinstance(data, dict) or CONFIGMAP_KEY not in data:
            raise ConfigError(source, [ConfigProblem("data", f"a ConfigMap needs the key {CONFIGMAP_KEY!r}")])
        inner = data[CONFIGMAP_KEY]
        if not isinstance(inner, str):
            raise ConfigError(source, [ConfigProblem(f"data.{CONFIGMAP_KEY}", "expected the file as a string")])
        prefix = f"data.{CONFIGMAP_KEY}:"
        doc = _yaml(inner, f"{source} ({prefix[:-1]})")
    return from_dict(doc, source, prefix)
