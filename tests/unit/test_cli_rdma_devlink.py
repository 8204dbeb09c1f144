"""``shaperd rdma devlink``: the plan on a fixture sysfs tree, and what recorded kernels answered (tests/fake_netlink.py)."""

from __future__ import annotations

import json

import pytest
import structlog

from shaperd.cli.main import main
from shaperd.kernel import devlink as nl

from ..fake_netlink import FakeKernel
from ..rdma_fixture import Node
from .test_devlink_nl import exchanges as devlink_exchanges

CFG = """
tenants:
  - {name: a, bandwidthGuarantee: 10Mbps, bandwidthLimit: 100Mbps, priority: 1, rdma: {devices: ["mlx5_2"]}}
"""


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def _planned(tmp_path, capsys) -> tuple[dict, dict]:
    n = Node(tmp_path).build()
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    assert main(["rdma", "devlink", "--json", "--config", str(cfg), "--sysfs-root", str(n.sys)]) == 0
    out = json.loads(capsys.readouterr().out)
    (node,) = out["nodes"]
    assert (node["device"], node["node"], node["tx_share_Bps"], node["tx_max_Bps"], node["vfs"]) == (
        "pci/0000:3b:00.0", "shpd_a", 1_250_000, 12_500_000, [0])
    return out, node


def test_json_shows_the_planned_node_and_that_a_kernel_without_devlink_was_not_read(tmp_path, capsys, monkeypatch):
    """The fake kernel answers the family lookup with the recorded ENOENT (fixtures/devlink/family_absent.strace)."""
    kernel = FakeKernel().install(monkeypatch)
    out, node = _planned(tmp_path, capsys)
    assert out["enabled"] is False
    assert len(out["notes"]) == 1 and "no devlink family" in out["notes"][0]
    assert node["kernel"] is None and out["devices"] == []
    assert {(r.protocol, r.type) for r in kernel.requests} == {(16, 0x10)} and kernel.unanswered == []


def test_json_on_a_kernel_with_devlink_and_no_device(tmp_path, capsys, monkeypatch):
    """Debian 6.1's recorded answers: the family, an empty rate dump and an empty port dump."""
    ((_q, family), (_q2, rates)) = devlink_exchanges("rate_show.strace")
    (_q3, _f), (_q4, ports) = devlink_exchanges("port_show.strace")
    kernel = FakeKernel(genl_families={"devlink": family},
                        genl_replies={(0x15, nl.CMD_RATE_GET): rates, (0x15, nl.CMD_PORT_GET): ports})
    kernel.install(monkeypatch)
    out, node = _planned(tmp_path, capsys)
    assert out["enabled"] is True and kernel.unanswered == []
    assert (0x15, nl.CMD_RATE_GET) in {(r.type, r.genl_cmd) for r in kernel.requests}
    assert node["kernel"] is None and out["notes"] == []  # nothing of shaperd's in the kernel's (empty) tree
    (dev,) = out["devices"]  # the PF has no rate objects there: left alone, said, nothing pending
    assert dev["pending"] == [] and "has no devlink rate objects" in dev["left_alone"] and dev["error"] is None
