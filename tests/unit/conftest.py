"""Unit tests never speak to the kernel: the probe's question to it (kernel/kind_ask.py) gets no answer here,
unless a test injects one. tests/unit/test_kind_ask.py tests the real function on fake sockets."""

from __future__ import annotations

import pytest

from shaperd.kernel import kind_ask


@pytest.fixture(autouse=True)
def _kernel_gives_no_answer(monkeypatch):
    monkeypatch.setattr(kind_ask, "ask", lambda kind, *a, **kw: kind_ask.KindAnswer(
        kind, kind_ask.NO_ANSWER, "not asked in unit tests"))
