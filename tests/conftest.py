"""Fixtures shared by the unit and integration tiers."""

from __future__ import annotations

import pytest
import structlog

from .k8s_fake import FakeKubeAPI


@pytest.fixture
def api():
    """A fake Kubernetes API server (tests/k8s_fake.py) on a free loopback port, closed after the test."""
    fake = FakeKubeAPI()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture(autouse=True)
def _structlog_config_per_test():
    """Every test starts from the logging configuration the session started with, and leaves it so.

    An in-process ``main()`` of a one-shot command configures structlog to drop every event (or above a
    level); a later test reading events with ``structlog.testing.capture_logs`` then saw none: capture_logs
    replaces the processors, not the level filter. Which test ran before depended on the order, so it broke
    only under pytest-xdist's (scripts/test --quick)."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)
