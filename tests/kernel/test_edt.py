"""The edt data plane on Debian's 6.1 kernel (sch_fq, mq, BPF_ATOMIC cmpxchg), from the tier's one boot.

The guest ran tests/kernel/edt_guest.py: the stamper's crafted cases with
BPF_PROG_TEST_RUN (the same expectations as on the host), shaperd's apply
and resync of an edt uplink (a veth with 4 TX queues), and one isolation run.
Throughput under TCG depends on the machine's load, so no check here is a
rate: the bytes a tenant got through are compared with the bytes its limit
allows over the time they can have been sent in (``allowed_bytes``), which
holds however slow the guest is. The stamper spaces a tenant's departure
times at no more than its rate, and the receiver reads a packet no earlier
than it left: the bytes it got before time T were stamped to leave before T,
so there are at most rate * T of them, plus one datagram. Whether the higher
priority gets the spare, and how close each tenant comes to its targets, are
rates: bench/edt_qemu.py measures them.
"""

from __future__ import annotations

import pytest

from tests import edt_cases

from .edt_guest import BRONZE, CAPACITY_MBIT, DATAGRAM, GOLD, TX_QUEUES

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def edt(guest):
    r = guest.result.get("edt")
    assert r is not None, guest.step("edt")
    assert not r.get("errors"), r.get("errors")
    return r


def test_the_stamper_stamps_exactly_on_debians_kernel(edt):
    assert edt["uname"].startswith("6.1")
    assert edt_cases.problems(edt["cases"]) == []


def test_apply_builds_mq_with_fq_per_queue_and_the_stamper_and_a_resync_writes_nothing(edt):
    a = edt["apply_edt_0"]
    assert a["fq"] and a["mq"], a["capabilities"]
    assert not (a["first_failed"] or a["errors"] or a["problems"]), a
    assert a["first"][0].startswith("set root mq qdisc 7365: on edt0")
    assert sum(d.startswith("set fq qdisc ") for d in a["first"]) == TX_QUEUES
    assert any(d.startswith("set edt stamper shpe_") for d in a["first"])
    assert a["resync_changes"] == 0
    assert a["tc_qdisc"].count("horizon_drop") == TX_QUEUES and "qdisc mq 7365: root" in a["tc_qdisc"]
    assert "direct-action" in a["tc_filter"] and "pref 49152" in a["tc_filter"]


# The stamper's horizon (backends/edt/plan.py STAMPER_HORIZON_NS): a packet sent at T is stamped to leave by T + it.
HORIZON_S = 0.1


def allowed_bytes(mbit_per_s: float, seconds: float, datagrams: int = 1) -> float:
    return mbit_per_s * 1e6 / 8 * seconds + datagrams * DATAGRAM


def sending_s(run: dict, stop_s: float, *who: str) -> float:
    """Seconds from t0 to when the last of ``who`` could stamp a packet: its schedule's stop, or later when its
    last sendto returned later (a sender descheduled inside it on a busy host: seen once, one datagram over a
    bound that used the schedule)."""
    return max([stop_s] + [run.get(f"{w}_until_s", 0.0) for w in who])


def test_isolation_the_limits_hold_as_bytes_against_time(edt):
    iso = edt["isolation_edt_0"]
    limit = BRONZE["limit"] * CAPACITY_MBIT
    # bronze alone, before gold starts: at most its limit over that time.
    assert 0 < iso["bronze_bytes_before_gold"] <= allowed_bytes(limit, iso["alone_s"]), iso
    assert iso["gold_bytes"] > 0, iso
    # Both together, to the end of the senders (+ the horizon): at most the capacity. 3 % for the controller's
    # first step after gold wakes: gold's guarantee was written while it was idle and bronze still held its limit.
    both_s = sending_s(iso, iso["alone_s"] + iso["both_s"], "bronze", "gold") - iso["alone_s"]
    total = allowed_bytes(limit, iso["alone_s"]) + allowed_bytes(CAPACITY_MBIT, both_s + HORIZON_S)
    assert iso["gold_bytes"] + iso["bronze_bytes"] <= 1.03 * total, iso


def test_moving_between_htb_and_edt_and_tearing_down_leaves_only_what_each_step_wants(edt):
    sw = edt["switch"]
    for step in ("htb", "to_edt", "back_to_htb"):
        assert not (sw[step]["failed"] or sw[step]["errors"]), (step, sw[step])
        assert sw[step]["resync_changes"] == 0, (step, sw[step])
    assert "qdisc mq 7365: root" in sw["to_edt"]["tc"] and "htb 7368:" not in sw["to_edt"]["tc"]
    back = sw["back_to_htb"]
    assert "qdisc htb 7368: root" in back["tc"] and "shpe_" not in back["tc"] and "7365:" not in back["tc"]
    assert any(w.startswith("delete edt stamper") for w in back["writes"]), back["writes"]
    down = sw["teardown"]
    assert not down["failed"] and "7368:" not in down["tc"] and "7365:" not in down["tc"], down


def test_status_shows_each_edt_tenant_with_the_rate_the_controller_left_in_the_map_and_its_bytes(edt):
    st = edt["status_edt_0"]
    # Its wall time in the guest, for BENCHMARKS.md "status cost" (printed under -s, never asserted).
    print("shaperd status in the guest (s): " + ", ".join(f"{k} {v.get('seconds')}" for k, v in edt.items()
                                                          if k.startswith("status_") and isinstance(v, dict)))
    assert st["rc"] == 0 and st["edt_errors"] == [], st
    rows = {r["tenant"]: r for r in st["edt"] if r["device"] == "edt0"}
    assert set(rows) == {"gold", "bronze", "(none)"}, st
    for t in (GOLD, BRONZE):
        r, g = rows[t["name"]], int(t["g"] * CAPACITY_MBIT * 1000) * 1000  # as tenants_yaml writes it (Kbps)
        assert r["guarantee_bps"] == g and r["bytes"] > 0 and r["packets"] > 0, r
        # Written rate = max(allocation, guarantee), capped at the limit (Q16 reads back within a step).
        assert r["map_rate_bps"] is not None and r["map_rate_bps"] >= g, r
    assert rows["bronze"]["map_rate_bps"] <= BRONZE["limit"] * CAPACITY_MBIT * 1_000_000 * 1.0001, rows["bronze"]


def test_the_daemon_with_net_admin_and_bpf_only_runs_edt_from_evidence_and_a_restart_adopts_it(edt):
    """tests/kernel/edt_caps_guest.py: `shaperd run` under setpriv (NET_ADMIN + BPF), a private bpffs."""
    lc = edt["least_caps"]
    first, second = lc["first"], lc["second"]
    # No probe namespace without CAP_SYS_ADMIN: sch_fq comes from the kernel's files (Debian: a module).
    assert any("capability probe skipped" in c for c in first["capabilities"]), first["capabilities"]
    fq_note = "sch_fq present: loaded" if lc["sch_fq_loaded_before"] else "sch_fq present: loadable (modules.dep of 6.1"
    assert any(c.startswith(f"edt: {fq_note}") for c in first["capabilities"]), first["capabilities"]
    # The first reconcile builds mq + one sch_fq per queue + the stamper; the kernel loaded sch_fq itself.
    assert not first["failed"] and first["changes"] > 0, first
    assert first["kernel_changes"][0].startswith("set root mq qdisc 7365: on edt0"), first["kernel_changes"]
    assert sum(c.startswith("set fq qdisc ") for c in first["kernel_changes"]) == TX_QUEUES, first["kernel_changes"]
    assert any(c.startswith("set edt stamper shpe_") for c in first["kernel_changes"]), first["kernel_changes"]
    assert lc["sch_fq_loaded_after_apply"] and lc["tc_qdisc"].count(" fq ") == TX_QUEUES, lc["tc_qdisc"]
    # The controller steps: rates read through the pins moved from the planned initial ones while bronze sent.
    assert lc["rates_during"] and lc["rates_during"] != lc["rates_initial"], lc
    assert lc["stamper_bytes"]["bronze"] > 0, lc["stamper_bytes"]
    limit_mbit = BRONZE["limit"] * CAPACITY_MBIT  # bronze alone for bronze_s (+ the horizon): at most its limit
    assert 0 < lc["bronze_bytes"] <= allowed_bytes(limit_mbit, lc["bronze_s"] + HORIZON_S), lc
    assert lc["first_rc"] == 0, lc
    # A restarted daemon, still without CAP_SYS_ADMIN, adopts everything through the pins: zero writes.
    assert second["changes"] == 0 and second["kernel_changes"] == [] and not second["failed"], second
    assert lc["prog_id_second"] == lc["prog_id_first"] != 0, lc
    assert lc["second_rc"] == 0, lc


def test_the_probes_question_to_debians_kernel_finds_sch_fq_and_changes_nothing_on_lo(edt):
    ka = edt["kind_ask"]
    assert ka["answers"]["fq"][0] == "present" and "EINVAL" in ka["answers"]["fq"][1], ka
    assert ka["answers"]["htb"][0] == "present", ka
    # tc -j shows lo's default root (noqueue, handle 0) as nothing on 6.1's iproute2: before == after, no 7370:.
    assert ka["lo_before"] == ka["lo_after"] and "7370" not in ka["lo_after"] and '"fq"' not in ka["lo_after"], ka


def test_a_capped_pods_key_sits_under_its_tenant_in_the_stamper_and_a_resync_writes_nothing(edt):
    """tests/kernel/edt_pods_guest.py: the engine reconciles two pods of gold given as the watcher gives them."""
    pc = edt["pod_caps"]
    assert not (pc["first_failed"] or pc["errors"] or pc["problems"]), pc
    pod = pc["pod"]
    assert pod["ref"] == "gold/capped" and pod["parent"] == pc["gold_key"] and pod["rate_bps"] == 8_000_000
    # The stamper's maps hold exactly that pod's key under gold (the uncapped mate has none), at its cap.
    assert {int(k): v for k, v in pc["parents"].items()} == {pod["key"]: pc["gold_key"]}, pc
    assert abs(pc["pod_map_rate_bps"] - 8_000_000) < 1000, pc
    assert pc["resync_changes"] == 0, pc
    # The map classifier sent the pod's packets (by its address) to its own key: counted there and under gold.
    capped, gold = pc["stamper"]["capped"], pc["stamper"]["gold"]
    assert capped and capped[0] > 0 and gold and gold[0] >= capped[0], pc["stamper"]


def test_the_capped_pod_is_held_to_its_cap_while_its_tenant_mate_borrows_and_bronze_keeps_its_share(edt):
    pc = edt["pod_caps"]
    total_s = sending_s(pc, pc["alone_s"] + pc["both_s"], "capped")
    # The pod's own clock spaces its departures at its cap: what got through by the end of the senders
    # (+ the horizon) is at most its cap over that time, plus one datagram, however slow the guest is.
    assert 0 < pc["capped_bytes"] <= allowed_bytes(pc["cap_mbit"], total_s + HORIZON_S), pc
    # The uncapped mate borrows what the cap leaves: it moved more than the capped pod.
    assert pc["mate_bytes"] > pc["capped_bytes"], pc
    # With the capped pod in place, the isolation bounds of the run above: bronze under its limit, the whole
    # under the capacity (3 % for the controller's first step after bronze wakes), and bronze keeps at least
    # half its guaranteed share of what crossed the link once it sent (loose: a slow guest that fills nothing
    # shares by what each sends, 1/3 each; a fast one gives bronze its 20 %).
    both = pc["both_bytes"]
    end = pc["alone_s"] + pc["both_s"]
    bronze_s = sending_s(pc, end, "bronze") - pc["alone_s"]
    both_s = sending_s(pc, end, "capped", "mate", "bronze") - pc["alone_s"]
    assert 0 < pc["bronze_bytes"] <= allowed_bytes(BRONZE["limit"] * CAPACITY_MBIT, bronze_s + HORIZON_S), pc
    assert sum(both.values()) <= 1.03 * allowed_bytes(CAPACITY_MBIT, both_s + HORIZON_S, 3), pc
    assert both["bronze"] >= 0.5 * BRONZE["g"] * sum(both.values()), pc
