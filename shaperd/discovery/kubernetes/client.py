"""Client credentials for the API server: one ``ClientConfig`` per watcher.

Owns the choice of where credentials come from (explicit kubeconfig,
in-cluster service account, $KUBECONFIG, ~/.kube/config); the parsing is
``kubeconfig.py``'s, which turns every way that fails into a
``KubernetesConfigError`` naming the file and the field.

Must not: make a request (the watcher does that).
"""

from __future__ import annotations

import os

from shaperd.discovery.kubernetes.errors import KubernetesConfigError
from shaperd.discovery.kubernetes.kubeconfig import ClientConfig, load_in_cluster, load_kubeconfig


def load_client_config(kubeconfig: str | None = None) -> ClientConfig:
    """A ``ClientConfig`` for this process.

    An explicit ``kubeconfig`` wins (an operator asked for it); otherwise the
    in-cluster service account when running in a pod (KUBERNETES_SERVICE_HOST
    set); otherwise $KUBECONFIG (a list, like kubectl's), then ~/.kube/config.
    """
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return load_in_cluster()
    source = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    paths = [os.path.expanduser(p) for p in source.split(os.pathsep) if p]
    if not any(os.path.isfile(p) for p in paths):
        raise KubernetesConfigError(
            "load", f"kubeconfig {source}",
            "no such file, and not in a pod (KUBERNETES_SERVICE_HOST unset); "
            "pass --kubeconfig or set KUBECONFIG",
        )
    return load_kubeconfig(paths)
