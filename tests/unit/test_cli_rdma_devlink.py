"""``shaperd rdma devlink``: the plan on a fixture sysfs tree, and this host's kernel (no devlink family)."""

from __future__ import annotations

import json

import pytest
import structlog

from shaperd.cli.main import main
from shaperd.kernel import devlink as nl

from ..rdma_fixture import Node

CFG = """
tenants:
  - {name: a, bandwidthGuarantee: 10Mbps, bandwidthLimit: 100Mbps, priority: 1, rdma: {devices: ["mlx5_2"]}}
"""


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def test_json_shows_the_planned_node_and_this_kernels_answer(tmp_path, capsys):
    n = Node(tmp_path).build()
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    assert main(["rdma", "devlink", "--json", "--config", str(cfg), "--sysfs-root", str(n.sys)]) == 0
    out = json.loads(capsys.readouterr().out)
    (node,) = out["nodes"]
    assert (node["device"], node["node"], node["tx_share_Bps"], node["tx_max_Bps"], node["vfs"]) == (
        "pci/0000:3b:00.0", "shpd_a", 1_250_000, 12_500_000, [0])
    try:
        with nl.DevlinkNl() as d:
            d.family()
        present = True
    except nl.DevlinkAbsent:
        present = False
    assert out["enabled"] is present
    if not present:  # this host: one note, nothing read from the kernel
        assert len(out["notes"]) == 1 and "no devlink family" in out["notes"][0]
        assert node["kernel"] is None and out["devices"] == []
