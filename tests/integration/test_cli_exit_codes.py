"""On a real kernel (a namespace): diff's exit codes follow kubectl diff, and teardown --dry-run sends nothing."""

from __future__ import annotations

import json

import yaml

from .conftest import needs_root
from .test_core import MATCH, NODE, write

pytestmark = needs_root


def tc_state(bed) -> list[str]:
    return [bed.exec("tc", what, "show", "dev", "up0").stdout for what in ("qdisc", "class", "filter")]


def test_diff_is_1_while_changes_are_pending_and_0_in_sync(bed, tmp_path):
    cfg = write(tmp_path, NODE + MATCH)
    r = bed.shaperd("diff", "--config", str(cfg))
    assert r.returncode == 1, (r.stdout, r.stderr)  # nothing applied yet: everything pending
    assert "would " in r.stdout
    assert bed.shaperd("apply", "--config", str(cfg)).returncode == 0
    r = bed.shaperd("diff", "--config", str(cfg), "-o", "json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["in_sync"] is True and doc["changes"] == 0
    changed = write(tmp_path, NODE + MATCH.replace("bandwidthGuarantee: 40Gbps", "bandwidthGuarantee: 30Gbps"), "b.yaml")
    r = bed.shaperd("diff", "--config", str(changed), "-o", "yaml")
    assert r.returncode == 1, (r.stdout, r.stderr)


def test_teardown_dry_run_prints_the_removal_and_leaves_the_kernel_as_it_was(bed, tmp_path):
    cfg = write(tmp_path, NODE + MATCH)
    assert bed.shaperd("apply", "--config", str(cfg)).returncode == 0
    before = tc_state(bed)
    assert "7368:" in before[0]
    r = bed.shaperd("teardown", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would delete root qdisc htb 7368: on up0" in r.stdout
    r = bed.shaperd("teardown", "--dry-run", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["dry_run"] is True and doc["changes"] >= 1
    assert tc_state(bed) == before  # not a byte changed: no qdisc, class or filter removed
    assert bed.shaperd("diff", "--config", str(cfg)).returncode == 0  # still in sync
    assert bed.shaperd("teardown").returncode == 0  # the real one removes it
    assert "7368:" not in tc_state(bed)[0]


def test_apply_json_says_what_it_wrote_then_that_nothing_was_left_to_write(bed, tmp_path):
    cfg = write(tmp_path, NODE + MATCH)
    r = bed.shaperd("apply", "--config", str(cfg), "-o", "json", "--log-level", "error")
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)  # stdout is the one object, nothing else
    assert doc["ok"] is True and doc["exit_code"] == 0 and doc["changes"] >= 1
    assert any("7368:" in op for t in doc["targets"] for op in t["ops"])
    assert "7368:" in tc_state(bed)[0]
    r = bed.shaperd("apply", "-o", "yaml", "--config", str(cfg))
    assert r.returncode == 0, (r.stdout, r.stderr)
    again = yaml.safe_load(r.stdout)
    assert again["changes"] == 0 and all(t["ops"] == [] for t in again["targets"])
    bad = write(tmp_path, "tenants: [{name: a}]\n", "bad.yaml")
    r = bed.shaperd("apply", "--config", str(bad), "-o", "json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["problems"][0]["path"] == "tenants[0].bandwidthGuarantee"
