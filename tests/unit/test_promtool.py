"""promtool on what shaperd ships: the exposition is lint-clean, the rules parse and pass their unit tests.

promtool comes from Debian's prometheus package, which scripts/setup installs as root (CI runs as
root). Without it the tests skip for a non-root user and FAIL as root: there, setup should have
installed it, and a silent skip would hide a regression.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shaperd.core import config
from shaperd.backends.dcb.backend import DcbBackend
from shaperd.backends.devlink.backend import DevlinkSnapshot, NodeRates
from shaperd.backends.dcb import metrics as dcb_metrics
from shaperd.backends.devlink import metrics as devlink_metrics
from shaperd.backends.vfrate import metrics as vfrate_metrics
from shaperd.report.degraded import Blocked, Degraded

from .test_dcb_plan import TWO, FakeDcb, _ctx, _reconcile, cfg_text, inventory
from .test_rdma_metrics import setup_metrics
from .test_vfrate_backend import CFG, rig  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
DEADLINE_S = 60


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.geteuid() == 0:
            pytest.fail("promtool missing although running as root: scripts/setup installs Debian's prometheus")
        pytest.skip("promtool not installed (scripts/setup installs Debian's prometheus package as root)")
    return path


def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, text=True, timeout=DEADLINE_S,
                          cwd=RULES_DIR)


def full_exposition(tmp_path, rig) -> str:  # noqa: F811
    """/metrics of an agent with every collector shaperd has: tc, RDMA, devlink, VF rates, DCB, process."""
    m, _node, _rs = setup_metrics(tmp_path / "rdma")
    m.config_loaded(True, config.load_text("tenants: [{name: a, bandwidthGuarantee: 1Gbps, priority: 1}]"))
    m.config_loaded(False)
    m.reconciled(0.01, {"plan"}, ok=True, drift=False, endpoints={"a": {"cidr": 1, "interface": 0}},
                 degraded=Degraded(blocked=(Blocked("htb", "eth1", "root qdisc tbf 1: is not shaperd's; left alone"),)))
    m.kubernetes(True, None, {"a": 2})
    pf = "pci/0000:3b:00.0"

    class Src:
        snapshot = DevlinkSnapshot((NodeRates("a", pf, "shpd_a", 1_250_000, 12_500_000),),
                                   {(pf, "shpd_a"): (1_250_000, 12_000_000)}, True)

    devlink_metrics.install(m, Src())
    from shaperd.backends.podingress.backend import PodIngressBackend
    from shaperd.backends.podingress.metrics import PodIngressCollector
    from shaperd.backends.podingress.plan import PodIngressPlan
    from .test_podingress_report import Reader as QdiscReader, pods as capped_pods

    podin = PodIngressBackend(None)  # per-pod ingress caps, their tbf counters from a fake qdisc dump
    podin.snapshot = PodIngressPlan(pods=capped_pods())
    m.collectors.collectors["pod_ingress"] = PodIngressCollector(podin, QdiscReader)
    _nic, backend, rec = rig("i40e")
    vfrate_metrics.install(m, [backend])
    rec.apply(config.load_text(CFG))
    rec.apply(config.load_text(CFG))
    inv = inventory(tmp_path / "dcb")
    dcb = DcbBackend(client=FakeDcb(["ens1f0"]))
    _reconcile(dcb, _ctx(inv, cfg_text(TWO)), inv)
    dcb_metrics.install(m, [dcb])
    from shaperd.backends.htb.backend import HtbBackend
    from shaperd.backends.htb import metrics as classifier_metrics

    htb = HtbBackend(writer=None)
    htb.classifier_paths, htb.offload = {"eth0": "ebpf"}, {"eth0": (True, "mlx5_core, hw-tc-offload on")}
    classifier_metrics.install(m, [htb])
    from shaperd.daemon.service import install_annotation_metrics

    install_annotation_metrics(m, rec)  # refused pod annotations, from the reconciler's ledger
    return m.exposition().decode()


def test_the_exposition_has_every_collector_and_promtool_finds_nothing(tmp_path, rig):  # noqa: F811
    text = full_exposition(tmp_path, rig)
    names = {f.name for f in text_string_to_metric_families(text)}
    # the collectors are really in it (a lint of half an exposition would prove little)
    for n in ("shaperd_tenant_transmit_rate_bytes_per_second", "shaperd_tenant_rdma_transmit_wait",
              "shaperd_tenant_devlink_rate_configured_bytes_per_second",
              "shaperd_tenant_vf_configured_rate_bytes_per_second", "shaperd_tenant_dcb_share_ratio",
              "shaperd_htb_offload", "shaperd_classifier_info", "shaperd_degraded_targets",
              "shaperd_pod_annotation_invalid", "process_resident_memory_bytes", "process_start_time_seconds", "python_info"):
        assert n in names, n
    assert {"shaperd_pod_receive_bytes", "shaperd_pod_receive_limit_bytes_per_second"} <= names
    r = run(["check", "metrics"], stdin=text)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_promtool_flags_a_bits_metric():
    """The check above can fail: promtool does warn about the unit this change removed."""
    bad = "# HELP x_rate_bits_per_second r\n# TYPE x_rate_bits_per_second gauge\nx_rate_bits_per_second 1\n"
    r = run(["check", "metrics"], stdin=bad)
    assert r.returncode != 0 and "base unit" in r.stdout + r.stderr


def test_promtool_accepts_the_rules():
    r = run(["check", "rules", "shaperd-alerts.yaml"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_alert_rules_pass_their_unit_tests():
    r = run(["test", "rules", "shaperd-alerts.test.yaml"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
