"""Logging set-up: structlog, JSON lines in a container, key=value on a terminal (coloured unless NO_COLOR).

Who logs is the command line's choice (shaperd/cli/main.py): the daemons do,
a one-shot command only when asked (``enabled=False`` otherwise: no line at
all, whatever the level).

structlog (and logging) is imported only once something may log: a one-shot command with
logging off (``shaperd status``, ``diff``) never loads it. structlog's own
imports (asyncio, its optional integrations tried one by one) were about 60
modules, seconds of start-up in the QEMU tier's guest where every file lookup
goes over 9p (BENCHMARKS.md "status cost"). While logging is off and structlog
is not loaded, ``get`` hands out a logger that does nothing; the first time
structlog is needed the settings given to ``configure`` are applied, so the
result is the same as configuring it eagerly.
"""

from __future__ import annotations

import os
import sys

# configure()'s settings while logging is off and structlog is not loaded (applied when it is needed).
_deferred: dict | None = None


def configure(json: bool | None = None, level: str = "info", enabled: bool = True) -> None:
    """``json=None`` picks JSON when stderr is not a terminal (DaemonSet, journald); ``enabled=False``
    drops every log event, critical ones included."""
    global _deferred
    if json is None:
        json = not sys.stderr.isatty()
    # Colour on a terminal only, and never with NO_COLOR set (https://no-color.org).
    colors = not os.environ.get("NO_COLOR") and sys.stderr.isatty()
    settings = {"json": json, "colors": colors, "level": level, "enabled": enabled}
    if not enabled and "structlog" not in sys.modules:
        _deferred = settings
        return
    _deferred = None
    _apply(**settings)


def _apply(json: bool, colors: bool, level: str, enabled: bool) -> None:
    import logging

    import structlog

    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=colors)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ] if enabled else [_drop],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelName(level.upper()) if enabled else logging.CRITICAL),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def _structlog():
    """structlog, with configure()'s deferred settings applied first."""
    global _deferred
    import structlog

    if _deferred is not None:
        settings, _deferred = _deferred, None
        _apply(**settings)
    return structlog


def _drop(logger, method, event):
    import structlog

    raise structlog.DropEvent


def get(name: str = "shaperd"):
    if _deferred is not None:
        return _Off(name)
    return _structlog().get_logger(name)


class _Off:
    """A logger handed out while logging is off and structlog is not loaded: every call is a no-op that loads
    nothing. Should logging be configured on later, it passes each call to structlog's logger of that name."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if _deferred is None:
            return getattr(_structlog().get_logger(self._name), attr)
        return self._nothing

    def _nothing(self, *args, **kw):
        return self  # bind() and new() hand back a logger; the level methods' result is never used
