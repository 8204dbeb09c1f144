"""The events of an open watch response: newline-delimited JSON over a chunked body.

Owns splitting the body into lines as the bytes arrive (a line may span
chunks, a chunk may hold several lines), decoding each into a
``{"type", "object"}`` event, and the ERROR event: one with a Status code
(410 Gone when our resourceVersion is compacted away) raises ``ApiStatus``;
one without raises ``WatchStreamCorrupt``, as does a line that is not an
event or one longer than ``MAX_LINE_BYTES``. BOOKMARK events are passed on
(the consumer keeps their resourceVersion). The read timeout is the
response's (set by ``transport``); a socket cut by ``stop()`` ends the
iteration (EOF) or raises a urllib3 error the caller maps.

Must not: decide what an event means (the watch loops do), or retry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from shaperd.discovery.kubernetes.errors import ApiStatus, WatchStreamCorrupt

MAX_LINE_BYTES = 16 * 1024 * 1024  # an object is at most ~1.5 MiB in etcd; anything this long is not an event


def _chunks(resp) -> Iterator[bytes]:
    if getattr(resp, "chunked", False) and resp.supports_chunked_reads():
        yield from resp.read_chunked(decode_content=True)
        return
    while True:  # not chunked (HTTP/1.0 style, close-delimited): whatever has arrived, never wait for a full buffer
        data = resp.read1(64 * 1024)
        if not data:
            return
        yield data


def lines(resp) -> Iterator[bytes]:
    """Complete lines of ``resp``'s body, without the newline, as soon as each is complete."""
    buf = b""
    for chunk in _chunks(resp):
        searched = len(buf)  # a long object arrives in many chunks: look for the newline in the new bytes only
        buf += chunk
        while True:
            i = buf.find(b"\n", searched)
            if i < 0:
                break
            line, buf, searched = buf[:i], buf[i + 1:], 0
            yield line
        if len(buf) > MAX_LINE_BYTES:
            raise WatchStreamCorrupt("decode", "watch event", f"a line longer than {MAX_LINE_BYTES} bytes")
    if buf.strip():
        yield buf  # the server's last line without its newline


def events(resp, what: str = "watch") -> Iterator[dict[str, Any]]:
    """The {type, object} events of ``resp``; blank lines (keepalives) skipped."""
    for raw in lines(resp):
        if not raw.strip():
            continue
        try:
            ev = json.loads(raw)
        except ValueError as e:
            raise WatchStreamCorrupt("decode", f"watch event of {what}", f"not JSON ({e}): {raw[:80]!r}") from e
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str) or "object" not in ev:
            raise WatchStreamCorrupt("decode", f"watch event of {what}", f"not a {{type, object}} event: {raw[:80]!r}")
        if ev["type"] == "ERROR":
            st = ev["object"]
            if not isinstance(st, dict) or not isinstance(st.get("code"), int):
                raise WatchStreamCorrupt("decode", f"watch ERROR event of {what}", f"no Status code: {raw[:80]!r}")
            raise ApiStatus(st["code"], str(st.get("reason") or ""), str(st.get("message") or ""))
        yield ev


def close(resp, clean: bool) -> None:
    """Give the connection back to the pool after a body read to its end; close it otherwise
    (a half-read watch must not be reused)."""
    try:
        if clean:
            resp.release_conn()
        else:
            resp.close()
            resp.release_conn()
    except Exception:  # noqa: BLE001 - a cut socket may refuse either
        pass
