"""The tier's plumbing without a guest: the speed factor, scaled deadlines, the merged result, the progress line.

Pure tests (no QEMU, no root): they run in ``scripts/test --quick`` too, so a broken runner shows
up before the slow tier is booted.
"""

from __future__ import annotations

import json

import pytest

from . import guest_speed, vm


def test_the_factor_scales_every_deadline_and_never_shortens_one(monkeypatch):
    monkeypatch.setenv(guest_speed.ENV, "2.5")
    assert guest_speed.deadline(120.0) == 300.0
    monkeypatch.setenv(guest_speed.ENV, "0.3")  # a guest faster than the reference keeps the quiet deadline
    assert guest_speed.deadline(120.0) == 120.0
    monkeypatch.setenv(guest_speed.ENV, "nonsense")
    assert guest_speed.deadline(60.0) == 60.0
    monkeypatch.delenv(guest_speed.ENV)
    assert guest_speed.deadline(60.0) == 60.0


def test_calibration_is_the_slower_ratio_bounded_both_ways(monkeypatch):
    monkeypatch.setattr(guest_speed, "cpu_workload", lambda: guest_speed.REFERENCE_CPU_S * 3)
    monkeypatch.setattr(guest_speed, "import_workload", lambda: guest_speed.REFERENCE_IMPORT_S * 2)
    assert guest_speed.calibrate()["factor"] == 3.0
    monkeypatch.setattr(guest_speed, "cpu_workload", lambda: guest_speed.REFERENCE_CPU_S / 4)
    monkeypatch.setattr(guest_speed, "import_workload", lambda: guest_speed.REFERENCE_IMPORT_S / 4)
    assert guest_speed.calibrate()["factor"] == 1.0
    monkeypatch.setattr(guest_speed, "import_workload", lambda: guest_speed.REFERENCE_IMPORT_S * 100)
    assert guest_speed.calibrate()["factor"] == guest_speed.MAX_FACTOR


def test_every_guest_program_is_a_module_with_its_own_result_file():
    names = [p.name for p in vm.GUEST_PROGRAMS]
    assert names[0] == "probe" and len(set(names)) == len(names)
    assert len({p.result for p in vm.GUEST_PROGRAMS}) == len(names) and vm.RUNNER_JSON not in names
    for p in vm.GUEST_PROGRAMS:
        assert (vm.ROOT / (p.module.replace(".", "/") + ".py")).is_file(), p
    # The slowest guest's deadlines, all of them, plus 10 min to boot and calibrate, fit the outer deadline.
    assert sum(p.deadline_s for p in vm.GUEST_PROGRAMS) * guest_speed.MAX_FACTOR + 600 <= vm.BOOT_DEADLINE_S


def test_the_result_merges_each_programs_json_and_a_missing_one_is_named(tmp_path, monkeypatch):
    run = vm.GuestRun(0, "", 1.0, "6.1.0-57-amd64", True)

    def fake_boot(argv, rwdirs, deadline_s=vm.BOOT_DEADLINE_S):
        assert argv[1:3] == ["-m", "tests.kernel.guest_main"] and rwdirs == [tmp_path]
        (tmp_path / "result.json").write_text(json.dumps({"uname": "6.1", "steps": {"veth": {"rc": 0}}}))
        (tmp_path / vm.RUNNER_JSON).write_text(json.dumps(
            {"calibration": {"factor": 2.0}, "programs": {"probe": {"rc": 0}}, "done": ["probe"]}))
        return run

    monkeypatch.setattr(vm, "boot", fake_boot)
    got_run, result = vm.probe(tmp_path)
    assert got_run is run and result["calibration"] == {"factor": 2.0}
    for p in vm.GUEST_PROGRAMS[1:]:  # wrote nothing: None, and its step says it did not run
        assert result[p.name] is None and result["steps"][p.name]["rc"] is None


@pytest.mark.parametrize("runner, says", [
    (None, "never started"),
    ({"now": "running edt (deadline 840 s)", "elapsed_s": 700.0, "done": ["probe"], "calibration": {"factor": 2.0}},
     "guest at 700.0 s: running edt (deadline 840 s); done: probe; speed factor 2.0"),
    ({"now": "calibrating", "elapsed_s": 3.0, "done": []}, "calibrating; done: none; speed factor not yet measured"),
])
def test_an_outer_deadline_kill_says_how_far_the_guest_got(tmp_path, runner, says):
    if runner is not None:
        (tmp_path / vm.RUNNER_JSON).write_text(json.dumps(runner))
    assert says in vm.progress(tmp_path)


def test_the_runner_exports_the_factor_runs_each_program_and_records_its_progress(tmp_path, monkeypatch):
    from . import guest_main

    seen = []

    def fake_run(argv, timeout_s=None):
        seen.append((argv[2], timeout_s, guest_speed.factor()))
        return {"argv": argv, "rc": 0, "stdout": "x" * 9000, "stderr": ""}

    monkeypatch.setattr(guest_speed, "calibrate", lambda: {"factor": 2.0, "cpu_s": 1.2, "import_s": 16.0})
    monkeypatch.setattr(guest_main, "run", fake_run)
    monkeypatch.setenv(guest_speed.ENV, "1")  # restored after the test (the runner overwrites it in os.environ)
    assert guest_main.main(str(tmp_path)) == 0
    assert seen == [(p.module, p.deadline_s * 2.0, 2.0) for p in vm.GUEST_PROGRAMS]
    doc = json.loads((tmp_path / vm.RUNNER_JSON).read_text())
    assert doc["done"] == [p.name for p in vm.GUEST_PROGRAMS] and doc["now"] == "finished"
    assert all(len(s["stdout"]) == 4000 for s in doc["programs"].values())  # tails only: runner.json stays small
    assert f"finished; done: {', '.join(p.name for p in vm.GUEST_PROGRAMS)}" in vm.progress(tmp_path)
