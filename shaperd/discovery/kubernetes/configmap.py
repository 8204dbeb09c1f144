"""The tenants file from a ConfigMap read through the API (``shaperd run --config-map NS/NAME``).

A DaemonSet in its own namespace cannot mount a ConfigMap from another
(``kubeflow``), so the daemon watches that one object: a list and watch of
``/api/v1/namespaces/NS/configmaps`` with ``fieldSelector=metadata.name=NAME``
(what RBAC's ``resourceNames`` needs to authorise list/watch of one object).
``load()`` parses its ``data["traffic-shaping.yaml"]`` like a file; a missing
object or key is a ``ConfigError``, so the daemon keeps the last good config.

Must not: decide when to reload (the daemon's), or read any other ConfigMap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shaperd.core.config import CONFIGMAP_KEY, Config, load_text
from shaperd.core.errors import ConfigError, ConfigProblem
from shaperd.discovery.kubernetes.resources import ResourceWatcher


def parse_ref(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
    return ns, name


class ConfigMapSource:
    """One ConfigMap's tenants file, followed live."""

    def __init__(self, ref: str, kubeconfig: str | None = None, client_configuration: Any = None, **watch_kw):
        self.namespace, self.name = parse_ref(ref)
        self.ref = f"{self.namespace}/{self.name}"
        self.describe = f"configmap {self.ref}"
        self._kw = dict(watch_kw, kubeconfig=kubeconfig, client_configuration=client_configuration)
        self.watcher: ResourceWatcher | None = None

    def start(self, on_change: Callable[[], None]) -> None:
        self.watcher = ResourceWatcher(f"/api/v1/namespaces/{self.namespace}/configmaps", on_change,
                                       what=self.describe, field_selector=f"metadata.name={self.name}", **self._kw)
        self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    @property
    def has_synced(self) -> bool:
        return self.watcher is not None and self.watcher.has_synced

    def load(self) -> Config:
        """The tenants file in the ConfigMap; ConfigError when it is missing or bad (the daemon keeps the last good)."""
        if self.watcher is None or not self.watcher.has_synced:
            raise ConfigError(self.describe, [ConfigProblem("", "not listed from the API server yet")])
        obj = self.watcher.snapshot().get(self.ref)
        if obj is None:
            why = "not found (404: the API group is missing?)" if self.watcher.absent else "not found (deleted?)"
            raise ConfigError(self.describe, [ConfigProblem("", why)])
        data = obj.get("data")
        text = data.get(CONFIGMAP_KEY) if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise ConfigError(self.describe, [ConfigProblem("data", f"a ConfigMap needs the key {CONFIGMAP_KEY!r}")])
        return load_text(text, f"{self.describe} data.{CONFIGMAP_KEY}")
