"""The metrics endpoint's web config file: Prometheus exporter-toolkit's ``web-config.yml`` format.

Owns: reading and validating that file (``--web.config.file``), the TLS
server context it describes and the basic-auth check against its bcrypt
hashes. Supported, with exporter-toolkit's meaning:

- ``tls_server_config``: ``cert_file``, ``key_file`` (relative paths are
  relative to the web config file's directory, as exporter-toolkit does),
  ``client_auth_type`` (NoClientCert, RequireAndVerifyClientCert,
  VerifyClientCertIfGiven),
  ``client_ca_file``, ``min_version`` / ``max_version`` (TLS10..TLS13,
  default TLS12..TLS13);
- ``basic_auth_users``: user name -> bcrypt hash (``$2a$``, ``$2b$``,
  ``$2y$``; make one with ``htpasswd -nBC 10 "" | tr -d ':\\n'``);
- ``http_server_config.headers`` (added to every response) and
  ``http_server_config.http2`` (accepted; this server speaks HTTP/1.1).

Refused with a message rather than silently ignored (a security setting
that does nothing is worse than an error): inline ``cert``/``key``/
``client_ca``, ``cipher_suites``, ``curve_preferences``,
``prefer_server_cipher_suites``, ``client_allowed_sans``, ``rate_limit``,
and any unknown key. Must not: open sockets or serve (report/http.py does).

bcrypt is the ``bcrypt`` package: the standard library has no bcrypt (the
``crypt`` module is deprecated, removed in Python 3.13, and glibc's crypt(3)
does not do ``$2y$``). A bcrypt check costs tens of milliseconds by design,
so a successful (user, password, hash) is remembered in a small cache keyed
by its SHA-256, as exporter-toolkit does; unknown users are checked against
a dummy hash so the answer takes as long as for a known one.
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from shaperd.core.errors import ShaperdError

_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_TLS_UNSUPPORTED = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites",
                    "client_allowed_sans"}
_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TOP_UNSUPPORTED = {"rate_limit"}
_HEADERS = {"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
            "Strict-Transport-Security"}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
             "TLS13": ssl.TLSVersion.TLSv1_3}
# RequestClientCert and RequireAnyClientCert (a certificate taken unverified) have no OpenSSL equivalent
# in Python's ssl module: refused.
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
MAX_FILE_BYTES = 1 << 20
_dummy: list[bytes] = []  # bcrypt of a random password at cost 10: what an unknown user is checked against


def _dummy_hash() -> bytes:
    if not _dummy:
        import bcrypt

        _dummy.append(bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(10)))
    return _dummy[0]


class WebConfigError(ShaperdError):
    """``load web config FILE: field: problem``."""

    def __init__(self, path: str, field_path: str, problem: str):
        self.path, self.field, self.problem = path, field_path, problem
        where = f"{field_path}: " if field_path else ""
        super().__init__(f"load web config {path}: {where}{problem}")


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_auth: str = "NoClientCert"
    client_ca_file: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[self.min_version]
        ctx.maximum_version = _VERSIONS[self.max_version]
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth]
        if self.client_ca_file:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        return ctx


@dataclass
class WebConfig:
    path: str = ""
    tls: TlsSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    _ok_cache: set = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    def check_authorization(self, header: str | None) -> bool:
        """An ``Authorization: Basic ...`` header against the bcrypt hashes; True when no users are set."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
        with self._lock:
            if hashed is not None and key in self._ok_cache:
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password.encode(), hashed or _dummy_hash()) and hashed is not None
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._ok_cache) > 256:
                    self._ok_cache.clear()
                self._ok_cache.add(key)
        return ok


def load(path: str) -> WebConfig:
    """Read and validate a web config file; raises WebConfigError naming the field."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
                raise WebConfigError(path, "", f"file is above {MAX_FILE_BYTES:,} bytes")
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except OSError as e:
        raise WebConfigError(path, "", f"cannot read file: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise WebConfigError(path, "", f"not UTF-8 text: {e}") from e
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise WebConfigError(path, "", f"not valid YAML: {getattr(e, 'problem', None) or e}") from e
    return from_dict(doc, path)


def from_dict(doc, path: str = "<memory>") -> WebConfig:
    if doc is None:
        return WebConfig(path=path)  # an empty file: plain HTTP, no auth (exporter-toolkit's reading too)
    if not isinstance(doc, dict):
        raise WebConfigError(path, "", f"expected a mapping, got {type(doc).__name__}")
    _keys(doc, _TOP_KEYS, _TOP_UNSUPPORTED, "", path)
    base = Path(path).parent
    cfg = WebConfig(path=path)
    tls = doc.get("tls_server_config")
    if tls is not None:
        cfg.tls = _tls(tls, base, path)
    users = doc.get("basic_auth_users")
    if users is not None:
        if not isinstance(users, dict):
            raise WebConfigError(path, "basic_auth_users", "expected a mapping of user name to bcrypt hash")
        for u, h in users.items():
            if not isinstance(u, str) or not u or ":" in u:
                raise WebConfigError(path, f"basic_auth_users.{u}", "expected a user name without ':'")
            if not isinstance(h, str) or not h.startswith(_BCRYPT_PREFIXES) or len(h) != 60:
                raise WebConfigError(path, f"basic_auth_users.{u}",
                                     "expected a bcrypt hash ($2y$10$ followed by 53 characters; htpasswd -nBC 10)")
            cfg.users[u] = h.encode()
    http = doc.get("http_server_config")
    if http is not None:
        if not isinstance(http, dict):
            raise WebConfigError(path, "http_server_config", "expected a mapping")
        _keys(http, {"http2", "headers"}, set(), "http_server_config", path)
        if "http2" in http and not isinstance(http["http2"], bool):
            raise WebConfigError(path, "http_server_config.http2", "expected true or false")
        headers = http.get("headers") or {}
        if not isinstance(headers, dict):
            raise WebConfigError(path, "http_server_config.headers", "expected a mapping")
        for k, v in headers.items():
            if k not in _HEADERS:
                raise WebConfigError(path, f"http_server_config.headers.{k}",
                                     f"unknown header; expected one of {', '.join(sorted(_HEADERS))}")
            if not isinstance(v, str) or "\n" in v or "\r" in v:
                raise WebConfigError(path, f"http_server_config.headers.{k}", "expected a one-line string")
            if v:
                cfg.headers[k] = v
    return cfg


def _keys(obj: dict, allowed: set[str], unsupported: set[str], where: str, path: str) -> None:
    for k in obj:
        at = f"{where}.{k}" if where else str(k)
        if k in unsupported:
            raise WebConfigError(path, at, "not supported by shaperd's metrics endpoint (refused rather than ignored)")
        if k not in allowed:
            raise WebConfigError(path, at, f"unknown key; expected one of {', '.join(sorted(allowed))}")


def _tls(obj, base: Path, path: str) -> TlsSettings:
    if not isinstance(obj, dict):
        raise WebConfigError(path, "tls_server_config", "expected a mapping")
    _keys(obj, _TLS_KEYS, _TLS_UNSUPPORTED, "tls_server_config", path)

    def file(key: str, required: bool) -> str | None:
        v = obj.get(key)
        if v is None:
            if required:
                raise WebConfigError(path, f"tls_server_config.{key}", "required with tls_server_config")
            return None
        if not isinstance(v, str) or not v:
            raise WebConfigError(path, f"tls_server_config.{key}", "expected a file name")
        p = base / v
        if not p.is_file():
            raise WebConfigError(path, f"tls_server_config.{key}", f"{p}: no such file")
        return str(p)

    auth = obj.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(path, "tls_server_config.client_auth_type",
                             f"expected one of {', '.join(_CLIENT_AUTH)}, got {auth!r}")
    ca = file("client_ca_file", required=auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"))
    versions = []
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = obj.get(key, default)
        if v not in _VERSIONS:
            raise WebConfigError(path, f"tls_server_config.{key}", f"expected one of {', '.join(_VERSIONS)}, got {v!r}")
        versions.append(v)
    if _VERSIONS[versions[0]] > _VERSIONS[versions[1]]:
        raise WebConfigError(path, "tls_server_config.min_version", f"{versions[0]} is above max_version {versions[1]}")
    settings = TlsSettings(cert_file=file("cert_file", True), key_file=file("key_file", True), client_auth=auth,
                           client_ca_file=ca, min_version=versions[0], max_version=versions[1])
    try:
        settings.context()  # the certificate and key load and match now, not at the first scrape
    except (ssl.SSLError, OSError) as e:
        raise WebConfigError(path, "tls_server_config", f"load certificate {settings.cert_file} with key "
                             f"{settings.key_file}: {getattr(e, 'reason', None) or e}") from e
    return settings


class WebConfigSource:
    """The current web config, re-read when the file (or a certificate or key it names) changes, so a
    rotated certificate is served without a restart (exporter-toolkit re-reads on every request; a
    stat per connection is enough). A bad new file is logged and the last good one kept."""

    def __init__(self, path: str, on_error=None):
        self.path = path
        self.on_error = on_error
        self._lock = threading.Lock()
        self.config = load(path)  # at start a bad file is an error the daemon exits with
        self._stamps = self._stamp_all()

    def _files(self) -> list[str]:
        t = self.config.tls
        return [self.path] + ([f for f in (t.cert_file, t.key_file, t.client_ca_file) if f] if t else [])

    def _stamp_all(self) -> tuple:
        out = []
        for f in self._files():
            try:
                st = os.stat(f)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def current(self) -> tuple[WebConfig, ssl.SSLContext | None]:
        with self._lock:
            stamps = self._stamp_all()
            if stamps != self._stamps:
                self._stamps = stamps
                try:
                    self.config = load(self.path)
                    self._ctx = None
                    self._stamps = self._stamp_all()
                except WebConfigError as e:
                    if self.on_error is not None:
                        self.on_error(e)
            if self.config.tls is None:
                return self.config, None
            if getattr(self, "_ctx", None) is None:
                self._ctx = self.config.tls.context()
            return self.config, self._ctx
