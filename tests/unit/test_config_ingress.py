"""A tenant's ``ingress`` block: loading, validation with field paths, the ConfigMap and multi-document
forms, the schema, and check-config's tenants table (text and -o json|yaml)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from shaperd.cli.main import main
from shaperd.core import config
from shaperd.core.config import Ingress
from shaperd.core.errors import ConfigError
from tests.unit.test_schema import SCHEMA

MBIT = 10**6


def tenants(*ingress_blocks: str, capacity: str = "1Gbps", reserve: str | None = None) -> str:
    node = f"node: {{capacity: {capacity}{', reserve: ' + reserve if reserve else ''}}}\n"
    rows = "".join(f"  - {{name: t{i}, bandwidthGuarantee: 100Mbps{', ingress: ' + b if b else ''}}}\n"
                   for i, b in enumerate(ingress_blocks))
    return node + "tenants:\n" + rows


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        config.load_text(text, "t.yaml")
    return [str(p) for p in ei.value.problems]


def test_a_valid_block_in_every_form():
    cfg = config.load_text(tenants("{bandwidthGuarantee: 100Mbps, bandwidthLimit: 150Mbps}",
                                   "{bandwidthLimit: 300mbit}", "{bandwidthGuarantee: 50MB/s}", None))
    assert [t.ingress for t in cfg.tenants] == [
        Ingress(guarantee_bps=100 * MBIT, limit_bps=150 * MBIT),
        Ingress(guarantee_bps=None, limit_bps=300 * MBIT),
        Ingress(guarantee_bps=400 * MBIT, limit_bps=None),
        None,  # no block: its inbound traffic is not shaped
    ]


def test_the_ingress_block_is_independent_of_the_egress_sums():
    """Egress guarantees already fill the capacity; the ingress guarantees are their own sum."""
    text = ("node: {capacity: 1Gbps}\ntenants:\n"
            "  - {name: a, bandwidthGuarantee: 600Mbps, ingress: {bandwidthGuarantee: 400Mbps}}\n"
            "  - {name: b, bandwidthGuarantee: 380Mbps, ingress: {bandwidthGuarantee: 500Mbps}}\n")
    cfg = config.load_text(text)
    assert [t.ingress.guarantee_bps for t in cfg.tenants] == [400 * MBIT, 500 * MBIT]


@pytest.mark.parametrize("block, expected", [
    ("{bandwidthLimt: 150Mbps}", "tenants[0].ingress.bandwidthLimt: unknown key; expected one of bandwidthGuarantee, "
                                 "bandwidthLimit"),
    ("{}", "tenants[0].ingress: expected bandwidthGuarantee and/or bandwidthLimit"),
    ("null", "tenants[0].ingress: expected bandwidthGuarantee and/or bandwidthLimit"),
    ("{bandwidthLimit: null}", "tenants[0].ingress: expected bandwidthGuarantee and/or bandwidthLimit"),
    ("150Mbps", "tenants[0].ingress: expected a mapping, got str"),
    ("[150Mbps]", "tenants[0].ingress: expected a mapping, got list"),
    ("{bandwidthGuarantee: 200Mbps, bandwidthLimit: 150Mbps}",
     "tenants[0].ingress.bandwidthGuarantee: guarantee 200Mbps is above the limit 150Mbps; expected guarantee <= limit"),
    ("{bandwidthLimit: 2Gbps}", "tenants[0].ingress.bandwidthLimit: limit 2Gbps is above node.capacity 1Gbps"),
    ("{bandwidthLimit: 150mbps}", "tenants[0].ingress.bandwidthLimit: '150mbps' is ambiguous"),
    ("{bandwidthLimit: 150}", "tenants[0].ingress.bandwidthLimit: expected a rate string"),
    ("{bandwidthGuarantee: 0bps}", "tenants[0].ingress.bandwidthGuarantee: '0bps': a rate must be above zero"),
])
def test_bad_blocks_name_the_field(block, expected):
    found = problems(tenants(block))
    assert any(expected in p for p in found), found


def test_the_ingress_guarantees_and_the_reserve_must_fit_in_the_capacity():
    found = problems(tenants("{bandwidthGuarantee: 600Mbps}", "{bandwidthGuarantee: 400Mbps}"))
    assert found == ["tenants[].ingress.bandwidthGuarantee: the sum of ingress guarantees 1Gbps plus the default "
                     "reserve (1 % of capacity) 10Mbps is above node.capacity 1Gbps; expected at most the capacity"]
    found = problems(tenants("{bandwidthGuarantee: 500Mbps}", "{bandwidthGuarantee: 400Mbps}", reserve="200Mbps"))
    assert len(found) == 1 and "plus node.reserve 200Mbps" in found[0]
    # Exactly full is fine.
    config.load_text(tenants("{bandwidthGuarantee: 590Mbps}", "{bandwidthGuarantee: 400Mbps}"))


def test_without_node_capacity_the_sums_wait_for_the_link_speed():
    cfg = config.load_text("tenants:\n  - {name: a, bandwidthGuarantee: 1Gbps, ingress: {bandwidthGuarantee: 900Gbps}}\n")
    assert cfg.tenants[0].ingress.guarantee_bps == 900 * 10**9  # checked per device by the ingress planner


def test_every_problem_at_once_and_the_other_tenants_still_named():
    found = problems(tenants("{bandwidthGuarantee: 2Gbps, bandwidthLimit: 1Gbps, extra: 1}", "{}"))
    assert any(p.startswith("tenants[0].ingress.extra: unknown key") for p in found), found
    assert any(p.startswith("tenants[0].ingress.bandwidthGuarantee: guarantee 2Gbps") for p in found), found
    assert any(p.startswith("tenants[1].ingress: expected") for p in found), found


CONFIGMAP = """apiVersion: v1
kind: ConfigMap
metadata: {name: shaperd-tenants, namespace: kube-system}
data:
  traffic-shaping.yaml: |
    node: {capacity: 1Gbps}
    tenants:
      - {name: tenant-a, bandwidthGuarantee: 200Mbps, ingress: {bandwidthLimit: 150Mbps}}
"""
CNP = """apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: kube-system}
spec:
  endpointSelector: {matchLabels: {training-tenant: tenant-a}}
  egress: [{toCIDR: [198.18.0.0/16], bandwidth: 100Mbps}]
"""


def test_a_configmap_manifest_carries_the_block():
    cfg = config.load_text(CONFIGMAP)
    assert cfg.tenant("tenant-a").ingress == Ingress(limit_bps=150 * MBIT)


def test_a_multi_document_file_carries_the_block_beside_a_policy():
    cfg = config.load_text(CONFIGMAP + "---\n" + CNP)
    a = cfg.tenant("tenant-a")
    assert a.ingress == Ingress(limit_bps=150 * MBIT)
    assert [d.limit_bps for d in a.destinations] == [100 * MBIT]  # the policy's scope, the block kept


def test_a_bad_block_in_a_set_names_the_document_and_the_field():
    bad = CONFIGMAP.replace("{bandwidthLimit: 150Mbps}", "{bandwidthLimit: 5Gbps}")
    found = problems(bad + "---\n" + CNP)
    assert any(p.startswith("document 1 (ConfigMap kube-system/shaperd-tenants) data.traffic-shaping.yaml:"
                            "tenants[0].ingress.bandwidthLimit: limit 5Gbps is above node.capacity") for p in found), found
    found = problems(bad)  # a single ConfigMap document: the key's path, as before
    assert any("data.traffic-shaping.yaml:tenants[0].ingress.bandwidthLimit" in p for p in found), found


def test_the_schema_accepts_the_block_and_rejects_what_the_loader_rejects():
    good = yaml.safe_load(tenants("{bandwidthGuarantee: 100Mbps, bandwidthLimit: 150Mbps}", "{bandwidthLimit: 1Gbps}"))
    jsonschema.validate(good, SCHEMA)
    for block in ("{}", "{bandwidthLimt: 150Mbps}", "{bandwidthLimit: 150mbps}", "{bandwidthLimit: 150}", "150Mbps"):
        doc = yaml.safe_load(tenants(block))
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, SCHEMA)
        with pytest.raises(ConfigError):
            config.from_dict(doc)


def test_the_schema_names_the_keys_the_loader_accepts():
    from shaperd.core.config import validate

    tenant = SCHEMA["properties"]["tenants"]["items"]["properties"]
    assert set(tenant["ingress"]["properties"]) == validate._INGRESS_KEYS


CHECK = tenants("{bandwidthGuarantee: 100Mbps, bandwidthLimit: 150Mbps}", "{bandwidthLimit: 300Mbps}",
                "{bandwidthGuarantee: 50Mbps}", None)


def test_check_config_shows_ingress_in_the_tenants_table(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text(CHECK)
    assert main(["check-config", str(f)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0]
    assert head.split()[:7] == ["TENANT", "GUARANTEE", "LIMIT", "INGRESS", "GUARANTEE", "INGRESS", "LIMIT"]
    col = head.index("INGRESS GUARANTEE"), head.index("INGRESS LIMIT"), head.index("PRIORITY")

    def cells(line):
        return line[col[0]:col[1]].strip(), line[col[1]:col[2]].strip()

    rows = {l.split()[0]: cells(l) for l in lines[1:5]}
    assert rows == {"t0": ("100Mbps", "150Mbps"), "t1": ("none", "300Mbps"), "t2": ("50Mbps", "capacity"),
                    "t3": ("-", "-")}


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_check_config_machine_output_carries_ingress_in_bits_per_second(tmp_path, capsys, fmt):
    f = tmp_path / "t.yaml"
    f.write_text(CHECK)
    assert main(["check-config", str(f), "-o", fmt]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert [t["ingress"] for t in doc["tenants"]] == [
        {"guarantee_bps": 100 * MBIT, "limit_bps": 150 * MBIT}, {"guarantee_bps": None, "limit_bps": 300 * MBIT},
        {"guarantee_bps": 50 * MBIT, "limit_bps": None}, None]


def test_check_config_refuses_a_bad_block_naming_the_field(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text(tenants("{bandwidthLimit: 2Gbps}"))
    assert main(["check-config", str(f)]) == 2
    assert "tenants[0].ingress.bandwidthLimit: limit 2Gbps is above node.capacity 1Gbps" in capsys.readouterr().err
