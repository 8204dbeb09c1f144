"""The subnet manager's side, proved with the real OpenSM on a simulated fabric (ibsim), read back with smpquery.

1. ``shaperd rdma opensm-config`` renders the options; OpenSM loads every one
   of them without a warning, sweeps once, and the SL2VL and VLArb tables
   smpquery reads from an HCA port and from switch ports are the rendered
   ones (the HCA with its qos_ca_ set, the switches with the default set).
2. ``--write`` into an OpenSM-generated options file keeps every other line
   byte for byte; with opensm running, the SIGHUP (found by scanning
   processes, then through a pid file) makes it reprogram the fabric: the
   new tables appear on the ports, and the node-side check reports exactly
   the entries that changed as mismatches against the old expectation.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shaperd.core import config
from shaperd.rdma import opensm
from shaperd.rdma import smcheck
from shaperd.rdma.opensm_file import option_key
from shaperd.rdma.plan import plan
from shaperd.core.inventory import Inventory, RdmaPort
from shaperd.kernel import ib_smp
from shaperd.core.tenancy import tenancy

from ..ibsim import IBSIM_MARKS, Fabric, missing_tools, run_group, wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = IBSIM_MARKS

FOUR = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50}
  - {name: tenant-c, bandwidthGuarantee: 10Gbps, priority: 10}
  - {name: tenant-d, bandwidthGuarantee: 5Gbps, priority: 5, rdma: {serviceLevel: 6}}
"""
FIRST = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50}
"""
# Priorities swapped and a third tenant: every SL2VL and VLArb table changes.
SECOND = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 50}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 100}
  - {name: tenant-c, bandwidthGuarantee: 10Gbps, priority: 10}
"""


@pytest.fixture
def fabric(tmp_path):
    missing = missing_tools()
    assert not missing, f"{', '.join(missing)} missing: run scripts/setup as root (it installs ibsim-utils, " \
                        "opensm and infiniband-diags)"
    f = Fabric(tmp_path)
    try:
        f.start()
        yield f
    finally:
        f.close()


def rendered(text: str, max_vls=opensm.DEFAULT_MAX_VLS) -> opensm.OpenSmConfig:
    cfg = config.load_text(text)
    inv = Inventory()
    return opensm.render(cfg, plan(cfg, inv, tenancy(cfg, inv)), max_vls)


def shaperd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_group([sys.executable, "-m", "shaperd", *args], 60, cwd=cwd)


def tables_at(fabric: Fabric, lid: int, port: int) -> tuple[tuple[ib_smp.Sl2VlRow, ...], ib_smp.VlArb]:
    rows = ib_smp.parse_sl2vl(fabric.smpquery("sl2vl", str(lid), str(port)))
    arb = ib_smp.parse_vlarb(fabric.smpquery("vlarb", str(lid), str(port)))
    return rows, arb


def holds(fabric: Fabric, lid: int, port: int, want: opensm.QosTables) -> bool:
    rows, arb = tables_at(fabric, lid, port)
    return (all(r.vls == want.sl2vl for r in rows)
            and arb.low == smcheck.port_entries(want.vlarb_low, arb.low_cap)
            and arb.high == smcheck.port_entries(want.vlarb_high, arb.high_cap))


def pick_ports(fabric: Fabric):
    """The HCA Hca1, the switch port facing it and a switch port facing the other switch, once LIDs are assigned."""
    ports = wait_for(lambda: (ps := fabric.ports()) and all(p.lid for p in ps) and len(ps) >= 8 and ps,
                     120, "the SM assigning LIDs")
    hca = next(p for p in ports if p.kind == "CA" and p.name == "Hca1")
    to_hca = next(p for p in ports if p.kind == "SW" and p.name == "Switch1" and p.peer == "Hca1")
    to_switch = next(p for p in ports if p.kind == "SW" and p.name == "Switch1" and p.peer == "Switch2")
    return hca, to_hca, to_switch


def test_rendered_tables_land_on_hca_and_switch_ports(fabric, tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(FOUR)
    cp = shaperd("rdma", "opensm-config", "--config", str(tenants), "--max-vls", "8", "--max-vls", "ca=4",
                 cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    want = rendered(FOUR, {"default": 8, "ca": 4})
    assert cp.stdout == want.text()
    ca, swe = want.tables("ca"), want.tables("swe")
    assert ca != swe and ca.max_vls == 4 and swe.max_vls == 8  # the HCAs get their own set
    opts = tmp_path / "opensm.conf"
    opts.write_text(cp.stdout)

    osm = fabric.opensm_once(opts)
    loaded = [l.strip() for l in osm.stdout.splitlines() if l.strip().startswith("Loading Cached Option:")]
    for key, value in want.options():
        assert f"Loading Cached Option:{key} = {value}" in loaded, (key, osm.stdout)
    assert not [l for l in osm.stdout.splitlines() if "Warning" in l or "Invalid" in l or "Unrecognized" in l]

    hca, to_hca, to_switch = pick_ports(fabric)
    rows, arb = tables_at(fabric, hca.lid, hca.port)
    assert [r.vls for r in rows] == [ca.sl2vl]
    assert ca.sl2vl == (0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3)  # tenant-d's SL6 folded into VL3 (4 VLs)
    assert arb.low == smcheck.port_entries(ca.vlarb_low, arb.low_cap)
    assert arb.high == smcheck.port_entries(ca.vlarb_high, arb.high_cap)
    for sw in (to_hca, to_switch):
        rows, arb = tables_at(fabric, sw.lid, sw.port)
        assert rows and {r.vls for r in rows} == {swe.sl2vl}, sw  # every in-port towards this out-port
        assert swe.sl2vl == (0, 1, 2, 3, 3, 3, 6, 3, 3, 3, 3, 3, 3, 3, 3, 3)
        assert arb.low == smcheck.port_entries(swe.vlarb_low, arb.low_cap)
        assert arb.high == smcheck.port_entries(swe.vlarb_high, arb.high_cap)

    # The node side: the HCA reads its own port (direct route to itself) and finds nothing amiss.
    read = lambda dev, port: ib_smp.read_port(dev, port, wrapper=("ibsim-run",), env=fabric.env("Hca1"))
    port = RdmaPort(device="ibsim0", port=1, link_layer="InfiniBand", state="ACTIVE", lid=hca.lid)
    (check,) = smcheck.check_ports([port], ca, read)
    assert check.verified and check.mismatches == (), check.describe()
    (wrong,) = smcheck.check_ports([port], swe, read)  # the switches' set is not what an HCA holds
    assert wrong.verified and {m.table for m in wrong.mismatches} == {"sl2vl", "vlarb_low"}
    assert smcheck.Mismatch("sl2vl", 6, 6, 3) in wrong.mismatches


def test_write_and_sighup_reprogram_the_running_opensm(fabric, tmp_path):
    opts = tmp_path / "opensm.conf"
    gen = run_group(["opensm", "-c", str(opts)], 60, cwd=tmp_path, env=fabric.env())  # every option at its default
    assert gen.returncode == 0 and opts.exists(), gen.stdout + gen.stderr
    original = opts.read_bytes()
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(FIRST)
    second.write_text(SECOND)

    cp = shaperd("rdma", "opensm-config", "--config", str(first), "--write", str(opts), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "no running opensm reads" in cp.stdout
    text = opts.read_text()
    block = opensm.BEGIN_MARK + text.split(opensm.BEGIN_MARK, 1)[1].split(opensm.END_MARK, 1)[0] + opensm.END_MARK
    assert block + "\n" == rendered(FIRST).text()
    outside = text.replace(block + "\n", "")
    kept = [l for l in original.decode().splitlines(keepends=True) if option_key(l) not in opensm.OWNED_KEYS]
    assert outside.splitlines(keepends=True) == kept  # every other line, byte for byte, in order
    assert "qos_policy_file /etc/opensm/qos-policy.conf\n" in outside and "qos_rtr_sl2vl (null)\n" in outside

    osm = fabric.start_opensm(opts)
    hca, to_hca, to_switch = pick_ports(fabric)
    one, two = rendered(FIRST), rendered(SECOND)
    assert one.tables("ca").sl2vl != two.tables("ca").sl2vl
    assert one.tables("ca").vlarb_low != two.tables("ca").vlarb_low
    wait_for(lambda: holds(fabric, hca.lid, hca.port, one.tables("ca")), 120, "first tables on the HCA")

    # The scan: the opensm whose -F is this file, signalled by pid.
    cp = shaperd("rdma", "opensm-config", "--config", str(second), "--write", str(opts), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "replaced shaperd's QoS block" in cp.stdout
    assert f"sent SIGHUP to opensm pid {osm.pid}:" in cp.stdout
    for p, want in ((hca, two.tables("ca")), (to_hca, two.tables("swe")), (to_switch, two.tables("swe"))):
        wait_for(lambda: holds(fabric, p.lid, p.port, want), 120, f"second tables on {p}")

    # The node checking against the old expectation reports exactly what changed.
    read = lambda dev, port: ib_smp.read_port(dev, port, wrapper=("ibsim-run",), env=fabric.env("Hca1"))
    port = RdmaPort(device="ibsim0", port=1, link_layer="InfiniBand", state="ACTIVE", lid=hca.lid)
    (stale,) = smcheck.check_ports([port], one.tables("ca"), read)
    observed = read("ibsim0", 1)
    assert stale.verified and stale.mismatches == smcheck.compare("ibsim0", 1, one.tables("ca"), observed).mismatches
    changed_sls = [sl for sl in range(16) if one.tables("ca").sl2vl[sl] != two.tables("ca").sl2vl[sl]]
    assert [m.index for m in stale.mismatches if m.table == "sl2vl"] == changed_sls
    assert any(m.table == "vlarb_low" for m in stale.mismatches)
    samples = smcheck.metric_samples([stale])
    assert smcheck.Sample("shaperd_rdma_sm_table_mismatches",
                          {"device": "ibsim0", "port": "1", "table": "sl2vl"}, float(len(changed_sls))) in samples

    # The pid file: back to the first tables.
    pid_file = tmp_path / "opensm.pid"
    pid_file.write_text(f"{osm.pid}\n")
    cp = shaperd("rdma", "opensm-config", "--config", str(first), "--write", str(opts),
                 "--opensm-pid-file", str(pid_file), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert f"sent SIGHUP to opensm pid {osm.pid}:" in cp.stdout
    for p, want in ((hca, one.tables("ca")), (to_switch, one.tables("swe"))):
        wait_for(lambda: holds(fabric, p.lid, p.port, want), 120, f"first tables again on {p}")

    # Nothing to change: no write, no signal.
    before = opts.read_bytes()
    cp = shaperd("rdma", "opensm-config", "--config", str(first), "--write", str(opts), cwd=tmp_path)
    assert cp.returncode == 0 and "already as rendered; not written, opensm not signalled" in cp.stdout
    assert opts.read_bytes() == before
    assert osm.poll() is None  # SIGHUP re-reads; it never stops opensm
