"""The tenants file's bounds (shaperd/core/config/limits.py): size, expanded YAML nodes, tenant count."""

from __future__ import annotations

import os
import resource
import time

import pytest

from shaperd.core.config import limits as config_limits
from shaperd.core.config import yamlbuild
from shaperd.core.ids import assign_minors
from shaperd.core.config import from_dict, load_file, load_text
from shaperd.core.errors import ConfigError

GOOD = "node: {interfaces: [eth0], capacity: 10Gbps}\ntenants:\n  - {name: a, bandwidthGuarantee: 1Gbps}\n"


def laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        refs = ",".join(f"*a{i - 1}" for _ in range(9))
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"tenants: *a{levels}")
    return "\n".join(lines) + "\n"


def test_max_tenants_is_derived_from_the_htb_minor_range():
    # 0x10..0xFFF0 less the root major 0x7368, which assign_minors skips.
    assert config_limits.MAX_TENANTS == 0xFFF0 - 0x10 + 1 - 1 == 65504


def test_assign_minors_fills_exactly_max_tenants_distinct_minors():
    names = [f"t{i}" for i in range(config_limits.MAX_TENANTS)]
    minors = assign_minors(names)
    assert len(set(minors.values())) == config_limits.MAX_TENANTS
    assert 0x7368 not in minors.values()


def test_one_tenant_too_many_is_refused_with_the_number_before_validating_each():
    doc = {"node": {"interfaces": ["eth0"]},
           "tenants": [{"name": f"t{i}", "bandwidthGuarantee": "1Mbps"} for i in range(config_limits.MAX_TENANTS + 1)]}
    t = time.monotonic()
    with pytest.raises(ConfigError) as e:
        from_dict(doc)
    assert time.monotonic() - t < 5  # validating 65,505 tenants one by one takes far longer on this machine
    msg = str(e.value)
    assert "65,505 tenants" in msg and "limit of 65,504" in msg
    assert len(e.value.problems) == 1


def test_billion_laughs_is_refused_while_composing(tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_text(laughs())
    assert time.monotonic() - t < 2
    assert "2,000,000 YAML nodes" in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024  # KiB


def test_few_aliases_within_the_budget_still_load():
    text = ("node: {interfaces: [eth0], capacity: 10Gbps}\n"
        "tenants:\n"
        "  - {name: a, bandwidthGuarantee: 1Gbps, match: &m {namespaces: [team-a]}}\n"
        "  - {name: b, bandwidthGuarantee: 1Gbps, match: *m}\n")
    cfg = load_text(text)
    assert [t.match.namespaces for t in cfg.tenants] == [("team-a",), ("team-a",)]


def test_budget_counts_alias_subtrees(monkeypatch):
    # The anchored list is 5 nodes; three aliases of it are charged 15, so the document is 25 nodes expanded
    # (7 counted once): a budget of 20 trips, 40 does not.
    monkeypatch.setattr(yamlbuild.EventBuilder, "max_yaml_nodes", 20)
    with pytest.raises(ConfigError, match="YAML nodes"):
        load_text("a: &a [1, 2, 3, 4]\nb: [*a, *a, *a]\n")
    monkeypatch.setattr(yamlbuild.EventBuilder, "max_yaml_nodes", 40)
    with pytest.raises(ConfigError, match="expected a mapping with a 'tenants'|tenants"):
        load_text("a: &a [1, 2, 3, 4]\nb: [*a, *a, *a]\n")  # within budget: now an ordinary validation error


def test_a_100_mb_file_is_refused_from_its_size_without_reading(tmp_path):
    p = tmp_path / "big.yaml"
    with open(p, "wb") as f:
        f.truncate(100 * 2**20)  # sparse: no 100 MB written
    t = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_file(p)
    assert time.monotonic() - t < 1
    assert "104,857,600 bytes" in str(e.value) and "limit of 8,388,608" in str(e.value)


def test_file_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_bytes(GOOD.encode() + b"#" * (config_limits.MAX_FILE_BYTES - len(GOOD)))
    assert len(config_limits.read_capped(p)) == config_limits.MAX_FILE_BYTES
    with open(p, "ab") as f:
        f.write(b"#")
    with pytest.raises(ConfigError, match="8,388,609 bytes"):
        config_limits.read_capped(p)


def test_load_text_refuses_oversized_text():
    with pytest.raises(ConfigError, match="above the limit"):
        load_text(GOOD + "#" * config_limits.MAX_FILE_BYTES)


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_file(tmp_path / "missing.yaml")
    assert not os.path.exists(tmp_path / "missing.yaml")


def test_deep_nesting_is_refused_not_a_recursion_error():
    for text in ("[" * 5000 + "]" * 5000, "a: " + "[" * 100000, "{" * 3000 + "}" * 3000):
        with pytest.raises(ConfigError, match="nested more than 64 deep"):
            load_text(text)
    with pytest.raises(ConfigError, match="x: unknown key"):  # deep but within the cap: ordinary validation
        load_text("x: " + "[" * 60 + "]" * 60 + "\n" + GOOD)


def test_unhashable_key_is_a_config_error():
    with pytest.raises(ConfigError, match="unhashable key"):
        load_text("? []\n")
