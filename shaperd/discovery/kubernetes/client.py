"""Client credentials for the API server: one ``kubernetes.client.Configuration`` per watcher.

Owns where credentials come from (explicit kubeconfig, in-cluster service
account, $KUBECONFIG, ~/.kube/config) and turns every way that fails into
a ``KubernetesConfigError`` naming the source.

Must not: touch the client library's global default configuration, or
make a request (the watcher does that).
"""

from __future__ import annotations

import os

from .errors import KubernetesConfigError


def load_client_config(kubeconfig: str | None = None):
    """A ``kubernetes.client.Configuration`` for this process; never touches the library's global default.

    An explicit ``kubeconfig`` wins (an operator asked for it); otherwise the
    in-cluster service account when running in a pod (KUBERNETES_SERVICE_HOST
    set); otherwise $KUBECONFIG, then ~/.kube/config.
    """
    from kubernetes import client, config

    cfg = client.Configuration()
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
        except (config.ConfigException, OSError) as e:
            raise KubernetesConfigError("load", "in-cluster service account config", str(e)) from e
        return cfg
    source = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    paths = [os.path.expanduser(p) for p in source.split(os.pathsep) if p]
    if not any(os.path.isfile(p) for p in paths):
        raise KubernetesConfigError(
            "load", f"kubeconfig {source}",
            "no such file, and not in a pod (KUBERNETES_SERVICE_HOST unset); "
            "pass --kubeconfig or set KUBECONFIG",
        )
    try:
        config.load_kube_config(config_file=os.pathsep.join(paths), client_configuration=cfg, persist_config=False)
    except Exception as e:  # ConfigException, yaml errors, bad base64 in certs ...
        raise KubernetesConfigError("load", f"kubeconfig {source}", f"{type(e).__name__}: {e}") from e
    return cfg
