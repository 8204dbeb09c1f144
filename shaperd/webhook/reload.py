"""The webhook's two inputs that change under it: the serving certificate and the tenants file.

Both are files in mounted volumes (a cert-manager Secret with ``tls.crt`` and
``tls.key``; the tenants ConfigMap). The kubelet updates those by swapping a
``..data`` symlink, and cert-manager renews certificates well before expiry,
so the webhook reloads in place instead of restarting. Each is read again
when it is next needed (a new connection, a new review) and rebuilt only
when its bytes changed: no timer, and no reliance on mtimes, which are
coarse. A new version that does not load (a key that does not match its
certificate mid-rotation, a tenants file with a mistake) is logged once and
the last good one stays in use.
"""

from __future__ import annotations

import ssl
import threading
from pathlib import Path

from shaperd.core import log
from shaperd.core.config import load_text
from shaperd.core.errors import ConfigError, ShaperdError

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"


class TlsFiles:
    """A server SSLContext for the certificate and key in a directory, rebuilt when they change."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.cert, self.key = self.dir / CERT_FILE, self.dir / KEY_FILE
        self.log = log.get("shaperd.webhook")
        self._lock = threading.Lock()
        self._loaded: tuple[bytes, bytes] | None = None
        self._failed: tuple[bytes, bytes] | None = None
        self._ctx: ssl.SSLContext | None = None
        self._why = ""
        self.loads = 0  # certificates loaded, the first included
        if self.context() is None:
            raise ShaperdError(f"load TLS certificate from {self.dir}: {self._why}")

    def context(self) -> ssl.SSLContext | None:
        """The context for the next connection (the last good one if the files now on disk do not load)."""
        with self._lock:
            try:
                now = (self.cert.read_bytes(), self.key.read_bytes())
            except OSError as e:
                self._why = f"read {e.filename}: {e.strerror or e}"
                return self._ctx
            if now != self._loaded and now != self._failed:
                self._load(now)
            return self._ctx

    def _load(self, now: tuple[bytes, bytes]) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            # From the paths: the files may have changed again since they were read; the next
            # connection then sees bytes that differ from _loaded and loads once more.
            ctx.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as e:
            self._failed = now
            self._why = f"{self.cert} and {self.key} do not load: {getattr(e, 'reason', None) or e}"
            self.log.error("TLS certificate not loaded; keeping the previous one" if self._ctx else
                           "TLS certificate not loaded", directory=str(self.dir), error=self._why)
            return
        self._ctx, self._loaded, self._failed = ctx, now, None
        self.loads += 1
        if self.loads > 1:
            self.log.info("TLS certificate reloaded", directory=str(self.dir))


class TenantsFile:
    """The current ``make(config)`` for a tenants file, rebuilt when the file's bytes change."""

    def __init__(self, path: str | Path, make):
        self.path = Path(path)
        self.make = make
        self.log = log.get("shaperd.webhook")
        self._lock = threading.Lock()
        self._bytes: bytes | None = None  # what was last read (loaded or rejected)
        self._unreadable = False
        self._current = None

    def current(self):
        """The last good one; None while no valid tenants file was ever read."""
        with self._lock:
            try:
                data = self.path.read_bytes()
            except OSError as e:
                if not self._unreadable:  # once, not per review
                    self.log.error("tenants file unreadable; keeping the last good one", file=str(self.path),
                                   error=e.strerror or str(e))
                self._unreadable, self._bytes = True, None
                return self._current
            self._unreadable = False
            if data == self._bytes:
                return self._current
            self._bytes = data
            try:
                cfg = load_text(data.decode("utf-8"), str(self.path))
            except UnicodeDecodeError as e:
                self.log.error("tenants file rejected", file=str(self.path), problems=[f"not UTF-8 text: {e}"],
                               keeping="last good" if self._current else "nothing: pods are not mutated")
                return self._current
            except ConfigError as e:
                self.log.error("tenants file rejected", file=str(self.path), problems=[str(p) for p in e.problems],
                               keeping="last good" if self._current else "nothing: pods are not mutated")
                return self._current
            self._current = self.make(cfg)
            self.log.info("tenants file loaded", file=str(self.path), tenants=len(cfg.tenants))
            return self._current
