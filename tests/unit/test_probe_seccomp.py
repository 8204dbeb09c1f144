"""bpf() refused by a seccomp filter: the probe's classification (injected errnos, a fake /proc/self/status),
the typed reason on Capabilities, the one warning line, the degraded status and the metric.

The same on a real kernel under a real filter: tests/integration/test_bpf_seccomp.py."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.core.inventory import Capabilities
from shaperd.core.roots import Roots
from shaperd.engine import probe as engine_probe
from shaperd.kernel import bpf, probe
from shaperd.report.degraded import Degraded, of_report
from shaperd.report.metrics import Metrics

SECCOMP = probe.BPF_REFUSED_BY_SECCOMP
CAP_BPF_ONLY = "0000008000001000"  # CAP_BPF (39) + CAP_NET_ADMIN (12): the DaemonSet's set, roughly
CAP_SYS_ADMIN_ONLY = "0000000000200000"  # CAP_SYS_ADMIN (21)
NO_CAPS = "0000000000000000"


def status(capeff: str = CAP_BPF_ONLY, seccomp: str | None = "2") -> str:
    lines = ["Name:\tpython3", "Umask:\t0022", "State:\tR (running)", f"CapEff:\t{capeff}", "NoNewPrivs:\t1"]
    if seccomp is not None:
        lines += [f"Seccomp:\t{seccomp}", "Seccomp_filters:\t1"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("load, bare, text, want", [
    (errno.EPERM, errno.EPERM, status(), SECCOMP),  # the pod's case: CAP_BPF, RuntimeDefault refuses
    (errno.EPERM, errno.EPERM, status(CAP_SYS_ADMIN_ONLY), SECCOMP),  # CAP_SYS_ADMIN: a unit's filter
    (errno.EPERM, errno.EINVAL, status(), ""),  # the kernel saw the call: it refused the load itself (memlock)
    (errno.EPERM, errno.EPERM, status(NO_CAPS), ""),  # no capability: the kernel's own EPERM
    (errno.EPERM, errno.EPERM, status(seccomp="0"), ""),  # no filter installed
    (errno.EPERM, errno.EPERM, status(seccomp="1"), ""),  # strict mode is not a profile
    (errno.EPERM, errno.EPERM, status(seccomp=None), ""),  # a kernel without the field
    (errno.EINVAL, errno.EPERM, status(), ""),  # the verifier refused: not a refusal of bpf() itself
    (0, 0, status(), ""),  # it loaded
    (errno.EPERM, errno.EPERM, "CapEff:\tzz\nSeccomp:\t2\n", ""),  # unreadable CapEff: not guessed
])
def test_classification(load, bare, text, want):
    assert probe.classify_bpf_refusal(load, bare, text) == want


def test_bpf_refusal_reads_the_status_and_calls_bpf_only_under_a_filter_with_the_capability(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(status())
    assert probe.bpf_refusal(str(tmp_path), errnos=lambda: (errno.EPERM, errno.EPERM)) == SECCOMP
    assert probe.bpf_refusal(str(tmp_path), errnos=lambda: (errno.EPERM, errno.EINVAL)) == ""
    (tmp_path / "self" / "status").write_text(status(seccomp="0"))
    assert probe.bpf_refusal(str(tmp_path), errnos=lambda: pytest.fail("no filter: no bpf() call")) == ""
    assert probe.bpf_refusal(str(tmp_path / "nowhere"), errnos=lambda: pytest.fail("no status: no call")) == ""


def _assumed(monkeypatch, tmp_path, refused: str):
    """The DaemonSet's probe (no probe namespace) on a node where the load fails with EPERM."""
    monkeypatch.delenv("SHAPERD_CLASSIFIER", raising=False)
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (False, "load BPF program shpd_probe: Operation not permitted"))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: pytest.fail("no bpf: no load"))
    monkeypatch.setattr(edt_prog, "probe_load", lambda root, read_only=False: pytest.fail("no bpf: no stamper"))
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(status(seccomp="2" if refused else "0"))
    real = probe.bpf_refusal
    monkeypatch.setattr(probe, "bpf_refusal", lambda root: real(root, errnos=lambda: (errno.EPERM, errno.EPERM)))
    roots = Roots.of(sys=tmp_path / "sys", proc=tmp_path, modules=tmp_path / "modules", boot=tmp_path / "boot")
    return probe._assumed("capability probe skipped (EPERM)", str(tmp_path), str(tmp_path), roots,
                          checks=engine_probe.program_checks())


@pytest.mark.parametrize("refused", [SECCOMP, ""])
def test_the_probe_types_the_refusal_and_its_note_says_it(monkeypatch, tmp_path, refused):
    caps = _assumed(monkeypatch, tmp_path, refused)
    assert not caps.bpf and not caps.bpf_maps and not (caps.fq and caps.mq)
    assert caps.bpf_refused == refused
    cls = [n for n in caps.notes if n.startswith("cls_bpf unavailable")]
    assert len(cls) == 1 and (("refused by a seccomp filter" in cls[0]) is bool(refused)), caps.notes


def test_the_engines_probe_says_it_in_exactly_one_warning(monkeypatch):
    monkeypatch.setattr(probe, "probe_capabilities", lambda **kw: Capabilities(bpf=False, bpf_refused=SECCOMP))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with capture_logs() as logs:
        engine_probe.probe_capabilities()
    assert len(logs) == 1, logs
    (line,) = logs
    assert line["log_level"] == "warning" and line["event"] == "bpf() refused by seccomp"
    assert line["reason"] == SECCOMP
    assert "RuntimeDefault" in line["cause"] and "containerd < 1.6.9" in line["cause"] and "CRI-O" in line["cause"]
    assert "seccomp-localhost" in line["fix"] and engine_probe.SECCOMP_DOC in line["fix"]
    monkeypatch.setattr(probe, "probe_capabilities", lambda **kw: Capabilities(bpf=True))
    with capture_logs() as logs:
        engine_probe.probe_capabilities()
    assert logs == []


def test_under_systemd_the_cause_named_is_the_units_filter():
    line = engine_probe.seccomp_refusal_line({"INVOCATION_ID": "abc"})
    assert "SystemCallFilter=" in line["cause"] and "RuntimeDefault" not in line["cause"]
    assert "RuntimeDefault" in engine_probe.seccomp_refusal_line({"INVOCATION_ID": "a",
                                                                  "KUBERNETES_SERVICE_HOST": "x"})["cause"]


def _report(refused: str):
    return SimpleNamespace(problems=(), devices=[],
                           inventory=SimpleNamespace(capabilities=Capabilities(bpf_refused=refused)))


def test_a_refusal_is_degraded_first_in_the_line_and_in_the_json():
    d = of_report(_report(SECCOMP))
    assert d and d.count == 1 and d.refused == (SECCOMP,)
    assert d.line().startswith("degraded: 1 system call refused (bpf() refused by seccomp")
    assert d.doc()["refused"] == [{"reason": SECCOMP, "message": d.first_reason}]
    assert d.by_kind() == {"blocked": 0, "problem": 0}  # shaperd_degraded_targets counts targets only
    assert not of_report(_report("")) and "refused" not in of_report(_report("")).doc()
    assert of_report(SimpleNamespace(problems=(), devices=[])).refused == ()  # a report without an inventory


def scrape(m: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}


def test_readyz_healthz_and_the_metric_say_it():
    now = [100.0]
    m = Metrics(None, wall=lambda: 1e9, monotonic=lambda: now[0])
    m.config_loaded(True, SimpleNamespace(tenants=[1]))
    assert "shaperd_bpf_syscall_refused" not in scrape(m)  # no reconcile yet: not known, no series
    m.reconciled(0.01, set(), ok=True, drift=False, degraded=Degraded())
    assert "shaperd_bpf_syscall_refused" not in scrape(m)  # bpf() works: a missing series, never 0
    d = of_report(_report(SECCOMP))
    m.reconciled(0.01, set(), ok=True, drift=False, degraded=d)
    fam = scrape(m)["shaperd_bpf_syscall_refused"]
    assert fam.type == "gauge" and [(s.labels, s.value) for s in fam.samples] == [({"cause": "seccomp"}, 1.0)]
    ok, why = m.ready()
    assert ok and why == d.line()  # ready (a restart does not lift a seccomp profile), and says why
    ok, why = m.healthy()
    assert ok and why.endswith(d.line())
