"""``shaperd status``: one section per NIC backend (VF rates, devlink rate groups, RoCE DCB), text and JSON.

The fakes are those of the backends' own tests: the fake NIC of the vfrate
tests, the fake devlink device of the devlink tests, the fake DCB client of
the DCB tests, on the mlx5 fixture tree (PF ens1f0 = pci/0000:3b:00.0, VFs
mlx5_2/mlx5_3 = VFs 0/1). Nothing is written.
"""

from __future__ import annotations

import json

import pytest
import structlog

from shaperd.core import config
from shaperd.core.errors import KernelError
from shaperd.kernel import devlink as nl
from shaperd.core.roots import Roots

from ..rdma_fixture import Node
from .test_dcb_plan import FakeDcb
from .test_devlink_backend import PF, FakeDevlink
from .test_vfrate_backend import CFG, FakeNic, Reader


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


@pytest.fixture
def roots(tmp_path):
    node = Node(tmp_path).build()
    return Roots.of(sys=str(node.sys), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))


class nic_status:
    """The three NIC backends' status sections (their spec's ``status``), collected as ``shaperd status`` does."""

    @staticmethod
    def collect(cfg, roots, reader, *, netns=None, vf_kernel=None, open_devlink=None, dcb_client=None) -> dict:
        from shaperd.backends.dcb import status as dcb_status
        from shaperd.backends.devlink import status as devlink_status
        from shaperd.backends.vfrate import status as vf_status
        from shaperd.core.protocol import StatusInput
        from shaperd.engine.reconciler import diff_one
        from shaperd.report import status

        if cfg is None:
            return {}
        inp = StatusInput(config=cfg, config_path=None, roots=roots, netns=netns, diff_one=diff_one)
        out: dict = {}
        for sec in (vf_status.Section(inp, vf_kernel), devlink_status.Section(inp, open_devlink),
                    dcb_status.Section(inp, dcb_client)):
            out.update(status._collect(sec, reader))
        return out

    @staticmethod
    def render(out: dict) -> str:
        from shaperd.backends.dcb import status as dcb_status
        from shaperd.backends.devlink import status as devlink_status
        from shaperd.backends.vfrate import status as vf_status

        return "\n\n".join("\n".join(m.render(out[m.KEY])) for m in (vf_status, devlink_status, dcb_status)
                            if m.KEY in out)


class NoFamily:
    def family(self):
        raise nl.DevlinkAbsent("resolve", "generic netlink family", "devlink", "no devlink family")

    def close(self):
        pass


def sections(roots, cfg_text=CFG, nic=None, devlink=None, dcb_client=None):
    nic = nic or FakeNic("mlx5")
    nic.rates[0] = (5000, 12500)  # VF 0 as planned; VF 1 still at the driver's default
    devlink = devlink if devlink is not None else FakeDevlink(rates=[  # tenant-a's node there, its max not
        nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=1), nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=2),
        nl.RateRow(PF, nl.RATE_TYPE_NODE, node="shpd_tenant-a", tx_share_Bps=1_250_000_000)])
    dcb_client = dcb_client if dcb_client is not None else FakeDcb(["ens1f0"])
    out = nic_status.collect(config.load_text(cfg_text), roots, Reader(), vf_kernel=nic,
                             open_devlink=lambda: devlink, dcb_client=dcb_client)
    json.dumps(out)  # what --json prints
    return out, nic, devlink, dcb_client


def test_each_backend_shows_configured_vs_read_back_in_json_and_text(roots):
    out, nic, devlink, dcb = sections(roots)
    assert list(out) == ["vf_rates", "devlink_rates", "dcb"]
    vfs = {r["vf"]: r for r in out["vf_rates"]["vfs"]}
    assert {v: (r["tenant"], r["min_mbps"], r["max_mbps"], r["reported_min_mbps"], r["reported_max_mbps"],
                r["min_rate_supported"], r["state"]) for v, r in vfs.items()} == {
        0: ("tenant-a", 5000, 12500, 5000, 12500, True, "in sync"),
        1: ("tenant-a", 5000, 12500, 0, 0, True, "out of sync")}
    (node,) = out["devlink_rates"]["nodes"]  # tenant-b holds no VF: no node
    assert (node["tenant"], node["device"], node["node"], node["tx_share_Bps"], node["tx_max_Bps"],
            node["kernel"]) == ("tenant-a", PF, "shpd_tenant-a", 1_250_000_000, 3_125_000_000,
                                {"tx_share_Bps": 1_250_000_000, "tx_max_Bps": 0})
    up = out["dcb"]["netdevs"]["ens1f0"]
    (t,) = up["configured"]["tenants"]
    assert (t["tenant"], t["tc"], t["share_pct"], t["maxrate_kbps"]) == ("tenant-a", 1, 10, 25_000_000)
    assert up["read"]["tc_bw_pct"] == [0] * 8 and up["read"]["maxrate_kbps"] == [0] * 8
    assert [w.split(" ")[:3] for w in up["would_write"]][:2] == [["set", "DCB", "ETS"], ["set", "DCB", "max"]]
    assert nic.writes == [] and devlink.writes == [] and dcb.writes == [], "status wrote"

    text = nic_status.render(out).splitlines()
    assert text[0] == "SR-IOV VF rates (Mbit/s, min/max):"
    assert text[1].split() == ["TENANT", "PF", "VF", "CONFIGURED", "READ", "BACK", "MIN", "RATE", "STATE"]
    assert text[2].split() == ["tenant-a", "ens1f0", "0", "5000/12500", "5000/12500", "yes", "in", "sync"]
    assert text[3].split() == ["tenant-a", "ens1f0", "1", "5000/12500", "0/0", "yes", "out", "of", "sync"]
    i = text.index("devlink rate groups (tx_share/tx_max):")
    assert text[i + 2].split() == ["tenant-a", "pci/0000:3b:00.0/shpd_tenant-a", "10Gbps/25Gbps", "10Gbps/unlimited"]
    assert text[i + 3].startswith("  pending: ") and "shpd_tenant-a" in text[i + 3]
    j = text.index("RoCE DCB (ETS share, max rate per TC):")
    assert text[j + 1] == "  ens1f0:"
    assert text[j + 3].split() == ["tenant-a", "26", "TC1", "10", "%", "25000000", "kbit/s", "0", "%", "unlimited"]
    assert any(l.startswith("    not in effect: set DCB ETS") for l in text[j:])


def test_the_agents_recorded_refusal_of_a_minimum_shows_in_the_vf_section(roots):
    from shaperd.backends.vfrate.backend import VfRateBackend
    from shaperd.engine.reconciler import Reconciler
    from shaperd.core.inventory import Capabilities

    nic = FakeNic("i40e")  # refuses any minimum with EINVAL
    agent = VfRateBackend(writer=None, kernel=nic, state_file=roots.run / "shaperd" / "vfrate-owned.json")
    assert Reconciler(Reader(), [agent], Capabilities(), roots=roots).apply(config.load_text(CFG)).ok
    out = nic_status.collect(config.load_text(CFG), roots, Reader(), vf_kernel=nic, open_devlink=NoFamily,
                             dcb_client=FakeDcb(["ens1f0"]))
    assert [(r["min_mbps"], r["reported_min_mbps"], r["reported_max_mbps"], r["min_rate_supported"], r["reason"],
             r["state"]) for r in out["vf_rates"]["vfs"]] == [(0, 0, 12500, False, "Invalid argument", "in sync")] * 2
    assert "no (Invalid argument)" in nic_status.render(out)


def test_nothing_on_this_node_has_no_key_and_prints_nothing(roots):
    no_rdma = "tenants:\n  - {name: t, bandwidthGuarantee: 1Gbps, priority: 1}\n"
    # No tenant VF, no shaperd rate node in the kernel, and the uplink's driver has no DCB, no tenant on it.
    out, *_ = sections(roots, no_rdma, devlink=FakeDevlink(), dcb_client=FakeDcb([]))
    assert out == {} and nic_status.render(out) == ""
    out, *_ = sections(roots, no_rdma, devlink=NoFamily())  # an uplink with DCB but no tenant: its state only
    assert list(out) == ["dcb"] and "configured" not in out["dcb"]["netdevs"]["ens1f0"]
    out, *_ = sections(roots, devlink=NoFamily())  # VFs planned, but this kernel has no devlink family
    assert "devlink_rates" not in out and "devlink" not in nic_status.render(out)
    assert nic_status.collect(None, roots, Reader()) == {} and nic_status.render({}) == ""


def test_one_backends_read_failing_is_shown_in_its_section_and_the_others_still_show(roots):
    class Broken(FakeDevlink):
        def rates(self):
            raise KernelError("dump", "devlink rate objects", "devlink", "Device or resource busy", 16)

    class Exploding(FakeDcb):
        def get(self, nd):
            raise RuntimeError("socket gone")

    out, *_ = sections(roots, devlink=Broken(), dcb_client=Exploding(["ens1f0"]))
    assert [r["state"] for r in out["vf_rates"]["vfs"]] == ["in sync", "out of sync"]
    (dev,) = out["devlink_rates"]["devices"]
    assert "Device or resource busy" in dev["error"] and out["devlink_rates"]["nodes"][0]["kernel"] is None
    assert out["devlink_rates"]["nodes"][0]["tx_max_Bps"] == 3_125_000_000  # configured still shown
    assert out["dcb"] == {"error": "RuntimeError: socket gone"}
    text = nic_status.render(out)
    assert "SR-IOV VF rates" in text and "error: RuntimeError: socket gone" in text
    assert "Device or resource busy" in text


def test_status_prints_the_sections_after_the_classes_and_rdma_ports_and_in_its_json(roots, tmp_path, monkeypatch,
                                                                                      capsys):
    from shaperd.cli import main as cli
    from shaperd.kernel import rtnl

    from shaperd.backends.dcb import status as dcb_status
    from shaperd.backends.devlink import status as devlink_status
    from shaperd.backends.htb import status as htb_status
    from shaperd.backends.vfrate import status as vf_status

    monkeypatch.setattr(rtnl, "RtnlReader", lambda netns=None, **kw: Reader())
    from shaperd.cli import status as cli_status

    monkeypatch.setattr(cli_status, "_status_degraded", lambda args: None)  # no plan and diff of the host's kernel
    monkeypatch.setattr(htb_status, "sample", lambda reader: {})  # no tc class: the table's empty line
    from shaperd.backends.htb import classifier_status

    monkeypatch.setattr(classifier_status, "collect", lambda reader: {})  # no shaperd HTB root: no section
    from shaperd.backends.edt import status as edt_status

    monkeypatch.setattr(edt_status, "devices", lambda reader: [])  # no edt root: no section, no key
    from shaperd.backends.podingress import status as podingress_status

    monkeypatch.setattr(podingress_status, "sections", lambda inp: [])  # no pod ingress cap: no section, no key
    monkeypatch.setattr(vf_status, "sections", lambda inp: [vf_status.Section(inp, FakeNic("mlx5"))])
    monkeypatch.setattr(devlink_status, "sections", lambda inp: [devlink_status.Section(inp, NoFamily)])
    monkeypatch.setattr(dcb_status, "sections", lambda inp: [dcb_status.Section(inp, FakeDcb(["ens1f0"]))])
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    argv = ["status", "--config", str(cfg), "--sysfs-root", str(roots.sys), "--run-root", str(roots.run),
            "--interval", "0"]
    assert cli.main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["window_s", "classes", "rdma", "vf_rates", "dcb"]  # no devlink family: no key
    assert [r["state"] for r in doc["vf_rates"]["vfs"]] == ["out of sync"] * 2
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    order = [text.index(s) for s in ("(no device carries shaperd's qdisc)", "RDMA ports", "SR-IOV VF rates",
                                     "RoCE DCB")]
    assert order == sorted(order) and "devlink" not in text
