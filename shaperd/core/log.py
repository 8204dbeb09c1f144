"""Logging set-up: structlog, JSON lines in a container, key=value on a terminal (coloured unless NO_COLOR).

Who logs is the command line's choice (shaperd/cli/main.py): the daemons do,
a one-shot command only when asked (``enabled=False`` otherwise: no line at
all, whatever the level).
"""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure(json: bool | None = None, level: str = "info", enabled: bool = True) -> None:
    """``json=None`` picks JSON when stderr is not a terminal (DaemonSet, journald); ``enabled=False``
    drops every log event, critical ones included."""
    if json is None:
        json = not sys.stderr.isatty()
    # Colour on a terminal only, and never with NO_COLOR set (https://no-color.org).
    colors = not os.environ.get("NO_COLOR") and sys.stderr.isatty()
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


def _drop(logger, method, event):
    raise structlog.DropEvent


def get(name: str = "shaperd"):
    return structlog.get_logger(name)
