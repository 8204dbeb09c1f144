"""A tenant's NCCL environment from the RDMA plan, and the forms it is printed in (shell, JSON, ConfigMap, env file).

The fixture node (tests/rdma_fixture.py): mlx5_0 a RoCE PF whose RoCE v2 GIDs
are at 1 (fe80::) and 3 (IPv4-mapped), its VF mlx5_2 with one RoCE v2 GID at
0, and mlx5_1 an InfiniBand HCA.
"""

from __future__ import annotations

import json
import subprocess

import yaml

from shaperd.core import config
from shaperd.rdma import nccl
from shaperd.rdma import plan as rp
from shaperd.discovery import rdma
from shaperd.core.inventory import Inventory
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..rdma_fixture import Node

CFG = """
tenants:
  - name: ib
    bandwidthGuarantee: 40Gbps
    priority: 100
    rdma: {devices: ["mlx5_1:1"], nccl: {NCCL_IB_TIMEOUT: "22", NCCL_IB_RETRY_CNT: "7"}}
  - name: roce
    bandwidthGuarantee: 20Gbps
    priority: 50
    match: {interfaces: [ens1f0, "veth*"]}
    rdma: {devices: ["mlx5_0", "0000:3b:00.2"], serviceLevel: 3, trafficClass: 106}
  - name: pf
    bandwidthGuarantee: 1Gbps
    priority: 40
    rdma: {devices: ["mlx5_3"], nccl: {NCCL_IB_GID_INDEX: "1", NCCL_SOCKET_IFNAME: "=net1"}}
  - name: none
    bandwidthGuarantee: 1Gbps
    priority: 10
    rdma: {nccl: {NCCL_DEBUG: "WARN"}}
"""


def envs(tmp_path, text=CFG, node=True):
    devs, notes = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    cfg = config.load_text(text)
    inv = Inventory(rdma=devs, rdma_notes=notes)
    p = rp.plan(cfg, inv, tenancy(cfg, inv))
    return {t.tenant: nccl.tenant_env(t, node=node) for t in p.tenants}


def test_hca_in_the_exact_match_form_with_ports_sl_tc_and_socket_interface(tmp_path):
    e = envs(tmp_path)["roce"]
    # One leading "=": NCCL compares every token as an exact name, so mlx5_1 never also selects mlx5_10.
    assert e.values == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_2:1", "NCCL_IB_SL": "3", "NCCL_IB_TC": "106",
                        "NCCL_SOCKET_IFNAME": "=ens1f0"}  # the glob veth* is not an interface name
    # NCCL takes one GID index for all devices: mlx5_0's RoCE v2 IPv4 GID is at 3, the VF's only one at 0.
    assert e.notes == ("NCCL_IB_GID_INDEX is not set: the tenant's RoCE ports have their RoCE v2 GID at different "
                       "indexes (mlx5_0:1 at 3, mlx5_2:1 at 0); NCCL takes one",)


def test_gid_index_where_known_and_infiniband_gets_no_tc(tmp_path):
    text = CFG.replace('"mlx5_0", "0000:3b:00.2"', '"mlx5_0:1"')
    e = envs(tmp_path, text)
    assert e["roce"].values["NCCL_IB_GID_INDEX"] == "3" and e["roce"].notes == ()
    ib = e["ib"]
    assert ib.values == {"NCCL_IB_HCA": "=mlx5_1:1", "NCCL_IB_SL": "0",
                         "NCCL_IB_RETRY_CNT": "7", "NCCL_IB_TIMEOUT": "22"}  # passthrough after, sorted
    assert ib.notes == ()


def test_passthrough_wins_over_the_derived_gid_index_and_socket_interface(tmp_path):
    e = envs(tmp_path)["pf"]
    assert e.values["NCCL_IB_HCA"] == "=mlx5_3:1"
    assert e.values["NCCL_IB_GID_INDEX"] == "1" and e.values["NCCL_SOCKET_IFNAME"] == "=net1"


def test_no_device_on_this_node_keeps_sl_tc_and_passthrough_and_says_why_no_hca(tmp_path):
    e = envs(tmp_path)["none"]
    assert e.values == {"NCCL_IB_SL": "3", "NCCL_IB_TC": str((16 << 2) | 2), "NCCL_DEBUG": "WARN"}
    assert len(e.notes) == 1 and e.notes[0].startswith("NCCL_IB_HCA is not set: tenant none holds no RDMA device")


def test_node_independent_env_drops_what_only_this_node_knows(tmp_path):
    e = envs(tmp_path, node=False)
    for t in e.values():
        assert not set(t.values) & set(nccl.NODE_SPECIFIC) and "NCCL_IB_SL" in t.values and "NCCL_IB_TC" in t.values
    assert e["pf"].values == {"NCCL_IB_SL": "2", "NCCL_IB_TC": str((18 << 2) | 2)}
    assert e["ib"].values["NCCL_IB_TIMEOUT"] == "22"


NASTY = {"NCCL_X": "a 'quoted' $HOME `x` \"y\" \\ ;|&", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_2:1", "NCCL_E": ""}


def _sh(script: str, *names: str) -> list[str]:
    """Run a script with sh and print each variable NUL-terminated (an argument list; the script is ours)."""
    show = "; ".join(f"printf '%s\\0' \"${n}\"" for n in names)
    r = subprocess.run(["sh", "-c", script + "\n" + show], capture_output=True, timeout=30, check=True)
    return r.stdout.decode().split("\0")[:-1]


def test_shell_lines_are_export_with_single_quotes_and_round_trip_through_sh():
    env = nccl.NcclEnv("t", dict(NASTY))
    text = nccl.shell(env)
    assert text.splitlines()[1] == "export NCCL_IB_HCA='=mlx5_0:1,mlx5_2:1'"
    assert all(line.startswith("export ") for line in text.splitlines())
    assert _sh(text, *NASTY) == list(NASTY.values())


def test_env_file_has_the_header_notes_as_comments_and_sources_with_set_a(tmp_path):
    env = nccl.NcclEnv("t", dict(NASTY), ("NCCL_IB_GID_INDEX is not set: why",))
    data = nccl.env_file(env)
    lines = data.decode().splitlines()
    assert lines[0] == nccl.header("t") and lines[1] == "# NCCL_IB_GID_INDEX is not set: why"
    assert "NCCL_IB_HCA==mlx5_0:1,mlx5_2:1" in lines  # unquoted where no quote is needed (docker --env-file)
    f = tmp_path / "t.env"
    f.write_bytes(data)
    assert _sh(f"set -a; . '{f}'; set +a; sh -c 'printf \"%s\" \"$NCCL_X\"' > '{tmp_path}/child'", *NASTY) \
        == list(NASTY.values())
    assert (tmp_path / "child").read_text() == NASTY["NCCL_X"]  # exported to a child process
    assert nccl.env_file(env) == data  # deterministic: a reconcile compares bytes


def test_json_and_configmap_carry_the_same_values_as_strings(tmp_path):
    e = envs(tmp_path)["roce"]
    assert json.loads(nccl.json_text(e)) == e.values
    doc = yaml.safe_load(nccl.configmap(e))
    assert doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "shaperd-nccl-roce"
    assert doc["metadata"]["labels"]["shaperd.io/tenant"] == "roce"
    assert doc["data"] == e.values and all(isinstance(v, str) for v in doc["data"].values())


def test_configmap_names_are_dns_subdomains():
    assert nccl.configmap_name("Team_A.x") == "shaperd-nccl-team-a.x"
