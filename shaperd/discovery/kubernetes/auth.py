"""Where a request's credentials come from, at the moment it is sent.

Owns the three sources a kubeconfig or a pod can name, each answering
``credential()`` with a bearer token and/or a client certificate pair:

- ``StaticToken``: ``users[].user.token``;
- ``TokenFile``: ``tokenFile`` and the service account's projected token.
  Bound tokens rotate (the kubelet rewrites the file, by default every
  ~48 min of a 1 h token), so the file is read again when it changed
  (another inode/size/mtime) and at least every ``refresh_s`` (60 s, as
  client-go's cached file token source). A failed re-read keeps the last
  good token (client-go does the same) and is retried on the next request;
- ``ExecPlugin``: a credential plugin (client.authentication.k8s.io/v1 or
  v1beta1 ``ExecCredential``), run as an argument list in its own process
  group with a deadline, its answer cached until ``expirationTimestamp``.

``invalidate()`` (the transport calls it on a 401) makes the next request
read or run again, which is how a rotated credential heals without a restart.

Must not: make requests to the API server, or run anything through a shell.
Time is injected (``clock``: monotonic seconds for file refresh; ``now``:
wall-clock epoch seconds, which an ``expirationTimestamp`` is in).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shaperd.core import log
from shaperd.discovery.kubernetes.errors import KubernetesConfigError, KubernetesError

_log = log.get("shaperd.k8s")

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
_MAX_TOKEN_BYTES = 64 * 1024


@dataclass(frozen=True)
class Credential:
    """What one request carries: a bearer token, a client certificate pair (PEM), either or both."""

    token: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None


class StaticToken:
    def __init__(self, token: str):
        self._cred = Credential(token=token)

    def credential(self) -> Credential:
        return self._cred

    def invalidate(self) -> None:
        pass


def read_token_file(path: str, field_name: str) -> str:
    """The token in ``path``, stripped; KubernetesConfigError naming the file and the field that named it."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_TOKEN_BYTES + 1)
    except OSError as e:
        raise KubernetesConfigError("read", f"token file {path} ({field_name})", e.strerror or str(e)) from e
    if len(raw) > _MAX_TOKEN_BYTES:
        raise KubernetesConfigError("read", f"token file {path} ({field_name})", f"larger than {_MAX_TOKEN_BYTES} bytes")
    token = raw.decode("utf-8", "replace").strip()
    if not token:
        raise KubernetesConfigError("read", f"token file {path} ({field_name})", "empty")
    return token


class TokenFile:
    """A token file read again when it changes and at least every ``refresh_s``."""

    def __init__(self, path: str, field_name: str, *, refresh_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, on_stale: Callable[[str], None] | None = None):
        self.path, self.field_name, self.refresh_s = path, field_name, refresh_s
        self._clock = clock
        self._on_stale = on_stale
        self._lock = threading.Lock()
        self._token = read_token_file(path, field_name)  # unreadable at start: the caller's config error
        self._ident = self._stat()
        self._read_at = clock()
        self.reads = 1  # how often the file was read (tests, metrics)

    def _stat(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)

    def credential(self) -> Credential:
        with self._lock:
            ident = self._stat()
            if ident != self._ident or self._clock() - self._read_at >= self.refresh_s:
                try:
                    self._token = read_token_file(self.path, self.field_name)
                    self.reads += 1
                except KubernetesConfigError as e:
                    # keep the last good token; tried again on the next request
                    if self._on_stale is not None:
                        self._on_stale(str(e))
                    else:
                        _log.warning("k8s_token_reread_failed", error=str(e), detail="using the last token read")
                else:
                    self._ident, self._read_at = ident, self._clock()
            return Credential(token=self._token)

    def invalidate(self) -> None:
        with self._lock:
            self._ident = None  # re-read on the next request


@dataclass
class ExecConfig:
    """``users[].user.exec`` of a kubeconfig, with paths already resolved."""

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    api_version: str = EXEC_API_VERSIONS[0]
    install_hint: str = ""
    provide_cluster_info: bool = False
    cluster_info: Mapping | None = None  # ExecCredential spec.cluster, when provide_cluster_info
    source: str = "kubeconfig"  # for messages: "kubeconfig /path users[name=x].user.exec"


def parse_timestamp(value: str) -> float:
    """RFC 3339 (metav1.Time) -> epoch seconds."""
    t = dt.datetime.fromisoformat(value)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


class ExecPlugin:
    """Runs a credential plugin when there is no unexpired answer, and caches the answer."""

    def __init__(self, cfg: ExecConfig, *, timeout_s: float = 30.0, now: Callable[[], float] = time.time):
        self.cfg = cfg
        self.timeout_s = timeout_s
        self._now = now
        self._lock = threading.Lock()
        self._cred: Credential | None = None
        self._expires_at: float | None = None
        self.runs = 0  # how often the plugin was run (tests, metrics)

    @property
    def what(self) -> str:
        return f"exec credential plugin {self.cfg.command} ({self.cfg.source})"

    def credential(self) -> Credential:
        with self._lock:
            if self._cred is not None and (self._expires_at is None or self._now() < self._expires_at):
                return self._cred
            self._cred, self._expires_at = self._run()
            return self._cred

    def invalidate(self) -> None:
        with self._lock:
            self._cred = None

    def _env(self) -> dict[str, str]:
        spec: dict = {"interactive": False}
        if self.cfg.provide_cluster_info and self.cfg.cluster_info is not None:
            spec["cluster"] = dict(self.cfg.cluster_info)
        env = dict(os.environ)
        env.update(self.cfg.env)
        env["KUBERNETES_EXEC_INFO"] = json.dumps({"apiVersion": self.cfg.api_version, "kind": "ExecCredential",
                                                  "spec": spec})
        return env

    def _run(self) -> tuple[Credential, float | None]:
        argv = [self.cfg.command, *self.cfg.args]
        self.runs += 1
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=self._env(), start_new_session=True)
        except OSError as e:
            hint = f"; {self.cfg.install_hint.strip()}" if self.cfg.install_hint.strip() else ""
            raise KubernetesError("run", self.what, f"{e.strerror or e}{hint}") from e
        try:
            out, err = p.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: a plugin's own children die with it
            except ProcessLookupError:
                pass
            try:
                p.communicate(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass  # a child that left the group still holds the pipes; abandon them
            raise KubernetesError("run", self.what, f"no answer within {self.timeout_s:g} s; killed") from None
        if p.returncode != 0:
            tail = err.decode("utf-8", "replace").strip()[-300:]
            raise KubernetesError("run", self.what, f"exit status {p.returncode}: {tail or '(no stderr)'}")
        return self._parse(out)

    def _parse(self, out: bytes) -> tuple[Credential, float | None]:
        try:
            doc = json.loads(out)
        except ValueError as e:
            raise KubernetesError("decode", f"ExecCredential from {self.what}", f"not JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            raise KubernetesError("decode", f"ExecCredential from {self.what}", "kind is not ExecCredential")
        if doc.get("apiVersion") != self.cfg.api_version:
            raise KubernetesError("decode", f"ExecCredential from {self.what}",
                                  f"apiVersion {doc.get('apiVersion')!r}, asked for {self.cfg.api_version!r}")
        status = doc.get("status")
        if not isinstance(status, dict):
            raise KubernetesError("decode", f"ExecCredential from {self.what}", "status: missing")
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if token is not None and not (isinstance(token, str) and token):
            raise KubernetesError("decode", f"ExecCredential from {self.what}", "status.token: not a string")
        if (cert is None) != (key is None) or (cert is not None and not (isinstance(cert, str) and isinstance(key, str))):
            raise KubernetesError("decode", f"ExecCredential from {self.what}",
                                  "status.clientCertificateData and clientKeyData: both PEM strings or neither")
        if token is None and cert is None:
            raise KubernetesError("decode", f"ExecCredential from {self.what}",
                                  "status: neither token nor clientCertificateData/clientKeyData")
        expires_at = None
        ts = status.get("expirationTimestamp")
        if ts is not None:
            try:
                expires_at = parse_timestamp(ts)
            except (TypeError, ValueError) as e:
                raise KubernetesError("decode", f"ExecCredential from {self.what}",
                                      f"status.expirationTimestamp: not RFC 3339: {ts!r}") from e
        return Credential(token=token, cert_pem=cert.encode() if cert else None,
                          key_pem=key.encode() if key else None), expires_at
