"""Multi-document files as sets of Kubernetes objects, and CiliumNetworkPolicy bandwidth as destination scopes."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest

from shaperd.core import config
from shaperd.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "kubeflow-source-design.yaml"

TENANTS_CM = """apiVersion: v1
kind: ConfigMap
metadata: {name: tn, namespace: kubeflow}
data:
  traffic-shaping.yaml: |
    tenants:
      - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
      - {name: tenant-b, bandwidthGuarantee: 2Gbps, priority: 50, match: {podLabels: {team: b}}}
"""


def cnp(labels: str, rule: str, name: str = "p") -> str:
    return f"""apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: {name}, namespace: kubeflow}}
spec:
  endpointSelector: {{matchLabels: {labels}}}
  egress: [{rule}]
"""


def test_the_source_design_block_gives_tenant_a_its_pod_network_cap():
    cfg = config.load_file(SOURCE)
    a, b = cfg.tenant("tenant-a"), cfg.tenant("tenant-b")
    assert [(d.cidrs, d.limit_bps) for d in a.destinations] == [((ipaddress.ip_network("10.244.0.0/16"),), 40 * 10**9)]
    assert a.destinations[0].origin == "CiliumNetworkPolicy kubeflow/tenant-a-bandwidth"
    assert b.destinations == () and cfg.ignored == ()


def test_check_config_prints_the_scope_in_the_normalised_table():
    out = subprocess.run([sys.executable, "-m", "shaperd", "check-config", str(SOURCE)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if "10.244.0.0/16" in l)
    assert line.split()[:3] == ["tenant-a", "40Gbps", "10.244.0.0/16"]


def test_unknown_kinds_are_listed_as_ignored_one_line_each():
    text = TENANTS_CM + "---\napiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\n---\n" \
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\ndata: {a: b}\n"
    cfg = config.load_text(text)
    assert len(cfg.tenants) == 2
    assert cfg.ignored == ("document 2: Service x/s: ignored (a kind shaperd does not read)",
                           "document 3: ConfigMap other: ignored (no key traffic-shaping.yaml)")


def test_two_tenants_files_in_one_set_is_an_error():
    with pytest.raises(ConfigError, match="two tenants files in one set"):
        config.load_text(TENANTS_CM + "---\n" + TENANTS_CM)


def test_a_set_without_a_tenants_file_is_an_error():
    with pytest.raises(ConfigError, match="no tenants file"):
        config.load_text(cnp("{a: b}", "{toCIDR: [10.0.0.0/8], bandwidth: 1Gbps}") + "---\nkind: Service\n")


def test_a_policy_applies_to_the_tenants_whose_pod_labels_it_selects():
    text = (TENANTS_CM + "---\n" + cnp("{'k8s:team': b}", "{toCIDR: [10.0.0.0/8], bandwidth: {egress: 1Gbps}}")
            + "---\n" + cnp("{team: nobody}", "{toCIDR: [10.1.0.0/16], bandwidth: 1Gbps}", name="q"))
    cfg = config.load_text(text)
    assert cfg.tenant("tenant-a").destinations == ()
    assert [d.limit_bps for d in cfg.tenant("tenant-b").destinations] == [10**9]
    assert any("selects no tenant" in line and "kubeflow/q" in line for line in cfg.ignored)


def test_spec_level_bandwidth_and_cidr_sets():
    text = TENANTS_CM + "---\n" + cnp("{training-tenant: tenant-a}", "{toCIDRSet: [{cidr: '2001:db8::/32'}]}").replace(
        "  egress:", "  bandwidth: 3Gbps\n  egress:")
    d = config.load_text(text).tenant("tenant-a").destinations
    assert [(str(d[0].cidrs[0]), d[0].limit_bps)] == [("2001:db8::/32", 3 * 10**9)]


@pytest.mark.parametrize("rule,where", [
    ("{toCIDR: [10.0.0.1/8], bandwidth: 1Gbps}", "spec.egress[0].toCIDR[0]"),
    ("{toCIDR: [10.0.0.0/8], bandwidth: 1gbps}", "spec.egress[0].bandwidth"),
    ("{toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}], bandwidth: 1Gbps}", "except"),
])
def test_bad_policies_name_the_field(rule, where):
    with pytest.raises(ConfigError) as e:
        config.load_text(TENANTS_CM + "---\n" + cnp("{training-tenant: tenant-a}", rule))
    assert where in str(e.value) and "document 2 (CiliumNetworkPolicy kubeflow/p)" in str(e.value)


def test_destinations_in_the_tenants_file():
    cfg = config.from_dict({"tenants": [{"name": "a", "bandwidthGuarantee": "1Gbps", "destinations": [
        {"cidrs": ["10.244.0.0/16", "2001:db8:1::/48"], "bandwidthLimit": "500Mbps"}]}]})
    assert cfg.tenants[0].destinations[0].limit_bps == 500 * 10**6


@pytest.mark.parametrize("dests,where", [
    ([{"cidrs": [], "bandwidthLimit": "1Gbps"}], "destinations[0].cidrs"),
    ([{"cidrs": ["10.0.0.0/8"]}], "destinations[0].bandwidthLimit"),
    ([{"cidrs": ["10.0.0.0/8"], "bandwidthLimit": "1Gbps", "colour": 1}], "destinations[0].colour"),
    ([{"cidrs": ["10.0.0.0/8"], "bandwidthLimit": "1Gbps"}, {"cidrs": ["10.0.0.0/8"], "bandwidthLimit": "2Gbps"}],
     "destinations[1].cidrs[0]"),
])
def test_bad_destinations_name_the_field(dests, where):
    with pytest.raises(ConfigError) as e:
        config.from_dict({"tenants": [{"name": "a", "bandwidthGuarantee": "1Gbps", "destinations": dests}]})
    assert f"tenants[0].{where}" in str(e.value)


def test_a_policy_scoping_a_prefix_the_file_already_scopes_is_an_error():
    text = TENANTS_CM.replace("priority: 100}", "priority: 100, destinations: [{cidrs: [10.0.0.0/8], "
                              "bandwidthLimit: 1Gbps}]}") + "---\n" + cnp("{training-tenant: tenant-a}",
                                                                         "{toCIDR: [10.0.0.0/8], bandwidth: 2Gbps}")
    with pytest.raises(ConfigError, match="already scoped"):
        config.load_text(text)


def test_a_single_document_keeps_the_old_messages():
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load_text("tenants: [\n")
