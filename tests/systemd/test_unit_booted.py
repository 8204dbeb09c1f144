"""systemd/shaperd.service under a real systemd 252 as PID 1 (one nspawn boot, tests/systemd/boot.py).

Each test reads what the container's collector recorded: READY and STATUS, the classifier path,
the capability report of the daemon inside the unit against the same report outside the unit's
sandbox, the watchdog, a reload, a stop. Root only (skipped otherwise, with a reason).
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.systemd, pytest.mark.root]

UNIT_TEXT = (__import__("pathlib").Path(__file__).resolve().parents[2] / "systemd" / "shaperd.service").read_text()


def unit_value(key: str) -> str:
    return next(l.split("=", 1)[1] for l in UNIT_TEXT.splitlines() if l.startswith(key + "="))


def inside_report(booted) -> dict:
    started = booted.logs("started")
    assert started, "the daemon logged no 'started' line; its journal:\n" + "\n".join(booted.journal[-40:])
    report = started[0].get("report")
    assert report, f"the 'started' line has no capability report: {started[0]}"
    return report


def test_ready_reached_and_status_names_the_tenants_and_a_reconcile(booted):
    s = booted.step("ready")["show"]
    # Type=notify: ActiveState is "active" only once the daemon sent READY=1.
    assert (s["ActiveState"], s["SubState"]) == ("active", "running"), s
    assert re.search(r"\b2 tenants\b", s["StatusText"]) and "reconcile" in s["StatusText"], s["StatusText"]


def test_the_classifier_path_is_ebpf(booted):
    st = booted.step("status_json")
    doc = st["doc"]
    assert doc is not None, f"shaperd status -o json printed no document: rc {st['rc']}: {st['stderr']}"
    path = doc["classifier"]["sd0"]["path"]
    assert path == "ebpf", f"sd0's classifier path is {path}: {doc['classifier']}; daemon log:\n" + \
        "\n".join(l for l in booted.journal if "bpf" in l.lower())[-3000:]
    # The daemon says the same of itself, and no BPF load was refused.
    said = {l["device"]: l["path"] for l in booted.logs("classifier path")}
    assert said.get("sd0") == "ebpf", said
    assert not [l for l in booted.journal if "load BPF program" in l], [l for l in booted.journal if "BPF" in l]


def test_the_node_supports_the_ebpf_backends_outside_the_sandbox(booted):
    # Guards the comparison below: a node where nothing is supported would make it pass vacuously.
    out = booted.caps_outside
    assert out is not None, "the capability report outside the sandbox (shaperd-test-caps.service) wrote nothing"
    assert out["kernel"]["bpf"] and out["kernel"]["bpf_maps"] and out["backends"]["marks"], out


def test_every_capability_present_outside_the_unit_is_present_inside(booted):
    inside, outside = inside_report(booted), booted.caps_outside
    assert outside is not None, "no capability report from outside the sandbox"
    missing = [f"backend {b}" for b, on in outside["backends"].items() if on and not inside["backends"].get(b)]
    for k, v in outside["kernel"].items():
        if isinstance(v, bool) and v and not inside["kernel"].get(k):
            missing.append(f"kernel {k}")
        elif isinstance(v, list) and set(v) - set(inside["kernel"].get(k, [])):
            missing.append(f"kernel {k} {sorted(set(v) - set(inside['kernel'].get(k, [])))}")
        elif isinstance(v, str) and v and inside["kernel"].get(k) != v:
            missing.append(f"kernel {k}={v} (inside: {inside['kernel'].get(k)!r})")
    assert not missing, (f"the unit's sandbox takes away what the daemon can do outside it: {', '.join(missing)}; "
                         f"inside {inside}, outside {outside}")


def test_the_watchdog_is_fed(booted):
    w = booted.step("watchdog")
    assert w["first"]["WatchdogUSec"] == "30s", w
    assert w["later"]["WatchdogTimestampMonotonic"] != w["first"]["WatchdogTimestampMonotonic"]
    assert not booted.step("journal_all")["watchdog_timeouts"]


def test_a_reload_changes_the_kernels_htb_class(booted):
    r = booted.step("reload")
    ceils = lambda cls: sorted(c.get("ceil") for c in cls if c.get("class") == "htb")  # noqa: E731
    assert "300Mbit" in ceils(r["before"]) and "400Mbit" not in ceils(r["before"]), r["before"]
    assert "400Mbit" in ceils(r["after"]) and "300Mbit" not in ceils(r["after"]), r["after"]
    # The file is also watched (picked up within a second): the reload itself must have been seen.
    assert any(l.get("reason") == "SIGHUP" for l in booted.logs("config loaded")), booted.journal[-20:]


def test_a_stop_leaves_enforcement_in_place(booted):
    s = booted.step("stop")
    assert s["rc"] == 0 and s["show"]["ActiveState"] == "inactive", s
    assert any(q.get("kind") == "htb" and q.get("root") for q in s["qdiscs"]), s["qdiscs"]
    assert sum(1 for c in s["classes"] if c.get("class") == "htb") >= 2, s["classes"]
    assert any("stopped; enforcement left in place" in l for l in booted.journal)


def test_memory_and_tasks_stay_under_the_units_limits_and_are_recorded(booted):
    r = booted.step("resources")
    rss_kib = int(r["VmRSS"].split()[0])
    mem_max = int(r["show"]["MemoryMax"])
    tasks_max = int(r["show"]["TasksMax"])
    assert mem_max == 256 * 2**20 and tasks_max == int(unit_value("TasksMax")), r["show"]
    print(f"\ndaemon under the unit: VmRSS {r['VmRSS']}, VmHWM {r['VmHWM']}, threads {r['Threads']}, "
          f"MemoryCurrent {r['show']['MemoryCurrent']}, TasksCurrent {r['show']['TasksCurrent']}")
    assert rss_kib * 1024 < mem_max // 2 and r["Threads"] < tasks_max // 2, r
