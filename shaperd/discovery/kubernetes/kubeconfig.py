"""Client credentials from a kubeconfig (one or several files) or a pod's service account.

Owns turning those sources into one ``ClientConfig`` (server URL, TLS
material, a credential source from ``auth``), and every way that fails into
a ``KubernetesConfigError`` naming the file and the field.

Kubeconfig rules followed (client-go's clientcmd): with several files (the
``KUBECONFIG`` list), the first file to define a cluster/user/context name
wins, as does the first ``current-context``; missing files in the list are
skipped; relative paths (certificate-authority, client-certificate,
client-key, tokenFile, an exec command containing a ``/``) are relative to
the file that defined them; ``*-data`` fields are base64 of PEM. A token or
tokenFile wins over an exec plugin. Fields that would change who we are or
how we connect and that this client does not implement (auth-provider,
username/password, impersonation, proxy-url) are refused by name rather than
ignored.

In-cluster: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the
CA in ``ca.crt`` and the rotating ``token`` of the service account directory
(``auth.TokenFile``).

Must not: make a request, or run the exec plugin at load time (that happens
on the first request, as in client-go).
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from shaperd.discovery.kubernetes.auth import EXEC_API_VERSIONS, ExecConfig, ExecPlugin, StaticToken, TokenFile
from shaperd.discovery.kubernetes.errors import KubernetesConfigError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
EXEC_CLUSTER_EXTENSION = "client.authentication.k8s.io/exec"
_UNSUPPORTED_USER = ("auth-provider", "username", "password", "as", "as-uid", "as-groups", "as-user-extra")


@dataclass
class ClientConfig:
    """Everything a ``transport.ApiClient`` needs: where, how to trust it, who we are."""

    host: str
    ca_pem: bytes | None = None  # None: the system's roots
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    auth: Any = None  # StaticToken | TokenFile | ExecPlugin | None (anonymous)
    source: str = ""  # "kubeconfig /path (context x)", "in-cluster service account": for messages


def _err(source: str, where: str, cause: str) -> KubernetesConfigError:
    return KubernetesConfigError("load", source, f"{where}: {cause}")


def _b64(source: str, where: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise _err(source, where, f"expected a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise _err(source, where, f"not base64 ({e})") from e


def _read(source: str, where: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _err(source, where, f"{path}: {e.strerror or e}") from e


def _resolve(base_dir: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base_dir, os.path.expanduser(path))


def _named(entries: Any, kind: str, file: str, into: dict[str, tuple[dict, str]]) -> None:
    """Merge ``clusters``/``users``/``contexts`` of one file: the first definition of a name wins."""
    if entries is None:
        return
    if not isinstance(entries, list):
        raise _err(f"kubeconfig {file}", kind, f"expected a list, got {type(entries).__name__}")
    body_key = kind[:-1]  # clusters -> cluster
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise _err(f"kubeconfig {file}", f"{kind}[{i}].name", "missing or not a string")
        body = e.get(body_key) or {}
        if not isinstance(body, dict):
            raise _err(f"kubeconfig {file}", f"{kind}[name={e['name']}].{body_key}", "expected a mapping")
        into.setdefault(e["name"], (body, file))


def load_kubeconfig(paths: list[str], *, context: str | None = None, exec_timeout_s: float = 30.0,
                    now: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> ClientConfig:
    """The merged kubeconfig of ``paths`` (missing ones skipped), at ``context`` or its current-context."""
    clusters: dict[str, tuple[dict, str]] = {}
    users: dict[str, tuple[dict, str]] = {}
    contexts: dict[str, tuple[dict, str]] = {}
    current: tuple[str, str] | None = None
    present = [p for p in paths if os.path.isfile(p)]
    if not present:
        raise KubernetesConfigError("load", f"kubeconfig {os.pathsep.join(paths)}", "no such file")
    for path in present:
        src = f"kubeconfig {path}"
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except OSError as e:
            raise KubernetesConfigError("load", src, e.strerror or str(e)) from e
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise KubernetesConfigError("load", src, f"not YAML: {e}") from e
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise KubernetesConfigError("load", src, f"expected a mapping, got {type(doc).__name__}")
        _named(doc.get("clusters"), "clusters", path, clusters)
        _named(doc.get("users"), "users", path, users)
        _named(doc.get("contexts"), "contexts", path, contexts)
        cc = doc.get("current-context")
        if current is None and isinstance(cc, str) and cc:
            current = (cc, path)
    where = f"kubeconfig {os.pathsep.join(present)}"
    if context is None:
        if current is None:
            raise _err(where, "current-context", "not set (and no context asked for)")
        context, where = current[0], f"kubeconfig {current[1]}"
    if context not in contexts:
        raise _err(where, "current-context", f"no context named {context!r}")
    ctx, ctx_file = contexts[context]
    csrc = f"kubeconfig {ctx_file}"
    cluster_name = ctx.get("cluster")
    if not isinstance(cluster_name, str) or cluster_name not in clusters:
        raise _err(csrc, f"contexts[name={context}].context.cluster", f"no cluster named {cluster_name!r}")
    cluster, cl_file = clusters[cluster_name]
    user_name = ctx.get("user")
    user, u_file = ({}, ctx_file)
    if user_name:
        if not isinstance(user_name, str) or user_name not in users:
            raise _err(csrc, f"contexts[name={context}].context.user", f"no user named {user_name!r}")
        user, u_file = users[user_name]
    cfg = _cluster(cluster, cluster_name, cl_file)
    _user(cfg, user, user_name or "", u_file, cluster, cluster_name, exec_timeout_s, now, clock)
    cfg.source = f"kubeconfig {ctx_file} (context {context})"
    return cfg


def _cluster(c: dict, name: str, file: str) -> ClientConfig:
    src, at = f"kubeconfig {file}", f"clusters[name={name}].cluster"
    server = c.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise _err(src, f"{at}.server", f"expected an http(s) URL, got {server!r}")
    if c.get("proxy-url"):
        raise _err(src, f"{at}.proxy-url", "not supported by shaperd's client (connect directly)")
    cfg = ClientConfig(host=server.rstrip("/"))
    if c.get("certificate-authority-data"):
        cfg.ca_pem = _b64(src, f"{at}.certificate-authority-data", c["certificate-authority-data"])
    elif c.get("certificate-authority"):
        path = _resolve(os.path.dirname(file), str(c["certificate-authority"]))
        cfg.ca_pem = _read(src, f"{at}.certificate-authority", path)
    skip = c.get("insecure-skip-tls-verify", False)
    if not isinstance(skip, bool):
        raise _err(src, f"{at}.insecure-skip-tls-verify", f"expected true or false, got {skip!r}")
    cfg.insecure_skip_tls_verify = skip
    if c.get("tls-server-name"):
        cfg.tls_server_name = str(c["tls-server-name"])
    return cfg


def _exec_cluster_info(cluster: dict, cfg: ClientConfig) -> dict:
    info: dict[str, Any] = {"server": cfg.host}
    if cfg.tls_server_name:
        info["tls-server-name"] = cfg.tls_server_name
    if cfg.insecure_skip_tls_verify:
        info["insecure-skip-tls-verify"] = True
    if cfg.ca_pem:
        info["certificate-authority-data"] = base64.b64encode(cfg.ca_pem).decode()
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == EXEC_CLUSTER_EXTENSION:
            info["config"] = ext.get("extension")
    return info


def _user(cfg: ClientConfig, u: dict, name: str, file: str, cluster: dict, cluster_name: str,
          exec_timeout_s: float, now, clock) -> None:
    src, at = f"kubeconfig {file}", f"users[name={name}].user"
    base = os.path.dirname(file)
    for key in _UNSUPPORTED_USER:
        if u.get(key):
            raise _err(src, f"{at}.{key}", "not supported by shaperd's client (use a token, client certificate "
                                           "or an exec credential plugin)")
    if u.get("client-certificate-data"):
        cfg.client_cert_pem = _b64(src, f"{at}.client-certificate-data", u["client-certificate-data"])
    elif u.get("client-certificate"):
        cfg.client_cert_pem = _read(src, f"{at}.client-certificate", _resolve(base, str(u["client-certificate"])))
    if u.get("client-key-data"):
        cfg.client_key_pem = _b64(src, f"{at}.client-key-data", u["client-key-data"])
    elif u.get("client-key"):
        cfg.client_key_pem = _read(src, f"{at}.client-key", _resolve(base, str(u["client-key"])))
    if (cfg.client_cert_pem is None) != (cfg.client_key_pem is None):
        missing = "client-key(-data)" if cfg.client_key_pem is None else "client-certificate(-data)"
        raise _err(src, f"{at}.{missing}", "missing: a client certificate needs both the certificate and its key")
    if u.get("tokenFile"):
        cfg.auth = TokenFile(_resolve(base, str(u["tokenFile"])), f"{src} {at}.tokenFile", clock=clock)
    elif u.get("token"):
        if not isinstance(u["token"], str):
            raise _err(src, f"{at}.token", "expected a string")
        cfg.auth = StaticToken(u["token"])
    elif u.get("exec"):
        cfg.auth = ExecPlugin(_exec_config(u["exec"], src, f"{at}.exec", base, cluster, cfg),
                              timeout_s=exec_timeout_s, now=now)


def _exec_config(e: Any, src: str, at: str, base: str, cluster: dict, cfg: ClientConfig) -> ExecConfig:
    if not isinstance(e, dict):
        raise _err(src, at, "expected a mapping")
    command = e.get("command")
    if not isinstance(command, str) or not command:
        raise _err(src, f"{at}.command", "missing")
    if os.sep in command and not os.path.isabs(command):
        command = os.path.join(base, command)  # client-go: a relative path is relative to the kubeconfig
    api_version = e.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise _err(src, f"{at}.apiVersion", f"{api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}")
    args = e.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _err(src, f"{at}.args", "expected a list of strings")
    env: dict[str, str] = {}
    for i, kv in enumerate(e.get("env") or []):
        if not isinstance(kv, dict) or not isinstance(kv.get("name"), str) or not isinstance(kv.get("value"), str):
            raise _err(src, f"{at}.env[{i}]", "expected {name, value} strings")
        env[kv["name"]] = kv["value"]
    mode = e.get("interactiveMode", "IfAvailable")
    if mode not in ("Never", "IfAvailable", "Always"):
        raise _err(src, f"{at}.interactiveMode", f"{mode!r} is not Never, IfAvailable or Always")
    if mode == "Always":
        raise _err(src, f"{at}.interactiveMode", "Always needs a terminal; shaperd runs without one")
    provide = bool(e.get("provideClusterInfo", False))
    return ExecConfig(command=command, args=tuple(args), env=env, api_version=api_version,
                      install_hint=str(e.get("installHint") or ""), provide_cluster_info=provide,
                      cluster_info=_exec_cluster_info(cluster, cfg) if provide else None, source=f"{src} {at}")


def load_in_cluster(env: Mapping[str, str] = os.environ, sa_dir: str = SERVICE_ACCOUNT_DIR, *,
                    clock: Callable[[], float] = time.monotonic, refresh_s: float = 60.0) -> ClientConfig:
    """The pod's service account: the API server's Service address, its CA, a rotating token."""
    src = "in-cluster service account config"
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubernetesConfigError("load", src, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 Service address
    ca_path = os.path.join(sa_dir, "ca.crt")
    try:
        with open(ca_path, "rb") as f:
            ca = f.read()
    except OSError as e:
        raise KubernetesConfigError("load", src, f"{ca_path}: {e.strerror or e}") from e
    try:
        token = TokenFile(os.path.join(sa_dir, "token"), "in-cluster service account token", clock=clock,
                          refresh_s=refresh_s)
    except KubernetesConfigError as e:
        raise KubernetesConfigError("load", src, str(e)) from e
    return ClientConfig(host=f"https://{host}:{port}", ca_pem=ca, auth=token, source=src)
