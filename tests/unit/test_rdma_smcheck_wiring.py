"""The node-side SM-table check wired in: ``rdma status`` (field, column, JSON) and the daemon's periodic check and
series, all with a fake reader in place of smpquery and an injected clock (no sleeps, no root, no fabric)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from shaperd.cli import main as cli
from shaperd.core import config
from shaperd.rdma.plan import plan
from shaperd.discovery import rdma as rdma_discovery
from shaperd.core.inventory import Inventory
from shaperd.kernel import ib_smp
from shaperd.report import rdma_metrics, rdma_smcheck, rdma_status
from shaperd.report.metrics import Metrics
from shaperd.report.rdma_sampler import RdmaSampler
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..rdma_fixture import Node

FIX = Path(__file__).parent / "fixtures" / "smpquery"
MAX_VLS = {"default": 8, "ca": 4}  # what the fixtures were recorded with


def recorded() -> ib_smp.PortTables:
    """What OpenSM programmed on an HCA port for FIX/tenants.yaml (captured from ibsim)."""
    (row,) = ib_smp.parse_sl2vl((FIX / "sl2vl_self.txt").read_text())
    return ib_smp.PortTables("mlx5_1", 1, row.vls, ib_smp.parse_vlarb((FIX / "vlarb_self.txt").read_text()))


def one_sl_moved(sl: int = 2, vl: int = 0) -> ib_smp.PortTables:
    t = recorded()
    return replace(t, sl2vl=t.sl2vl[:sl] + (vl,) + t.sl2vl[sl + 1:])


class FakeReader:
    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def __call__(self, device, port):
        self.calls.append((device, port))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path).build()  # mlx5_1: the InfiniBand HCA (LID 4); mlx5_0/2/3: RoCE
    shutil.copy(FIX / "tenants.yaml", tmp_path / "t.yaml")
    return n


def status(node, tmp_path, read):
    return rdma_status.collect(Roots.of(sys=str(node.sys)), str(tmp_path / "t.yaml"), 0.0, sleep=lambda s: None,
                               clock=lambda: 0.0, sm_check_for=rdma_smcheck.for_watch(read, MAX_VLS))


def ports(st):
    return {f"{p['device']}:{p['port']}": p for d in st["devices"] for p in d["ports"]}


# ---------------------------------------------------------------- rdma status


def test_matching_tables_are_verified_in_the_field_the_column_and_json(node, tmp_path):
    read = FakeReader(recorded())
    st = status(node, tmp_path, read)
    p = ports(st)
    assert read.calls == [("mlx5_1", 1)]  # only the InfiniBand port; RoCE ports have no SM tables
    chk = p["mlx5_1:1"]["sm_check"]
    assert (chk["ok"], chk["status"], chk["reason"], chk["mismatches"]) == (True, "verified", None, [])
    assert all("sm_check" not in p[k] for k in ("mlx5_0:1", "mlx5_2:1", "mlx5_3:1"))
    assert json.loads(json.dumps(st)) == st  # the JSON output carries the same
    text = rdma_status.render(st)
    assert text.splitlines()[0].rstrip().endswith("SM TABLES")
    assert next(l for l in text.splitlines() if l.startswith("mlx5_1")).rstrip().endswith(" ok")
    assert "SM tables" not in text  # nothing to explain


def test_a_differing_sl2vl_entry_is_a_mismatch_naming_the_sl(node, tmp_path):
    expected_vl = recorded().sl2vl[2]
    st = status(node, tmp_path, FakeReader(one_sl_moved(sl=2, vl=0)))
    chk = ports(st)["mlx5_1:1"]["sm_check"]
    assert (chk["ok"], chk["status"]) == (False, "mismatch") and expected_vl != 0
    assert chk["mismatches"] == [{"table": "sl2vl", "sl": 2, "expected": expected_vl, "observed": 0,
                                  "text": f"SL2 -> VL0, expected VL{expected_vl}"}]
    text = rdma_status.render(st)
    assert next(l for l in text.splitlines() if l.startswith("mlx5_1")).rstrip().endswith("MISMATCH")
    assert f"SM tables mlx5_1:1: 1 mismatch(es): SL2 -> VL0, expected VL{expected_vl}" in text


def test_a_vlarb_mismatch_names_the_entry_with_vl_and_weight(node, tmp_path):
    t = recorded()
    (vl, w), rest = t.vlarb.low[0], t.vlarb.low[1:]
    st = status(node, tmp_path, FakeReader(replace(t, vlarb=replace(t.vlarb, low=((vl, w + 1),) + rest))))
    (m,) = ports(st)["mlx5_1:1"]["sm_check"]["mismatches"]
    assert m["table"] == "vlarb_low" and m["entry"] == 0
    assert (m["expected"], m["observed"]) == ({"vl": vl, "weight": w}, {"vl": vl, "weight": w + 1})


def test_a_reader_failure_is_not_verified_with_the_reason(node, tmp_path):
    st = status(node, tmp_path, FakeReader(ib_smp.SmpError("smpquery sl2vl on mlx5_1:1: no answer within 10 s")))
    chk = ports(st)["mlx5_1:1"]["sm_check"]
    assert (chk["ok"], chk["status"], chk["mismatches"]) == (False, "not verified", [])
    assert chk["reason"] == "smpquery sl2vl on mlx5_1:1: no answer within 10 s"
    text = rdma_status.render(st)
    assert next(l for l in text.splitlines() if l.startswith("mlx5_1")).rstrip().endswith("NOT VERIFIED")
    assert "SM tables mlx5_1:1: not verified: smpquery sl2vl on mlx5_1:1: no answer within 10 s" in text


def test_without_a_tenants_file_there_is_nothing_to_compare_and_no_read(node, tmp_path):
    read = FakeReader(recorded())
    st = rdma_status.collect(Roots.of(sys=str(node.sys)), str(tmp_path / "absent.yaml"), 0.0, sleep=lambda s: None,
                             clock=lambda: 0.0, sm_check_for=rdma_smcheck.for_watch(read, MAX_VLS, "no file"))
    assert read.calls == [] and ports(st)["mlx5_1:1"]["sm_check"]["reason"] == "no file"


def test_a_node_without_infiniband_ports_runs_no_check(node, tmp_path):
    (node.sys / "class" / "infiniband" / "mlx5_1").unlink()  # only RoCE ports left
    read = FakeReader(recorded())
    st = status(node, tmp_path, read)
    assert read.calls == [] and all("sm_check" not in p for p in ports(st).values())
    assert "SM TABLES" not in rdma_status.render(st)


def test_the_cli_checks_by_default_and_skips_with_no_sm_check(node, tmp_path, capsys, monkeypatch):
    made = []

    def reader(**kw):
        made.append(kw)
        return FakeReader(one_sl_moved())

    monkeypatch.setattr(ib_smp, "reader", reader)
    base = ["rdma", "status", "--json", "--no-netlink", "--interval", "0", "--sysfs-root", str(node.sys),
            "--config", str(tmp_path / "t.yaml"), "--max-vls", "8", "--max-vls", "ca=4"]
    args = cli.build_parser().parse_args(base + ["--sm-check-timeout", "3"])
    assert args.fn(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert made == [{"timeout_s": 3.0}]
    assert [m["sl"] for m in ports(out)["mlx5_1:1"]["sm_check"]["mismatches"]] == [2]
    args = cli.build_parser().parse_args(base + ["--no-sm-check"])
    assert args.fn(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(made) == 1 and "sm_check" not in ports(out)["mlx5_1:1"]


def test_the_kernel_reader_says_why_it_cannot_run_and_runs_nothing(monkeypatch):
    def no_popen(*a, **kw):
        raise AssertionError("smpquery must not be started")

    monkeypatch.setattr(ib_smp.subprocess, "Popen", no_popen)
    missing = ib_smp.reader(which=lambda name, path=None: None, euid=lambda: 0)
    with pytest.raises(ib_smp.SmpError, match=r"^smpquery not found \(install infiniband-diags\)$"):
        missing("mlx5_1", 1)
    user = ib_smp.reader(which=lambda name, path=None: "/usr/sbin/smpquery", euid=lambda: 1000)
    with pytest.raises(ib_smp.SmpError, match=r"^needs root \(smpquery opens /dev/infiniband/umadN\)$"):
        user("mlx5_1", 1)


# ---------------------------------------------------------------- the daemon's periodic check and its series


def inputs(node):
    cfg = config.load_file(FIX / "tenants.yaml")
    devs, notes = rdma_discovery.discover(Roots.of(sys=str(node.sys)))
    inv = Inventory(rdma=devs, rdma_notes=notes)
    return cfg, inv, plan(cfg, inv, tenancy(cfg, inv))


def checker(read, interval_s=60.0):
    wall = iter(float(1000 + i) for i in range(100))
    return rdma_smcheck.SmChecker(read, rdma_smcheck.SmCheckSettings(interval_s=interval_s, max_vls=MAX_VLS),
                                  clock=lambda: pytest.fail("tick() takes the time; the clock is the thread's"),
                                  wall=lambda: next(wall))


def test_the_check_runs_every_interval_by_the_injected_clock(node):
    read = FakeReader(recorded())
    c = checker(read, interval_s=60.0)
    assert not c.tick(0.0) and read.calls == []  # nothing to check before the first reconcile's inputs
    c.set_inputs(*inputs(node))
    assert c.tick(5.0) and read.calls == [("mlx5_1", 1)]
    assert not c.tick(30.0) and not c.tick(64.9) and len(read.calls) == 1
    assert c.tick(65.0) and len(read.calls) == 2
    assert not c.tick(100.0) and c.tick(125.0) and c.snapshot.runs == 3
    fast = checker(FakeReader(recorded()), interval_s=5.0)
    fast.set_inputs(*inputs(node))
    assert [fast.tick(t) for t in (0.0, 4.0, 5.0, 9.0, 10.0)] == [True, False, True, False, True]


def metric_samples(c):
    m = Metrics(None, CollectorRegistry())
    rdma_metrics.install(m, RdmaSampler(lambda ports: {}), c)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}


DEV = (("device", "mlx5_1"), ("port", "1"))


def test_series_verified_mismatches_and_errors_never_a_fake_value(node):
    reader = FakeReader(recorded())
    c = checker(reader)
    assert not any(k[0].startswith("shaperd_rdma_sm_") for k in metric_samples(c))  # no check yet: no series
    c.set_inputs(*inputs(node))
    c.tick(0.0)
    got = metric_samples(c)
    assert got[("shaperd_rdma_sm_tables_verified", DEV)] == 1
    assert {k[1]: v for k, v in got.items() if k[0] == "shaperd_rdma_sm_table_mismatches"} == {
        DEV + (("table", t),): 0 for t in ("sl2vl", "vlarb_high", "vlarb_low")}
    assert got[("shaperd_rdma_sm_last_check_timestamp_seconds", ())] == 1000.0

    reader.answer = one_sl_moved()
    c.tick(60.0)
    got = metric_samples(c)
    assert got[("shaperd_rdma_sm_tables_verified", DEV)] == 0
    assert got[("shaperd_rdma_sm_table_mismatches", DEV + (("table", "sl2vl"),))] == 1

    reader.answer = ib_smp.SmpError("smpquery not found (install infiniband-diags)")
    c.tick(120.0)
    c.tick(180.0)
    got = metric_samples(c)
    assert ("shaperd_rdma_sm_tables_verified", DEV) not in got  # could not be read: no 0/1
    assert not any(k[0] == "shaperd_rdma_sm_table_mismatches" for k in got)
    assert got[("shaperd_rdma_sm_check_errors_total", DEV)] == 2
    assert c.snapshot.checks[0].reason == "smpquery not found (install infiniband-diags)"


def test_no_infiniband_ports_no_reads_no_series(node):
    (node.sys / "class" / "infiniband" / "mlx5_1").unlink()
    read = FakeReader(recorded())
    c = checker(read)
    c.set_inputs(*inputs(node))
    assert c.tick(0.0) and read.calls == [] and c.snapshot.checks == ()
    got = metric_samples(c)
    assert not any(k[0].startswith("shaperd_rdma_sm_") and k[0] != "shaperd_rdma_sm_last_check_timestamp_seconds"
                   for k in got)


def test_a_bug_in_the_check_becomes_a_log_line_not_a_dead_thread(node):
    c = checker(lambda d, p: 1 / 0)  # not a ShaperdError: escapes check_ports
    c.set_inputs(*inputs(node))
    assert c.tick(0.0) and c.snapshot.checks == () and c.snapshot.runs == 1


def test_the_daemon_hands_the_reconciles_inventory_to_the_checker(node):
    from types import SimpleNamespace

    from shaperd.daemon.service import Daemon

    cfg, inv, rplan = inputs(node)
    d = Daemon("/nonexistent", None)
    d.config, d.sm_checker = cfg, checker(FakeReader(recorded()))
    d.metrics = SimpleNamespace(reconciled=lambda *a, **kw: None, present=lambda tenants: None)
    rep = SimpleNamespace(inventory=inv, endpoints=None, duration_s=0.0, devices=(), problems=(),
                          plan=SimpleNamespace(desired={}, tenancy=tenancy(cfg, inv), pod_tenants={}))
    d._observe(rep, ok=True, drift=False)
    assert d.sm_checker.tick(0.0) and d.sm_checker.snapshot.checks[0].ok
