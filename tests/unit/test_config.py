"""Tenants file loading and validation (pure): every bad input names its field."""

from pathlib import Path

import pytest

from shaperd.core import config
from shaperd.core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        config.load_text(text, "t.yaml")
    return [str(p) for p in ei.value.problems]


def test_source_design_file_loads_unchanged():
    cfg = config.load_file(EXAMPLES / "source-design.yaml")
    assert [(t.name, t.guarantee_bps, t.limit_bps, t.priority) for t in cfg.tenants] == [
        ("tenant-a", 40 * 10**9, 60 * 10**9, 100),
        ("tenant-b", 20 * 10**9, 40 * 10**9, 50),
    ]
    assert cfg.tenants[0].effective_pod_labels() == {"training-tenant": "tenant-a"}


def test_configmap_manifest_gives_the_same_config():
    a = config.load_file(EXAMPLES / "source-design.yaml")
    b = config.load_file(EXAMPLES / "configmap.yaml")
    assert a.tenants == b.tenants and a.node == b.node


def test_full_example_loads_every_key():
    cfg = config.load_file(EXAMPLES / "full.yaml")
    a = cfg.tenant("tenant-a")
    assert cfg.node.capacity_bps == 100 * 10**9 and cfg.node.reserve_bps == 10**9
    assert [str(c) for c in a.match.cidrs] == ["198.18.0.0/24", "2001:db8:a::/64"]
    assert a.match.interfaces == ("vetha*",) and a.match.namespaces == ("team-a",)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps, colour: red}\n", "tenants[0].colour: unknown key"),
        ("nodes: {}\ntenants:\n- {name: a, bandwidthGuarantee: 1Gbps}\n", "nodes: unknown key"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps}\n- {name: a, bandwidthGuarantee: 1Gbps}\n",
         "tenants[1].name: duplicate tenant name 'a'"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 40gbps}\n", "tenants[0].bandwidthGuarantee: '40gbps' is ambiguous"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 2Gbps}\n",
         "tenants[0].bandwidthGuarantee: guarantee 4Gbps is above the limit 2Gbps"),
        ("node: {capacity: 10Gbps}\ntenants:\n- {name: a, bandwidthGuarantee: 1Gbps, bandwidthLimit: 20Gbps}\n",
         "tenants[0].bandwidthLimit: limit 20Gbps is above node.capacity 10Gbps"),
        ("node: {capacity: 10Gbps}\ntenants:\n- {name: a, bandwidthGuarantee: 6Gbps}\n- {name: b, bandwidthGuarantee: 4Gbps}\n",
         "tenants: the sum of guarantees 10Gbps plus the default reserve"),
        ("node: {capacity: 10Gbps, reserve: 2Gbps}\ntenants:\n- {name: a, bandwidthGuarantee: 9Gbps}\n",
         "plus node.reserve 2Gbps is above node.capacity 10Gbps"),
        ("tenants:\n- {name: a}\n", "tenants[0].bandwidthGuarantee: required"),
        ("tenants:\n- {name: 'a b', bandwidthGuarantee: 1Gbps}\n", "tenants[0].name: required; expected 1-63"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps, priority: high}\n", "tenants[0].priority: expected a whole number"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps, match: {cidrs: [198.18.0.1/24]}}\n",
         "tenants[0].match.cidrs[0]: expected an IPv4 or IPv6 prefix"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps, match: {cidrs: [198.18.0.0/24]}}\n"
         "- {name: b, bandwidthGuarantee: 1Gbps, match: {cidrs: [198.18.0.0/24]}}\n",
         "tenants[1].match.cidrs: 198.18.0.0/24 is also claimed by tenant 'a'"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps, match: {podLabels: {x: 1}}}\n", "tenants[0].match.podLabels"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps, match: {interfaces: [averyveryverylongname0]}}\n",
         "tenants[0].match.interfaces[0]"),
        ("node: {takeOver: yes please}\ntenants:\n- {name: a, bandwidthGuarantee: 1Gbps}\n", "node.takeOver: expected true or false"),
        ("tenants: []\n", "tenants: required"),
        ("just a string\n", "expected a mapping"),
        ("tenants:\n- {name: a, bandwidthGuarantee: 1Gbps}\ntenants: []\n", "duplicate key 'tenants'"),
        ("tenants: [\n", "not valid YAML"),
        ("kind: ConfigMap\ndata: {}\n", "data: a ConfigMap needs the key 'traffic-shaping.yaml'"),
        ("kind: ConfigMap\ndata:\n  traffic-shaping.yaml: |\n    tenants:\n    - {name: a, bandwidthGuarantee: 1Gbs}\n",
         "data.traffic-shaping.yaml:tenants[0].bandwidthGuarantee"),
    ],
)
def test_bad_input_names_the_field(text, expected):
    found = problems(text)
    assert any(expected in p for p in found), found


def test_all_problems_are_reported_at_once():
    found = problems(
        "node: {capacity: 10Gbps, foo: 1}\n"
        "tenants:\n"
        "- {name: a, bandwidthGuarantee: 6Gbps, bandwidthLimit: 5Gbps, priority: x}\n"
        "- {name: b, bandwidthGuarantee: 1Gbps, bandwidthLimit: 20Gbps}\n"
    )
    assert len(found) == 4, found
    assert any(p.startswith("tenants[1].bandwidthLimit") for p in found)


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        config.load_file(tmp_path / "missing.yaml")
