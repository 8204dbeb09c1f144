"""A tested upgrade: release N-1 (the previous commit's wheel) -> N (this checkout) -> N-1, with traffic flowing.

The bed (tests/upgrade_bed.py): uplink up0 of a node namespace, capacity 200 Mbit/s; tenant ``gold`` has a
60 Mbit/s guarantee, ``capped`` a 40 Mbit/s limit, ``bulk`` neither; each offers more than it gets (120, 80 and
240 Mbit/s of paced UDP from its own source address). N-1 reconciles and enforces; SIGTERM (enforcement stays);
N starts and adopts; SIGTERM; N-1 again. The uplink's classes are read through netlink every 0.2 s throughout
and the test proves, from what the kernel counted:

- no 1 s window in which ``capped`` sent more than ceil * (widest interval) + cbuffer + one packet;
- the enforcing objects (root HTB, classes with their rates, classifier filters with their handles and program
  ids) are the same at every sample, no class counter ever goes back (nothing deleted and made again), and
  ``gold``, in every 1 s window where its sender's own counters show it offered at least its guarantee, sent at
  least guarantee * (narrow interval) - (its bucket's depth + one packet); windows where it offered less are
  excluded and counted, and most windows must be measured;
- the first reconcile of the agent that starts (N at N-1 -> N, N-1 at N -> N-1) writes nothing: the kernel sends
  no link or tc notification in the node namespace from before it starts to after its first reconcile, its own
  log says 0 changes, and the device's full state (eBPF classifier map entries included) is unchanged;
- every metric family N-1 exports, N exports, unless CHANGELOG.md's [Unreleased] section names it.

No rate is asserted: the bounds are the token buckets' and hold on a loaded machine; a window where the sender
could not offer the guarantee (a busy CPU) is excluded, not failed. The unit part at the end shows each check
fails on the data that should fail it.
"""

from __future__ import annotations

import os
import time

import pytest

from shaperd.kernel.rtnl import RtnlReader

from .. import upgrade_bed as ub
from ..tc_state import snapshot
from .conftest import needs_root

RUN_S = 4.0  # each agent's time in charge, with traffic; at 0.2 s samples about 15 one-second windows each
GAP_S = 1.0  # between one agent's exit and the next one's start: no agent at all, enforcement must stay
PORT = 19567


def _phase(bed: ub.UpgradeBed, sampler: ub.Sampler, rel: ub.Release) -> dict:
    """One agent's turn; returns what the test checks about it."""
    reader = RtnlReader(bed.node)
    ifindex = next(l.ifindex for l in reader.links() if l.name == "up0")
    try:
        before = snapshot(reader, ifindex, "up0")
        watch = ub.WriteWatch(bed.node)
        try:
            sampler.mark(f"{rel.name} starts")
            bed.start(rel, PORT)
            first = bed.first_reconcile()
            writes = list(watch.drain())
        finally:
            watch.close()
        after = snapshot(reader, ifindex, "up0")
        time.sleep(RUN_S)
        scrapes = bed.scrape(PORT, times=2)
        sampler.mark(f"{rel.name} SIGTERM")
        code = bed.sigterm()
        log = bed.daemon_log.read_text()
    finally:
        reader.close()
    return {"release": rel.name, "first": first, "writes": writes, "same_state": before == after,
            "families": set().union(*map(ub.families, scrapes)), "exit": code, "log": log[-3000:]}


@pytest.mark.slow  # 8-35 s (--durations, quiet)
@needs_root
def test_upgrade_n_minus_1_to_n_and_back_holds_enforcement_with_traffic():
    bed = ub.UpgradeBed(f"shu{os.getpid() % 100000}")  # N-1's wheel and install: in its work dir
    sampler = None
    try:
        old = ub.build_previous(bed.work)  # fails with a message when HEAD has no parent
        new = ub.this_release()
        v_old, v_new = ub.version_of(old, bed.work), ub.version_of(new, bed.work)
        assert f"commit {old.expect_commit}" in v_old, v_old
        assert f"commit {new.expect_commit}" in v_new, v_new
        assert v_old != v_new and old.expect_commit != new.expect_commit
        bed.build()
        phases = [_phase_first(bed, old)]
        sampler = ub.Sampler(bed.node).start()
        bed.start_senders(seconds=3 * (RUN_S + GAP_S) + 120)  # outlives the phases; killed at the end
        time.sleep(RUN_S)
        sampler.mark("N-1 SIGTERM")
        assert bed.sigterm() == 0
        for rel in (new, old):
            time.sleep(GAP_S)
            phases.append(_phase(bed, sampler, rel))
        time.sleep(GAP_S)
        sampler.stop()
        samples = sampler.samples
        offered = {t: bed.offered(t) for t in ub.OFFER_MBIT}
        bed.stop_senders()
    finally:
        if sampler is not None:
            sampler.stop()
        bed.cleanup()
        _remove_run_files(bed.node)

    # Each agent that took over found the tree in sync and wrote nothing.
    for ph in phases[1:]:
        assert ph["first"].get("changes") == 0, (ph["release"], ph["first"])
        assert ph["writes"] == [], (ph["release"], "netlink writes during its first reconcile", ph["writes"])
        assert ph["same_state"], (ph["release"], "the device's state changed at its first reconcile")
    for ph in phases:
        assert ph["exit"] == 0, (ph["release"], ph["log"])

    # Enforcement held throughout.
    assert samples, "no samples"
    want = samples[0].tree
    assert want and want[0] == ((ub.HTB_HANDLE << 16, "htb"),) and want[2], want  # root HTB and a classifier
    gold, capped = ub.classid("gold"), ub.classid("capped")
    assert {gold, capped} <= {c for c, _, _ in want[1]}, want
    assert ub.tree_gaps(samples, want) == [], sampler.marks
    assert ub.counter_resets(samples) == [], sampler.marks
    over = ub.over_limit_windows(samples, capped)
    assert over == [], (over, sampler.marks)
    g = ub.guarantee_windows(samples, gold, ub.GOLD_GUARANTEE_MBIT * 1e6 / 8, offered["gold"])
    total = g.measured + g.excluded
    # What the run saw, for the report (-s shows it); never asserted as a rate.
    print(f"upgrade: {len(samples)} samples, {g.measured} guarantee windows measured, {g.excluded} excluded, "
          f"largest sender lag {max(g.lags, default=0):.0f} B; "
          f"gold {ub.window_rates(samples, gold)}, capped {ub.window_rates(samples, capped)} Mbit/s (min, max of "
          f"1 s windows); marks {[(round(t - samples[0].t_before, 1), m) for t, m in sampler.marks]}; "
          f"families N-1 {len(phases[0]['families'])}, N {len(phases[1]['families'])}; gold's buffer "
          f"{samples[0].classes[gold].buffer_bytes} B, capped's cbuffer {samples[0].classes[capped].cbuffer_bytes} B")
    assert g.short == [], (g.short, sampler.marks)
    assert total >= 30, (total, g.excluded)  # 3 phases of RUN_S + the gaps, 1 s windows every 0.2 s
    assert g.measured > total / 2, f"only {g.measured} of {total} windows measured ({g.excluded} excluded: " \
                                   "the sender offered less than the guarantee there)"
    # The limit was really pressed (the check above could fail): capped's class was held back.
    c0, c1 = samples[0].classes[capped], samples[-1].classes[capped]
    assert c1.overlimits > c0.overlimits or c1.drops > c0.drops, (c0, c1)

    # The metrics keep their names (or the changelog says which went).
    changelog = (ub.REPO / "CHANGELOG.md").read_text()
    old_names = phases[0]["families"] & phases[2]["families"]  # what N-1 exports both times: not incidental
    missing = ub.missing_families(old_names, phases[1]["families"], ub.unreleased(changelog))
    assert missing == [], f"metric families of N-1 gone in N and not named in CHANGELOG.md [Unreleased]: {missing}"
    assert "shaperd_build_info" in old_names, sorted(old_names)[:20]


def _phase_first(bed: ub.UpgradeBed, rel: ub.Release) -> dict:
    """N-1's first start on the bare device: it builds the tree (writes) before the traffic starts."""
    watch = ub.WriteWatch(bed.node)
    try:
        bed.start(rel, PORT)
        first = bed.first_reconcile()
        writes = watch.drain()
    finally:
        watch.close()
    # The fresh apply wrote, and both counts saw it: the zeros asserted later can be non-zero.
    assert first.get("changes", 0) > 0, first
    assert {"NEWQDISC", "NEWTCLASS", "NEWTFILTER"} <= set(writes), writes
    m = set().union(*map(ub.families, bed.scrape(PORT, times=2)))
    return {"release": rel.name, "first": first, "writes": None, "same_state": None, "families": m, "exit": 0,
            "log": ""}


def _remove_run_files(node: str) -> None:
    """What an agent keeps under /run per node namespace (as tests/integration/conftest.py's Bed removes)."""
    from shaperd.backends.htb import podlabels
    from shaperd.backends.podingress import labels as podingress_labels
    from shaperd.engine import refusals_file

    podingress_labels.remove(podingress_labels.path_for("/run", node))
    refusals_file.path_for("/run", node).unlink(missing_ok=True)
    podlabels.path_for("/run", node).unlink(missing_ok=True)


# -- the checks can fail -------------------------------------------------------------------------------
def _s(t, cls, tree=("tree",)):
    return ub.Sample(t, t + 0.01, {k: ub.ClassCount(b, 0, 0, 0, 1_000_000, 1_000_000, 10_000, 10_000)
                                   for k, b in cls.items()}, tree)


def test_over_limit_windows_flags_a_second_above_the_ceil_and_passes_one_at_it():
    at = [_s(i * 0.2, {1: int(i * 0.2 * 1_000_000)}) for i in range(12)]
    assert ub.over_limit_windows(at, 1) == []
    burst = at[:6] + [_s(1.2, {1: 1_200_000 + 100_000})]  # 100 kB past rate + cbuffer (10 kB) + a packet
    assert ub.over_limit_windows(burst, 1)


def test_guarantee_windows_flags_a_starved_second_and_excludes_a_sender_that_offered_less():
    offered = [(i * 0.01, int(i * 0.01 * 2_000_000)) for i in range(300)]  # 2 MB/s offered
    fed = [_s(i * 0.2, {1: int(i * 0.2 * 1_000_000)}) for i in range(12)]
    r = ub.guarantee_windows(fed, 1, 1_000_000, offered)
    assert r.short == [] and r.measured > 0 and r.excluded == 0
    starved = fed[:3] + [_s(i * 0.2, {1: 400_000}) for i in range(3, 12)]  # the class stopped sending
    assert ub.guarantee_windows(starved, 1, 1_000_000, offered).short
    idle = [(i * 0.01, 0) for i in range(300)]  # the sender offered nothing: excluded, not failed
    r = ub.guarantee_windows(starved, 1, 1_000_000, idle)
    assert r.short == [] and r.measured == 0 and r.excluded > 0


def test_tree_gaps_and_counter_resets_flag_a_missing_tree_and_a_recreated_class():
    s = [_s(0, {1: 10}), _s(0.2, {1: 20}, tree=None), _s(0.4, {1: 30}, tree=("pfifo",)), _s(0.6, {1: 5})]
    assert len(ub.tree_gaps(s, ("tree",))) == 2
    assert len(ub.counter_resets(s)) == 1


def test_missing_families_names_a_removed_metric_unless_the_changelog_does():
    log = "# Changelog\n\n## [Unreleased]\n### Changed\n- `shaperd_old_thing` is now shaperd_new_thing\n\n" \
          "## [0.1.0] - 2026-12-02\n- shaperd_gone_before\n"
    text = ub.unreleased(log)
    assert "shaperd_old_thing" in text and "shaperd_gone_before" not in text
    old = {"shaperd_old_thing", "shaperd_kept", "shaperd_gone_before"}
    assert ub.missing_families(old, {"shaperd_kept", "shaperd_new_thing"}, text) == ["shaperd_gone_before"]
    assert ub.families("# HELP a_total x\n# TYPE a counter\na_total 1\n# TYPE b gauge\nb 2\n") == {"a", "b"}
