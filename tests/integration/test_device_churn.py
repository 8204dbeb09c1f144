"""Device churn: 1,000 interface events, the event socket overflowing, one full resync (issue 14)."""

from __future__ import annotations

import os

import pytest

from ..churn_burst import run_burst
from ..kill_trials import KillBed
from .conftest import needs_root

pytestmark = needs_root


@pytest.fixture
def kbed(tmp_path):
    b = KillBed(f"shc{os.getpid() % 100000}", tmp_path, tenants=5, prefixes_each=4)
    b.resync_s = 600.0  # no periodic resync inside the test: every reconcile counted is the events'
    try:
        yield b.build()
    finally:
        b.cleanup()


def test_a_burst_that_overflows_the_event_socket_costs_one_resync_and_ends_in_the_fresh_apply_state(kbed):
    res = run_burst(kbed, devices=200, stopped=True)
    assert res.events == 1000
    assert res.overflows >= 1, res  # the daemon was stopped through the burst: events were lost, and it said so
    assert res.matches and res.changes_after == 0, res  # the uplink was never touched: nothing to write
    # One full resync: what was queued after the overflow is read with it. A second overflow while that
    # resync ran (the burst's tail still queued) costs exactly one more: the daemon never drops it.
    assert 1 <= res.resyncs <= 2, res
    assert not any(n.startswith("c1r") for n in os.listdir("/sys/class/net"))  # the burst stayed in its namespace
