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
            out["stats"] = {k: list(v) for k, v in maps.read_stats().items()}
            # Cost per packet as the kernel measures it (mean of repeat runs): reported, never asserted.
            maps.set_clock(TENANT, 0)
            out["ns_per_run"] = bpf_maps.test_run(fd, FRAME, bpf_maps.SkBuff(priority=0x73680000 | TENANT),
                                                  repeat=10000).duration_ns
            out["concurrent"] = concurrent(maps, fd)
            out["insns"] = len(edt_prog.stamper(maps.rates.fd, maps.clocks.fd, maps.stats.fd, HORIZON_NS)) // 8
        finally:
            import os

            os.close(fd)
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
    if stats.get(DEFAULT) != [2000, 2, 0] or stats.get(OTHER) != [1000, 1, 0]:
        bad.append(f"stats of default/other: {stats.get(DEFAULT)} {stats.get(OTHER)}")
    return bad
