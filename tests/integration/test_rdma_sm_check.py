"""The node-side SM-table check end to end, against the real OpenSM on ibsim.

OpenSM programs the fabric from a rendered options file (one sweep). Then
``shaperd rdma status --json`` runs under ``ibsim-run``, the same way the
other ibsim tests run smpquery: umad2sim is LD_PRELOADed into shaperd and
inherited by the smpquery processes kernel/ib_smp.py starts, so they talk to
the simulated HCA Hca1 (SIM_HOST). The inventory comes from a fixture sysfs
tree holding one InfiniBand device, ibsim0 port 1, with the LID the SM gave
Hca1: umad2sim fakes only the directory listing of /sys/class/infiniband,
not its port files (no lid, no link_layer), so the real /sys cannot be used.

* with the tenants file OpenSM's options were rendered from: "verified";
* with a tenants file that implies other tables: a mismatch naming exactly
  the SLs whose VL differs;
* the daemon's checker (in process, the real reader under ibsim-run) turns
  the same into its series.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from shaperd.core import config
from shaperd.rdma import opensm
from shaperd.rdma.plan import plan
from shaperd.discovery import rdma as rdma_discovery
from shaperd.core.inventory import Inventory
from shaperd.kernel import ib_smp
from shaperd.report import rdma_metrics, rdma_smcheck
from shaperd.report.metrics import Metrics
from shaperd.report.rdma_sampler import RdmaSampler
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..ibsim import IBSIM_MARKS, Fabric, missing_tools, run_group, wait_for
from ..rdma_fixture import Node

pytestmark = IBSIM_MARKS

PROGRAMMED = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50}
  - {name: tenant-c, bandwidthGuarantee: 10Gbps, priority: 10}
"""
# One tenant fewer: the default VL moves from VL3 to VL2 (SL3-15 change), and so do the low table's weights.
OTHER = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 10Gbps, priority: 50}
"""
MAX_VLS = {"default": 8, "ca": 4}
MAX_VLS_ARGS = ["--max-vls", "8", "--max-vls", "ca=4"]


def ca_tables(text: str) -> opensm.QosTables:
    cfg = config.load_text(text)
    inv = Inventory()
    return opensm.render(cfg, plan(cfg, inv, tenancy(cfg, inv)), MAX_VLS).tables("ca")


@pytest.fixture
def programmed(tmp_path):
    """A fabric whose SM programmed PROGRAMMED's tables; Hca1's LID; a sysfs tree with ibsim0:1 at that LID."""
    missing = missing_tools()
    assert not missing, f"{', '.join(missing)} missing: run scripts/setup as root"
    f = Fabric(tmp_path)
    try:
        f.start()
        tenants = tmp_path / "programmed.yaml"
        tenants.write_text(PROGRAMMED)
        cp = run_group([sys.executable, "-m", "shaperd", "rdma", "opensm-config", "--config", str(tenants),
                        *MAX_VLS_ARGS], 60, cwd=tmp_path)
        assert cp.returncode == 0, cp.stderr
        opts = tmp_path / "opensm.conf"
        opts.write_text(cp.stdout)
        f.opensm_once(opts)
        hca = wait_for(lambda: next((p for p in f.ports() if p.kind == "CA" and p.name == "Hca1" and p.lid), None),
                       120, "the SM assigning Hca1 a LID")
        node = Node(tmp_path / "node")
        node.device("ibsim0", node.pci_function("0000:5e:00.0", bus="pci0000:5d"),
                    {1: {"link_layer": "InfiniBand", "lid": hex(hca.lid)}})
        yield f, node, hca
    finally:
        f.close()


def rdma_status(fabric: Fabric, node: Node, tenants: Path, cwd: Path, wrapper=("ibsim-run",)) -> dict:
    cp = run_group([*wrapper, sys.executable, "-m", "shaperd", "rdma", "status", "--json", "--no-netlink",
                    "--interval", "0", "--sysfs-root", str(node.sys), "--config", str(tenants), *MAX_VLS_ARGS],
                   90, cwd=cwd, env=fabric.env("Hca1"))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    (dev,) = json.loads(cp.stdout)["devices"]
    (port,) = dev["ports"]
    return port["sm_check"]


def test_rdma_status_verifies_the_tables_opensm_programmed_and_names_a_mismatch(programmed, tmp_path):
    fabric, node, _ = programmed
    same = tmp_path / "programmed.yaml"
    chk = rdma_status(fabric, node, same, tmp_path)
    assert (chk["status"], chk["ok"], chk["mismatches"]) == ("verified", True, []), chk

    other = tmp_path / "other.yaml"
    other.write_text(OTHER)
    want, got = ca_tables(OTHER), ca_tables(PROGRAMMED)
    changed = [sl for sl in range(16) if want.sl2vl[sl] != got.sl2vl[sl]]
    assert changed  # the two files imply different SL2VL tables
    chk = rdma_status(fabric, node, other, tmp_path)
    assert chk["status"] == "mismatch" and not chk["ok"], chk
    sl_rows = [m for m in chk["mismatches"] if m["table"] == "sl2vl"]
    assert [(m["sl"], m["expected"], m["observed"]) for m in sl_rows] == [
        (sl, want.sl2vl[sl], got.sl2vl[sl]) for sl in changed]
    assert any(m["table"] == "vlarb_low" for m in chk["mismatches"])

    # Without umad2sim, smpquery finds no umad device here: not verified, with smpquery's reason; no made-up result.
    chk = rdma_status(fabric, node, same, tmp_path, wrapper=())
    assert (chk["status"], chk["ok"], chk["mismatches"]) == ("not verified", False, []), chk
    assert chk["reason"].startswith("smpquery -D sl2vl 0 on ibsim0:1: exit status "), chk


def test_the_daemons_checker_reads_the_fabric_and_exports_what_it_found(programmed, tmp_path):
    fabric, node, _ = programmed
    devs, notes = rdma_discovery.discover(Roots.of(sys=str(node.sys)))
    inv = Inventory(rdma=devs, rdma_notes=notes)
    read = ib_smp.reader(timeout_s=20, wrapper=("ibsim-run",), env=fabric.env("Hca1"))
    c = rdma_smcheck.SmChecker(read, rdma_smcheck.SmCheckSettings(max_vls=MAX_VLS), wall=lambda: 1.0)
    m = Metrics(None, CollectorRegistry())
    rdma_metrics.install(m, RdmaSampler(lambda ports: {}), c)

    def series():
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}

    port = (("device", "ibsim0"), ("port", "1"))
    for text, verified in ((PROGRAMMED, 1), (OTHER, 0)):
        cfg = config.load_text(text)
        c.set_inputs(cfg, inv, plan(cfg, inv, tenancy(cfg, inv)))
        c.check_once()
        got = series()
        assert got[("shaperd_rdma_sm_tables_verified", port)] == verified, c.snapshot.checks
    assert got[("shaperd_rdma_sm_table_mismatches", port + (("table", "sl2vl"),))] >= 1
    assert ("shaperd_rdma_sm_check_errors_total", port) not in got
