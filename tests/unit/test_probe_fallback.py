"""kernel/probe without CAP_SYS_ADMIN (the DaemonSet and the unit drop it): no throwaway namespace,
so the probe falls back, still tests cls_bpf in place and takes fq_codel leaves only where the
node's default qdisc proves fq_codel exists. No kernel is touched: the namespace call is refused."""

from __future__ import annotations

import errno

import pytest

from shaperd.kernel import bpf
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.engine import probe as engine_probe
from shaperd.kernel import probe


@pytest.fixture
def no_netns(monkeypatch):
    def refuse():
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(probe, "unshare_netns", refuse)
    # The edt stamper's own load-and-adopt probe (test_probe_edt_pins.py covers it): no bpf() here.
    monkeypatch.setattr(edt_prog, "probe_load", lambda root, read_only=False: (False, "not probed in this test"))


def procfs(tmp_path, qdisc: str | None):
    d = tmp_path / "sys" / "net" / "core"
    d.mkdir(parents=True)
    if qdisc is not None:
        (d / "default_qdisc").write_text(qdisc + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("qdisc,leaves", [("fq_codel", {"bfifo", "fq_codel"}), ("pfifo_fast", {"bfifo"}),
                                          ("fq", {"bfifo"}), (None, {"bfifo"})])
def test_fallback_leaves_follow_the_default_qdisc(no_netns, monkeypatch, tmp_path, qdisc, leaves):
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (True, "ok"))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: ("pins", f"bpffs pins under {root}"))
    monkeypatch.delenv("SHAPERD_CLASSIFIER", raising=False)
    caps = probe.probe_capabilities(procfs(tmp_path, qdisc), bpffs_root="/x/bpf", checks=engine_probe.program_checks())
    assert caps.htb and caps.u32 and caps.bpf and caps.bpf_maps and caps.leaf_kinds == frozenset(leaves)
    assert caps.bpf_adopt == "pins" and caps.bpf_pin_root == "/x/bpf"
    assert "capability probe skipped (Operation not permitted)" in caps.notes[0]


def test_fallback_reports_cls_bpf_missing_when_the_load_is_refused(no_netns, monkeypatch, tmp_path):
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (False, "load SCHED_CLS program: EPERM"))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: pytest.fail("no map classifier without cls_bpf"))
    caps = probe.probe_capabilities(procfs(tmp_path, "fq_codel"), checks=engine_probe.program_checks())
    assert not caps.bpf and not caps.bpf_maps
    assert any("cls_bpf unavailable (load SCHED_CLS program: EPERM)" in n for n in caps.notes)


def test_fallback_map_classifier_refused_or_forced_off_means_u32(no_netns, monkeypatch, tmp_path):
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (True, "ok"))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: ("", "create map: EPERM"))
    caps = probe.probe_capabilities(procfs(tmp_path, None), checks=engine_probe.program_checks())
    assert caps.bpf and not caps.bpf_maps and not caps.bpf_adopt and any("create map: EPERM" in n for n in caps.notes)
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: ("pins", "ok"))
    monkeypatch.setenv("SHAPERD_CLASSIFIER", "u32")
    forced = probe.probe_capabilities(procfs(tmp_path / "x", None), bpffs_root="/x/bpf", checks=engine_probe.program_checks())
    assert not forced.bpf_maps and not forced.bpf_adopt and not forced.bpf_pin_root


def test_fallback_by_id_when_pins_fail_keeps_the_pin_reason(no_netns, monkeypatch, tmp_path):
    # With CAP_SYS_ADMIN but no usable bpffs: adoption by id, and the note says why not pins.
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (True, "ok"))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: ("id", f"by id (bpffs pins: {root}: EPERM)"))
    monkeypatch.delenv("SHAPERD_CLASSIFIER", raising=False)
    caps = probe.probe_capabilities(procfs(tmp_path, None), bpffs_root="/x/bpf", checks=engine_probe.program_checks())
    assert caps.bpf_maps and caps.bpf_adopt == "id" and caps.bpf_pin_root == ""
    assert any("by id (bpffs pins: /x/bpf: EPERM)" in n for n in caps.notes), caps.notes
