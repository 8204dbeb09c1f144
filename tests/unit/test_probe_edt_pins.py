"""The probe without a probe namespace (no CAP_SYS_ADMIN, the DaemonSet's case): edt is offered exactly
when the stamper itself loads and its maps come back through bpffs pins (kernel/edt_prog.py probe_load),
independently of the map classifier's verdict (which select.edt_missing adds: edt needs the classifier
too); never when only by-id adoption (or none) is left."""

from __future__ import annotations

import pytest

from shaperd.core.dataplane import edt_missing
from shaperd.kernel import bpf
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.engine import probe as engine_probe
from shaperd.kernel import probe
from shaperd.core.roots import Roots


def _empty(tmp_path) -> Roots:
    """A fixture tree with no evidence either way about sch_fq (unknown: offered, verified at apply)."""
    return Roots.of(sys=tmp_path / "sys", proc=tmp_path, modules=tmp_path / "modules", boot=tmp_path / "boot")


@pytest.mark.parametrize("classifier", ["pins", "id", ""])
@pytest.mark.parametrize("stamper, edt", [((True, "adopted through bpffs pins"), True),
                                          ((False, "load the edt stamper: Permission denied"), False)])
def test_edt_without_a_probe_namespace_needs_the_stampers_pins(monkeypatch, tmp_path, classifier, stamper, edt):
    monkeypatch.delenv("SHAPERD_CLASSIFIER", raising=False)
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (True, ""))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: (classifier, "why"))
    monkeypatch.setattr(edt_prog, "probe_load", lambda root, read_only=False: stamper)
    caps = probe._assumed("capability probe skipped (EPERM)", str(tmp_path), str(tmp_path), _empty(tmp_path), checks=engine_probe.program_checks())
    assert (caps.fq, caps.mq) == (edt, edt)
    # edt also needs the map classifier (select.edt_missing): sch_fq/mq follow the stamper, the offer both.
    assert (edt_missing(caps) == []) is (edt and classifier != "")
    assert any(n.startswith("edt: sch_fq unknown" if edt else "edt unavailable") for n in caps.notes)
    assert edt or any(n == f"edt stamper: {stamper[1]}" for n in caps.notes), caps.notes


def test_no_bpf_means_no_edt_even_with_pins(monkeypatch, tmp_path):
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (False, "EPERM"))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: ("pins", "why"))
    monkeypatch.setattr(edt_prog, "probe_load", lambda root, read_only=False: pytest.fail("no stamper without bpf()"))
    caps = probe._assumed("skipped", str(tmp_path), str(tmp_path), _empty(tmp_path), checks=engine_probe.program_checks())
    assert not caps.fq and "cls_bpf/bpf() unavailable" in edt_missing(caps)
