"""On a real kernel (a namespace): `shaperd plan` as root probes the kernel as diff and apply do, and
writes nothing to the node while it does: not the uplink, not the bpffs. One-shot commands write log
lines only when asked (--log-json); their problems are plain "shaperd: ..." lines."""

from __future__ import annotations

import json

from .conftest import PY, needs_root
from .test_core import MATCH, NODE, write

pytestmark = needs_root


def tc_state(bed) -> list[str]:
    return [bed.exec("tc", what, "show", "dev", "up0").stdout for what in ("qdisc", "class", "filter")]


def test_plan_as_root_on_a_veth_probes_writes_nothing_and_prints_no_not_root(bed, tmp_path, pinfs):
    cfg = write(tmp_path, NODE + MATCH)
    before, pins_before = tc_state(bed), sorted(p.name for p in pinfs.iterdir())
    r = bed.exec(PY, "-m", "shaperd", "plan", "--config", str(cfg), "--bpffs-root", str(pinfs), check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "not root" not in r.stdout + r.stderr
    assert r.stderr == ""  # no log line (this kernel has no devlink family: that was one), no problem
    notes = [line for line in r.stdout.splitlines() if line.startswith("# note:")]
    # What only a probe can say: the map classifier loads here and its maps would come back through the pins.
    assert any(f"through bpffs pins under {pinfs} (checked, none made)" in n for n in notes), notes
    assert "tc qdisc replace dev up0 root handle 7368: htb" in r.stdout, r.stdout
    assert tc_state(bed) == before  # the uplink as it was
    assert sorted(p.name for p in pinfs.iterdir()) == pins_before  # no shaperd/ directory, no probe pins
    assert pins_before == ["maps.debug", "progs.debug"]  # (the kernel's own files of a fresh bpffs)


def test_diff_probes_the_same_kernel_and_agrees_with_plan(bed, tmp_path, pinfs):
    cfg = write(tmp_path, NODE + MATCH)
    plan = bed.exec(PY, "-m", "shaperd", "plan", "--config", str(cfg), "--bpffs-root", str(pinfs), "-o", "json",
                    check=False)
    diff = bed.exec(PY, "-m", "shaperd", "diff", "--config", str(cfg), "--bpffs-root", str(pinfs), "-o", "json",
                    check=False)
    assert plan.returncode == 0 and diff.returncode == 1, (plan.stderr, diff.stderr)  # nothing applied yet
    planned, pending = json.loads(plan.stdout), json.loads(diff.stdout)
    assert planned["warnings"] == pending["warnings"]
    assert {d["device"] for d in planned["desired"]["htb"]["devices"]} == {t["device"] for t in pending["targets"]
                                                                          if t["backend"] == "htb"} == {"up0"}


def test_one_shot_commands_write_log_lines_only_when_asked(bed, tmp_path):
    cfg = write(tmp_path, NODE + MATCH)
    quiet = bed.exec(PY, "-m", "shaperd", "apply", "--config", str(cfg), check=False)
    assert quiet.returncode == 0, quiet.stderr
    assert "create root qdisc htb 7368: on up0" in quiet.stdout and quiet.stderr == ""
    bed.exec("tc", "qdisc", "del", "dev", "up0", "root")
    asked = bed.exec(PY, "-m", "shaperd", "--log-json", "apply", "--config", str(cfg), check=False)
    assert asked.returncode == 0, asked.stderr
    events = [json.loads(line)["event"] for line in asked.stderr.splitlines()]
    assert "kernel change" in events  # the same apply, its log lines asked for
    bad = write(tmp_path, "tenants: [{name: a}]\n", "bad.yaml")
    r = bed.exec(PY, "-m", "shaperd", "diff", "--config", str(bad), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("shaperd: invalid tenants file ") and "tenants[0].bandwidthGuarantee" in r.stderr
    assert not any(line.startswith("{") for line in r.stderr.splitlines())  # a plain line, not a log record
