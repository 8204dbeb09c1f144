"""Kill anywhere, a few trials for CI (bench/kill_anywhere.py runs 100): see tests/kill_trials.py."""

from __future__ import annotations

import os
import random

import pytest

from ..kill_trials import KillBed
from .conftest import needs_root

pytestmark = needs_root

TRIALS = 4
SEED = 14


@pytest.fixture(params=["u32", "ebpf"])
def kbed(tmp_path, request):
    b = KillBed(f"shk{os.getpid() % 100000}", tmp_path, tenants=10, prefixes_each=20, classifier=request.param)
    try:
        yield b.build()
    finally:
        b.cleanup()


def test_sigkill_during_first_apply_or_large_change_then_restart_reaches_the_fresh_apply_state(kbed):
    # The eBPF path's reference state carries the classifier's map entries, so "matches" covers them.
    assert bool(kbed.ref_a["maps"]) == (kbed.env[-1] != "SHAPERD_CLASSIFIER=u32"), kbed.ref_a["maps"][:1]
    first_s, change_s = kbed.measure()
    rng = random.Random(SEED)
    trials = [kbed.trial(n, rng, first_s, change_s) for n in range(TRIALS)]
    bad = [t for t in trials if not t.ok]
    assert not bad, bad
    assert {t.kind for t in trials} == {"first apply", "large change"}  # the seed covers both
    assert all(t.counter_grew for t in trials if t.kind == "large change")
