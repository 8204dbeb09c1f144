"""Evidence of tc kinds from the kernel's own files (kernel/qdisc_kinds.py), each case on a fixture tree:
what the probe says about sch_fq/mq where no probe namespace can test them (NET_ADMIN + BPF only)."""

from __future__ import annotations

import gzip

import pytest

from shaperd.core.dataplane import edt_missing, select
from shaperd.core.config import load_text
from shaperd.core.inventory import Link
from shaperd.kernel import bpf
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.engine import probe as engine_probe
from shaperd.kernel import probe
from shaperd.kernel.qdisc_kinds import ABSENT, PRESENT, UNKNOWN, evidence_all
from shaperd.core.roots import Roots

REL = "6.1.0-57-amd64"


def tree(tmp_path, *, builtin=None, dep=None, loaded=None, sysmod=(), boot_config=None, config_gz=None,
         rel=REL) -> Roots:
    r = Roots.of(sys=tmp_path / "sys", proc=tmp_path / "proc", modules=tmp_path / "lib-modules",
                 boot=tmp_path / "boot")
    (r.proc / "sys" / "kernel").mkdir(parents=True)
    (r.proc / "sys" / "kernel" / "osrelease").write_text(rel + "\n")
    d = r.modules / rel
    for name, lines in (("modules.builtin", builtin), ("modules.dep", dep)):
        if lines is not None:
            d.mkdir(parents=True, exist_ok=True)
            (d / name).write_text("".join(line + "\n" for line in lines))
    if loaded is not None:
        (r.proc / "modules").write_text("".join(f"{m} 49152 0 - Live 0x0000000000000000\n" for m in loaded))
    for m in sysmod:
        (r.sys / "module" / m / "parameters").mkdir(parents=True)
    if boot_config is not None:
        r.boot.mkdir(parents=True, exist_ok=True)
        (r.boot / f"config-{rel}").write_text(boot_config)
    if config_gz is not None:
        with gzip.open(r.proc / "config.gz", "wt") as f:
            f.write(config_gz)
    return r


def test_debian_61_has_sch_fq_as_a_module_and_fq_codel_built_in(tmp_path):
    r = tree(tmp_path, builtin=["kernel/net/sched/sch_fq_codel.ko"],
             dep=["kernel/net/sched/sch_htb.ko:", "kernel/net/sched/sch_fq.ko:", "kernel/net/sched/cls_bpf.ko:",
                  "kernel/net/sched/sch_fq_pie.ko: kernel/net/sched/sch_pie.ko"])
    ev = evidence_all(r)
    assert (ev["sch_fq"].state, ev["sch_fq"].evidence) == (PRESENT, f"loadable (modules.dep of {REL})")
    assert ev["sch_htb"].state == PRESENT and ev["cls_bpf"].state == PRESENT
    # Both files of this release are readable and neither lists cls_u32: absent, naming them.
    assert (ev["cls_u32"].state, ev["cls_u32"].evidence) == (ABSENT, f"not in modules.builtin or modules.dep of {REL}")
    assert ev["sch_mq"].state == PRESENT  # obj-y: never in either file, always there


@pytest.mark.parametrize("suffix", [".ko.xz", ".ko.zst", ".ko.gz"])
def test_compressed_modules_count(tmp_path, suffix):
    ev = evidence_all(tree(tmp_path, builtin=[], dep=[f"kernel/net/sched/sch_fq{suffix}:"]))
    assert ev["sch_fq"].state == PRESENT


def test_built_in_per_modules_builtin(tmp_path):
    ev = evidence_all(tree(tmp_path, builtin=["kernel/net/sched/sch_fq.ko"], dep=[]))
    assert (ev["sch_fq"].state, ev["sch_fq"].evidence) == (PRESENT, f"built in (modules.builtin of {REL})")


def test_loaded_now_per_proc_modules_even_without_a_module_tree(tmp_path):
    ev = evidence_all(tree(tmp_path, loaded=["sch_fq", "cls_bpf"]))
    assert ev["sch_fq"].state == PRESENT and "modules" in ev["sch_fq"].evidence
    assert ev["sch_htb"].state == UNKNOWN  # not loaded, and nothing else says


def test_sys_module_entry(tmp_path):
    ev = evidence_all(tree(tmp_path, sysmod=["sch_htb"]))
    assert ev["sch_htb"].state == PRESENT and "/module/sch_htb exists" in ev["sch_htb"].evidence


def test_this_hosts_kernel_config_says_sch_fq_is_not_set(tmp_path):
    # The host VM: no /lib/modules/<release>, no /proc/modules (CONFIG_MODULES unset), /proc/config.gz.
    cfg = "# CONFIG_MODULES is not set\nCONFIG_NET_SCH_HTB=y\n# CONFIG_NET_SCH_FQ is not set\nCONFIG_NET_CLS_BPF=y\n"
    ev = evidence_all(tree(tmp_path, config_gz=cfg, rel="6.18.44-fc-v1045"))
    assert ev["sch_fq"].state == ABSENT
    assert "CONFIG_NET_SCH_FQ is not set" in ev["sch_fq"].evidence and "6.18.44-fc-v1045" in ev["sch_fq"].evidence
    assert "config.gz" in ev["sch_fq"].evidence
    assert ev["sch_htb"].state == PRESENT and ev["cls_bpf"].state == PRESENT
    assert ev["cls_u32"].state == ABSENT  # no line at all: not configured


def test_boot_config_first_and_module_support_matters(tmp_path):
    ev = evidence_all(tree(tmp_path, boot_config="CONFIG_MODULES=y\nCONFIG_NET_SCH_FQ=m\n",
                           config_gz="# CONFIG_NET_SCH_FQ is not set\n"))
    assert ev["sch_fq"].state == PRESENT and f"config-{REL}" in ev["sch_fq"].evidence
    ev = evidence_all(tree(tmp_path / "b", boot_config="CONFIG_NET_SCH_FQ=m\n"))
    assert ev["sch_fq"].state == ABSENT and "CONFIG_MODULES is not set" in ev["sch_fq"].evidence


def test_modules_files_outrank_the_config(tmp_path):
    # modules.builtin/.dep are written by the build of exactly this release; a config may be stale.
    ev = evidence_all(tree(tmp_path, builtin=[], dep=[], boot_config="CONFIG_MODULES=y\nCONFIG_NET_SCH_FQ=m\n"))
    assert ev["sch_fq"].state == ABSENT


def test_no_evidence_is_unknown_not_absent(tmp_path):
    ev = evidence_all(tree(tmp_path, dep=["kernel/net/sched/sch_htb.ko:"]))  # modules.dep alone: not conclusive
    assert ev["sch_fq"].state == UNKNOWN and REL in ev["sch_fq"].evidence
    assert ev["sch_htb"].state == PRESENT


def _assumed(monkeypatch, roots):
    monkeypatch.delenv("SHAPERD_CLASSIFIER", raising=False)
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (True, ""))
    monkeypatch.setattr(bpf_classify, "probe_load", lambda root, read_only=False: ("pins", "through bpffs pins under /x"))
    monkeypatch.setattr(edt_prog, "probe_load", lambda root, read_only=False: (True, "adopted through bpffs pins under /x"))
    return probe._assumed("capability probe skipped (EPERM)", str(roots.proc), "/x", roots, checks=engine_probe.program_checks())


CFG = load_text("""node:
  dataplane: edt
  capacity: 10Gbps
tenants:
  - name: a
    bandwidthGuarantee: 1Gbps
    match: {cidrs: [198.18.1.0/24]}
""")


def test_absent_sch_fq_is_not_offered_and_the_warning_gives_the_evidence(monkeypatch, tmp_path):
    caps = _assumed(monkeypatch, tree(tmp_path, config_gz="CONFIG_NET_CLS_BPF=y\n# CONFIG_NET_SCH_FQ is not set\n"))
    assert caps.fq is False and caps.mq is True
    assert caps.kind("sch_fq")[0] == ABSENT
    assert edt_missing(caps)[0].startswith("sch_fq missing (CONFIG_NET_SCH_FQ is not set in ")
    planes, warnings = select(CFG, [Link("up0", 7, tx_queues=4)], caps)
    assert planes == {"up0": "htb"} and "CONFIG_NET_SCH_FQ is not set" in warnings[0]


def test_unknown_sch_fq_is_offered_and_said_to_be_verified_at_apply(monkeypatch, tmp_path):
    caps = _assumed(monkeypatch, tree(tmp_path))
    assert caps.fq and caps.mq and edt_missing(caps) == []
    assert any("sch_fq unknown" in n and "verified when first applied" in n for n in caps.notes), caps.notes
    assert select(CFG, [Link("up0", 7, tx_queues=4)], caps)[0] == {"up0": "edt"}


def test_present_sch_fq_is_offered_from_evidence(monkeypatch, tmp_path):
    caps = _assumed(monkeypatch, tree(tmp_path, builtin=[], dep=["kernel/net/sched/sch_fq.ko:",
                                                                 "kernel/net/sched/cls_bpf.ko:"]))
    assert caps.fq and caps.mq
    assert any(n.startswith("edt: sch_fq present: loadable (modules.dep of") for n in caps.notes), caps.notes


def test_absent_cls_bpf_means_no_edt(monkeypatch, tmp_path):
    caps = _assumed(monkeypatch, tree(tmp_path, builtin=[], dep=["kernel/net/sched/sch_fq.ko:"]))
    assert caps.bpf is False and "cls_bpf/bpf() unavailable" in edt_missing(caps)
    assert any(n.startswith("cls_bpf unavailable (cls_bpf absent: not in modules.builtin") for n in caps.notes)


@pytest.mark.parametrize("state, offered", [("absent", False), ("present", True)])
def test_where_the_files_say_nothing_the_kernels_own_answer_decides(monkeypatch, tmp_path, state, offered):
    from shaperd.kernel import kind_ask

    asked = []

    def ask(kind, *a, **kw):
        asked.append(kind)
        return kind_ask.KindAnswer(kind, state, f"the kernel said {state}")

    monkeypatch.setattr(kind_ask, "ask", ask)
    caps = _assumed(monkeypatch, tree(tmp_path))  # no evidence in the files: unknown, so the kernel is asked
    assert asked == ["fq"]
    assert caps.fq is offered and (edt_missing(caps) == []) is offered
    assert dict((m, s) for m, s, _ in caps.kinds)["sch_fq"] == state
    ev = dict((m, e) for m, _, e in caps.kinds)["sch_fq"]
    assert ev.startswith(f"the kernel said {state} (the kernel's files: ") and "verified" not in " ".join(caps.notes)


def test_the_kernel_is_not_asked_where_the_files_tell(monkeypatch, tmp_path):
    from shaperd.kernel import kind_ask

    monkeypatch.setattr(kind_ask, "ask", lambda kind, *a, **kw: pytest.fail("asked although the files tell"))
    caps = _assumed(monkeypatch, tree(tmp_path, builtin=[], dep=["kernel/net/sched/sch_fq.ko:",
                                                                 "kernel/net/sched/cls_bpf.ko:"]))
    assert caps.fq


def test_no_answer_keeps_unknown_and_says_what_the_kernel_answered(monkeypatch, tmp_path):
    caps = _assumed(monkeypatch, tree(tmp_path))  # the unit-test default: the kernel gives no answer
    ev = dict((m, e) for m, _, e in caps.kinds)["sch_fq"]
    assert "asking the kernel: not asked in unit tests" in ev
    assert caps.fq and any("sch_fq unknown" in n and "verified when first applied" in n for n in caps.notes)


def test_the_cli_flags_point_the_evidence_at_other_trees(tmp_path):
    from shaperd.cli import main as cli
    from shaperd.cli import node

    r = tree(tmp_path, builtin=[], dep=["kernel/net/sched/sch_fq.ko:"])
    args = cli.build_parser().parse_args(["plan", "--procfs-root", str(r.proc), "--sysfs-root", str(r.sys),
                                          "--modules-root", str(r.modules), "--boot-root", str(r.boot)])
    roots = node.roots(args)
    assert (roots.modules, roots.boot) == (r.modules, r.boot)
    assert evidence_all(roots)["sch_fq"].state == PRESENT  # read from the fixture's modules.dep, not the host's
    defaults = node.roots(cli.build_parser().parse_args(["plan"]))
    assert (str(defaults.modules), str(defaults.boot)) == ("/lib/modules", "/boot")
