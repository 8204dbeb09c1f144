"""``shaperd rdma env``: the command line on a fixture sysfs tree (exit codes, stdout forms, stderr notes)."""

from __future__ import annotations

import json

import pytest
import structlog
import yaml

from shaperd.cli.main import main

from ..rdma_fixture import Node

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    priority: 100
    rdma: {devices: ["mlx5_1:1", "mlx5_9"], nccl: {NCCL_IB_TIMEOUT: "22"}}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
    rdma: {devices: ["mlx5_0:1", "0000:3b:00.2"], serviceLevel: 3}
  - name: tenant-c
    bandwidthGuarantee: 1Gbps
    priority: 10
"""


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()  # main() pointed structlog at this test's captured stderr, closed after it


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path).build()
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)

    def run(*args):
        return main(["rdma", "env", *args, "--config", str(cfg), "--sysfs-root", str(n.sys)])

    return run


def test_shell_is_the_default_form(node, capsys):
    assert node("tenant-b") == 0
    out, err = capsys.readouterr()
    assert out == ("export NCCL_IB_HCA='=mlx5_0:1,mlx5_2:1'\nexport NCCL_IB_SL='3'\nexport NCCL_IB_TC='98'\n")
    assert "NCCL_IB_GID_INDEX is not set" in err and "mlx5_9" not in err  # another tenant's warning is not shown


def test_json_and_configmap_forms(node, capsys):
    assert node("tenant-a", "-o", "json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"NCCL_IB_HCA": "=mlx5_1:1", "NCCL_IB_SL": "0", "NCCL_IB_TIMEOUT": "22"}
    assert "warning: tenants[0].rdma.devices[1]: mlx5_9 does not exist on this node" in err
    assert node("tenant-a", "-o", "configmap") == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["metadata"]["name"] == "shaperd-nccl-tenant-a" and doc["data"]["NCCL_IB_HCA"] == "=mlx5_1:1"


def test_a_tenant_with_no_device_here_still_gets_sl_tc_and_says_why_no_hca(node, capsys):
    assert node("tenant-c") == 0
    out, err = capsys.readouterr()
    assert out == "export NCCL_IB_SL='2'\nexport NCCL_IB_TC='74'\n"
    assert "note: NCCL_IB_HCA is not set: tenant tenant-c holds no RDMA device on this node" in err


def test_an_unknown_tenant_is_bad_input_and_the_message_lists_the_tenants(node, capsys):
    assert node("tenant-x") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "no tenant 'tenant-x'" in err and "its tenants are: tenant-a, tenant-b, tenant-c" in err


def test_a_bad_tenants_file_is_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [{name: a, bandwidthGuarantee: 1Gbps, rdma: {serviceLevel: 15}}]\n")
    assert main(["rdma", "env", "a", "--config", str(bad), "--sysfs-root", str(tmp_path)]) == 2
    assert "tenants[0].rdma.serviceLevel" in capsys.readouterr().err
