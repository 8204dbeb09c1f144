"""docs/configuration.md's reference is generated from the JSON Schema and is never stale."""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen-config-ref"
SCHEMA = json.loads((ROOT / "schema" / "traffic-shaping.schema.json").read_text())
PAGE = ROOT / "docs" / "configuration.md"


def gen():
    loader = importlib.machinery.SourceFileLoader("gen_config_ref", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gen_config_ref", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_the_reference_section_is_what_the_generator_makes_from_the_schema():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + "\nrun scripts/gen-config-ref and commit docs/configuration.md"


def test_every_schema_key_has_a_row():
    g = gen()
    paths = [row[0] for row in g.rows(SCHEMA)]
    for key in ("node.capacity", "node.markMask", "tenants[].bandwidthGuarantee", "tenants[].match.cidrs",
                "tenants[].rdma.serviceLevel", "tenants[].rdma.nccl"):
        assert key in paths
    section = g.render(SCHEMA)
    assert all(f"| `{p}` |" in section for p in paths)
    req = {row[0]: row[2] for row in g.rows(SCHEMA)}
    assert req["tenants"] == "yes" and req["tenants[].name"] == "yes" and req["node.capacity"] == ""


def test_a_new_schema_key_makes_the_check_fail_until_regenerated(tmp_path):
    """What another engineer's schema change does: --check fails, one run of the script fixes it."""
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["node"]["properties"]["dataplane"] = {
        "enum": ["htb", "edt", "auto"], "default": "auto", "description": "Which data path enforces the tenants."}
    s, page = tmp_path / "schema.json", tmp_path / "configuration.md"
    s.write_text(json.dumps(schema))
    page.write_text(PAGE.read_text())
    args = [sys.executable, str(SCRIPT), "--schema", str(s), "--page", str(page)]
    assert subprocess.run(args + ["--check"], capture_output=True, timeout=60).returncode == 1
    assert subprocess.run(args, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run(args + ["--check"], capture_output=True, timeout=60).returncode == 0
    text = page.read_text()
    assert '| `node.dataplane` | string |  | default `"auto"`; one of `"htb"`, `"edt"`, `"auto"` |' in text
    # only the section changed
    before, after = PAGE.read_text(), text
    g = gen()
    assert before.split(g.BEGIN)[0] == after.split(g.BEGIN)[0] and before.split(g.END)[1] == after.split(g.END)[1]
