"""Kubernetes discovery: the pods on this node, followed through the API server.

One module per API concern (kopf's layout):

- ``errors``: the error hierarchy and ``map_api_error``, the one status-code mapping;
- ``client``: where credentials come from (``load_client_config``);
- ``kubeconfig``: ``ClientConfig`` from kubeconfig files or the service account;
- ``auth``: the credential of the moment (token, token file, exec plugin);
- ``transport``: GETs over urllib3 (TLS, timeouts, status -> ``ApiStatus``);
- ``watchstream``: the line protocol of a watch response;
- ``api``: the list and watch requests, mapped to our errors;
- ``pods``: ``PodInfo`` and its parser from wire JSON;
- ``backoff``: the retry schedule;
- ``watcher``: ``PodWatcher``, the list-then-watch loop and its pod cache.

The names below are the package's public surface; import them from here.
"""

from shaperd.discovery.kubernetes.backoff import Backoff
from shaperd.discovery.kubernetes.client import load_client_config
from shaperd.discovery.kubernetes.errors import (
    KubernetesConfigError,
    KubernetesError,
    PodParseError,
    ResourceExpired,
    TransientKubernetesError,
    WatchStreamCorrupt,
    map_api_error,
)
from shaperd.discovery.kubernetes.pods import FrozenMap, PodInfo, describe_pod
from shaperd.discovery.kubernetes.watcher import PodWatcher

__all__ = [
    "Backoff",
    "FrozenMap",
    "KubernetesConfigError",
    "KubernetesError",
    "PodInfo",
    "PodParseError",
    "PodWatcher",
    "ResourceExpired",
    "TransientKubernetesError",
    "WatchStreamCorrupt",
    "describe_pod",
    "load_client_config",
    "map_api_error",
]
