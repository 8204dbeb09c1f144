"""Crafted packets through the EDT stamper with BPF_PROG_TEST_RUN: what each case returns and stamps.

Shared by the host's integration test (tests/integration/test_edt_stamper.py)
and the QEMU guest (tests/kernel/guest_probe.py, on Debian's 6.1 kernel), so
both kernels are judged by the same expectations (``EXPECTED``). Setting
skb->tstamp in the context to a far-future T makes "now" = T (the program
takes max(ktime, skb->tstamp)), so the stamps are exact, not timing-dependent.
"""

from __future__ import annotations

import time

T = 10**15  # ns; far beyond CLOCK_MONOTONIC on any test machine
HORIZON_NS = 2_000_000_000
TENANT, OTHER, SLOW, DEFAULT = 0x10, 0x20, 0x30, 0x2
NS_PER_BYTE = {TENANT: 8000, DEFAULT: 800, SLOW: 4_000_000}  # 1 Mbit/s, 10 Mbit/s, 2 kbit/s
FRAME = bytes(14) + bytes(986)  # 1000 bytes on the wire
# Capped pods: POD (1 Mbit/s) under PARENT (10 Mbit/s); LONE (a pod key with a parent but no rate of its own)
# under PARENT too; ORPHAN (1 Mbit/s) under OTHER, a parent with no rate set.
PARENT, POD, LONE, ORPHAN = 0x50, 0x51, 0x52, 0x53
POD_NS_PER_BYTE = {PARENT: 800, POD: 8000, ORPHAN: 8000}
POD_PARENTS = {POD: PARENT, LONE: PARENT, ORPHAN: OTHER}

# case -> (retval, stamp - T or None for "unchanged" (== T), clock of TENANT - T afterwards or None)
EXPECTED = {
    "first": (0, 8_000_000, 8_000_000),
    "second": (0, 16_000_000, 16_000_000),
    "clock_ahead": (0, 500_000_000 + 8_000_000, 508_000_000),
    "beyond_horizon": (2, 0, 2_001_000_000),
    "at_horizon": (0, 2_000_000_000 + 8_000_000, 2_008_000_000),
    "one_slow_packet_longer_than_the_horizon": (0, 4_000_000_000, None),
    "no_tenant": (0, 800_000, None),
    "foreign_major": (0, 1_600_000, None),
    "no_rate_set": (0, 0, None),
}
# pod case -> (retval, stamp - T, clock of POD - T, clock of PARENT - T) afterwards
POD_EXPECTED = {
    # the pod's own clock is the later: 1000 B at 1 Mbit/s = 8 ms, the tenant's 0.8 ms
    "pod_first": (0, 8_000_000, 8_000_000, 800_000),
    # the tenant is backlogged 50 ms: its departure (50.8 ms) is the later; both clocks move
    "pod_tenant_later": (0, 50_800_000, 16_000_000, 50_800_000),
    # the tenant's backlog is beyond the horizon: dropped, and the pod's own step undone (its clock stays)
    "pod_tenant_beyond_horizon": (2, 0, 16_000_000, 2_001_000_000),
    # the pod's own backlog beyond the horizon: dropped before the tenant's clock is touched
    "pod_beyond_horizon": (2, 0, 2_001_000_000, 800_000),
    # a pod key with a parent but no rate of its own: paced by the tenant alone
    "pod_without_own_rate": (0, 1_600_000, None, 1_600_000),
    # a pod whose parent has no rate set: paced by its own rate alone
    "pod_parent_without_rate": (0, 8_000_000, None, None),
}


def run_cases() -> dict:
    from shaperd.kernel import bpf_maps
    from shaperd.backends.edt import kernel_stamper as edt_prog

    out: dict = {"cases": {}}
    with edt_prog.create_maps() as maps:
        fd = edt_prog.load(maps, HORIZON_NS)
        try:
            maps.write_rates({k: v << 16 for k, v in NS_PER_BYTE.items()})

            def run(name, priority, clock=None):
                if clock is not None:
                    maps.set_clock(TENANT, clock)
                r = bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=priority, tstamp=T))
                out["cases"][name] = [r.retval, r.ctx_out.tstamp - T, maps.read_clock(TENANT) - T
                                      if priority == 0x73680000 | TENANT else None]

            run("first", 0x73680000 | TENANT)
            run("second", 0x73680000 | TENANT)
            run("clock_ahead", 0x73680000 | TENANT, clock=T + 500_000_000)
            run("beyond_horizon", 0x73680000 | TENANT, clock=T + 2_001_000_000)
            run("at_horizon", 0x73680000 | TENANT, clock=T + 2_000_000_000)
            run("one_slow_packet_longer_than_the_horizon", 0x73680000 | SLOW)
            run("no_tenant", 0)
            run("foreign_major", 0x00010010)
            run("no_rate_set", 0x73680000 | OTHER)
            # Without a stamp from the socket, "now" is CLOCK_MONOTONIC (the clock sch_fq compares with).
            maps.set_clock(TENANT, 0)
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            r = bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=0x73680000 | TENANT))
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            out["monotonic"] = [before + 8_000_000 <= r.ctx_out.tstamp <= after + 8_000_000, r.retval]
            out["pods"] = pod_cases(maps, fd)
            out["stats"] = {k: list(v) for k, v in maps.read_stats().items()}
            # Cost per packet as the kernel measures it (mean of repeat runs): reported, never asserted.
            maps.set_clock(TENANT, 0)
            out["ns_per_run"] = bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=0x73680000 | TENANT),
                                                  repeat=10000).duration_ns
            # The same for a capped pod's packet (two clock steps, two counters): its extra cost, reported.
            maps.set_clock(POD, 0)
            maps.set_clock(PARENT, 0)
            out["ns_per_run_pod"] = bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=0x73680000 | POD),
                                                      repeat=10000).duration_ns
            out["concurrent"] = concurrent(maps, fd)
            out["insns"] = len(edt_prog.stamper(maps.rates.fd, maps.clocks.fd, maps.stats.fd, HORIZON_NS,
                                                parents_fd=maps.parents.fd)) // 8
        finally:
            import os

            os.close(fd)
    return out


def pod_cases(maps, fd) -> dict:
    """A capped pod's packets: stamped by the later of its own clock and its tenant's (POD_EXPECTED)."""
    from shaperd.kernel import bpf_maps

    maps.write_rates({k: v << 16 for k, v in POD_NS_PER_BYTE.items()})
    maps.write_parents(POD_PARENTS)
    out = {}

    def run(name, key, pod_clock=None, parent_clock=None):
        if pod_clock is not None:
            maps.set_clock(POD, pod_clock)
        if parent_clock is not None:
            maps.set_clock(PARENT, parent_clock)
        r = bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=0x73680000 | key, tstamp=T))
        clocks = maps.read_clocks([key, POD_PARENTS[key]])
        out[name] = [r.retval, r.ctx_out.tstamp - T,
                     clocks[key] - T if key == POD else None,
                     clocks[POD_PARENTS[key]] - T if POD_PARENTS[key] == PARENT else None]

    run("pod_first", POD)
    run("pod_tenant_later", POD, parent_clock=T + 50_000_000)
    run("pod_tenant_beyond_horizon", POD, parent_clock=T + 2_001_000_000)
    run("pod_beyond_horizon", POD, pod_clock=T + 2_001_000_000, parent_clock=T + 800_000)
    run("pod_without_own_rate", LONE, parent_clock=T + 800_000)
    run("pod_parent_without_rate", ORPHAN)
    return out


RACE_KEY, RACE_REPEAT, RACE_THREADS = 0x40, 50_000, 2


def concurrent(maps, fd) -> list[int]:
    """Two threads stamp one tenant at once (ctypes drops the GIL in bpf()): [clock - T, packets x delay].

    With "now" pinned at T every packet must move the shared clock by exactly its delay, whether it won
    the cmpxchg or queued behind another CPU with fetch-and-add: equal values mean no lost update.
    """
    import threading

    from shaperd.kernel import bpf_maps

    delay_ns = 1000  # 1 ns per byte, 1000-byte frames
    maps.write_rates({RACE_KEY: 1 << 16})
    maps.set_clock(RACE_KEY, T)

    def worker():
        bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=0x73680000 | RACE_KEY, tstamp=T), repeat=RACE_REPEAT)

    threads = [threading.Thread(target=worker) for _ in range(RACE_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [maps.read_clock(RACE_KEY) - T, RACE_THREADS * RACE_REPEAT * delay_ns]


def problems(result: dict) -> list[str]:
    """Every way ``result`` (from run_cases) differs from the expectations; empty = all hold."""
    bad = []
    for name, want in EXPECTED.items():
        got = result["cases"].get(name)
        if got is None or list(want) != list(got):
            bad.append(f"{name}: want (retval, stamp-T, clock-T) {want}, got {got}")
    race = result.get("concurrent")
    if not race or race[0] != race[1]:
        bad.append(f"concurrent stamping lost or duplicated clock updates: clock - T, want: {race}")
    if result.get("monotonic") != [True, 0]:
        bad.append(f"stamp from CLOCK_MONOTONIC + delay: {result.get('monotonic')}")
    stats = {int(k): v for k, v in result.get("stats", {}).items()}
    # TENANT: first, second, clock_ahead, at_horizon, monotonic passed (5000 B), beyond_horizon dropped.
    if stats.get(TENANT) != [5000, 5, 1]:
        bad.append(f"stats of the tenant: want [5000, 5, 1], got {stats.get(TENANT)}")
    if stats.get(DEFAULT) != [2000, 2, 0]:
        bad.append(f"stats of default: {stats.get(DEFAULT)}")
    for name, want in POD_EXPECTED.items():
        got = result.get("pods", {}).get(name)
        if got is None or list(want) != list(got):
            bad.append(f"{name}: want (retval, stamp-T, pod clock-T, tenant clock-T) {want}, got {got}")
    # Each pod packet is counted under its own key AND its parent's: POD passed 2, dropped 2; LONE passed 1;
    # ORPHAN passed 1 (counted under OTHER too, beside OTHER's own packet).
    want_stats = {POD: [2000, 2, 2], LONE: [1000, 1, 0], ORPHAN: [1000, 1, 0], PARENT: [3000, 3, 2],
                  OTHER: [2000, 2, 0]}
    for key, want in want_stats.items():
        if stats.get(key) != want:
            bad.append(f"stats of key {key:#x}: want {want}, got {stats.get(key)}")
    return bad
