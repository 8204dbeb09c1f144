"""Fixtures shared by the unit and integration tiers."""

from __future__ import annotations

import pytest

from .k8s_fake import FakeKubeAPI


@pytest.fixture
def api():
    """A fake Kubernetes API server (tests/k8s_fake.py) on a free loopback port, closed after the test."""
    fake = FakeKubeAPI()
    try:
        yield fake
    finally:
        fake.close()
