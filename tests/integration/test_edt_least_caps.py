"""Issue 15, gap 3: `node.dataplane: edt` with NET_ADMIN + BPF only, on this host's kernel, which has no sch_fq.

No probe namespace is possible without CAP_SYS_ADMIN, so the probe reads the kernel's files
(kernel/qdisc_kinds.py). Either way the uplinks end on a complete HTB tree with a warning:

- as the host is (/proc/config.gz: "# CONFIG_NET_SCH_FQ is not set"): sch_fq absent, edt never
  offered, a second apply writes nothing;
- with that evidence hidden (a private mount namespace binds a non-gzip file over /proc/config.gz), the
  probe asks the kernel itself (kernel/kind_ask.py): its ENOENT means absent, edt is never tried;
- with the evidence hidden and lo carrying someone's root qdisc (the question gets EEXIST, no answer):
  sch_fq unknown, edt offered; the kernel refuses it at apply (ENOENT "Specified qdisc kind is
  unknown"), on single- and multi-queue devices; the daemon warns once per device, puts
  both on htb in the same reconcile, and its next reconcile writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from tests import procs

from .conftest import PY, needs_root, wait_for

pytestmark = [needs_root, pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")]

LEAST = ["setpriv", "--bounding-set=-all,+net_admin,+bpf", "--inh-caps=-all"]
CFG = """node:
  dataplane: edt
  interfaces: [up0, mq0, sq0]
  capacity: 10Gbps
tenants:
  - name: "tenant-a"
    bandwidthGuarantee: 4Gbps
    bandwidthLimit: 6Gbps
    match: {cidrs: [198.18.1.0/24]}
  - name: "tenant-b"
    bandwidthGuarantee: 2Gbps
    match: {cidrs: [198.18.2.0/24]}
"""
# In its own mount namespace (unshare -m): bind FILE over /proc/config.gz, then exec the rest.
HIDE = ("import os, subprocess, sys; subprocess.run(['mount', '--bind', sys.argv[1], '/proc/config.gz'], check=True, "
        "timeout=30); os.execvp(sys.argv[2], sys.argv[2:])")

needs_config_gz = pytest.mark.skipif(not os.path.exists("/proc/config.gz"), reason="no /proc/config.gz here")


def _no_sch_fq_here() -> bool:
    from shaperd.kernel.qdisc_kinds import ABSENT, evidence_all
    from shaperd.core.roots import Roots

    return evidence_all(Roots())["sch_fq"].state == ABSENT


pytestmark.append(pytest.mark.skipif(not _no_sch_fq_here(), reason="this kernel has sch_fq (the QEMU tier covers it)"))


@pytest.fixture
def mqbed(bed):
    """The bed's up0 (a veth: one TX queue per CPU), a 4-queue veth mq0 and a single-queue veth sq0."""
    bed.exec("ip", "link", "add", "mq0", "numtxqueues", "4", "type", "veth", "peer", "name", "mq1", "numtxqueues", "4")
    bed.exec("ip", "link", "set", "mq0", "up")
    bed.exec("ip", "link", "set", "mq1", "up")
    bed.exec("ip", "link", "add", "sq0", "numtxqueues", "1", "type", "veth", "peer", "name", "sq1", "numtxqueues", "1")
    bed.exec("ip", "link", "set", "sq0", "up")
    bed.exec("ip", "link", "set", "sq1", "up")
    return bed


def _htb_complete(bed, dev: str) -> None:
    qd = json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", dev).stdout)
    roots = [q for q in qd if q.get("root")]
    assert [(q["kind"], q["handle"]) for q in roots] == [("htb", "7368:")], qd
    assert not any(q["kind"] == "mq" or q["handle"].startswith("7365") for q in qd), qd  # nothing of edt's left
    # tc 6.1 prints no JSON for htb classes: the text lines, one per class.
    classes = [l for l in bed.exec("tc", "class", "show", "dev", dev).stdout.splitlines() if l.startswith("class htb 7368:")]
    assert len(classes) >= 4, classes  # the root class, the default class and one per tenant
    assert sum(" leaf " in l and " rate 4Gbit ceil 6Gbit " in l for l in classes) == 1, classes  # tenant-a
    egress = json.loads(bed.exec("tc", "-j", "filter", "show", "dev", dev, "egress").stdout or "[]")
    assert not any("shpe_" in f.get("options", {}).get("bpf_name", "") for f in egress), egress  # no stamper


def _log(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _never_tried(bed, argv: list[str], evidence: str) -> None:
    """One ``shaperd apply``: every uplink on a complete HTB tree, warned with ``evidence``; edt never tried."""
    r = bed.exec(*argv, check=False)
    assert r.returncode == 0, r.stderr
    lines = _log(r.stderr) + _log(r.stdout)
    warned = [x["warning"] for x in lines if x.get("event") == "plan warning"]
    for dev in ("up0", "mq0", "sq0"):
        assert any(w.startswith(f"node.dataplane edt on {dev}: edt unavailable: sch_fq missing ({evidence}")
                   for w in warned), warned
        _htb_complete(bed, dev)
    assert not any(x.get("event") == "edt refused; the device goes to htb" for x in lines)


@needs_config_gz
def test_absent_sch_fq_edt_is_not_offered_htb_everywhere_and_a_second_apply_writes_nothing(mqbed, tmp_path, pinfs):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    argv = [*LEAST, PY, "-m", "shaperd", "--log-json", "apply", "--config", str(cfg), "--bpffs-root", str(pinfs)]
    _never_tried(mqbed, argv, "CONFIG_NET_SCH_FQ is not set in /proc/config.gz")
    again = mqbed.exec(*argv, check=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].startswith("0 "), again.stdout


def _hidden(tmp_path, *argv: str) -> list[str]:
    """``argv`` in a private mount namespace where /proc/config.gz says nothing (the files give no evidence)."""
    fake = tmp_path / "not-a-config.gz"
    fake.write_text("no kernel config here\n")
    return ["unshare", "--mount", "--propagation", "private", PY, "-c", HIDE, str(fake), *argv]


@needs_config_gz
def test_where_the_files_say_nothing_the_kernel_is_asked_and_its_no_means_edt_is_never_tried(mqbed, tmp_path, pinfs):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    lo = mqbed.exec("tc", "-j", "qdisc", "show", "dev", "lo").stdout
    _never_tried(mqbed, _hidden(tmp_path, *LEAST, PY, "-m", "shaperd", "--log-json", "apply", "--config", str(cfg),
                                "--bpffs-root", str(pinfs)), "the kernel answered ENOENT: Specified qdisc kind is unknown")
    assert mqbed.exec("tc", "-j", "qdisc", "show", "dev", "lo").stdout == lo  # the question changed nothing


def test_unknown_sch_fq_is_verified_at_apply_and_the_daemon_falls_back_once(mqbed, tmp_path, pinfs):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    # lo carries someone's root qdisc: the probe's question (never a replace) gets EEXIST, no answer.
    mqbed.exec("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1")
    log = tmp_path / "run.log"
    run = tmp_path / "run"  # where the refusals are kept for `shaperd status` (never the host's /run here)
    argv = _hidden(tmp_path, *LEAST, PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--bpffs-root",
                   str(pinfs), "--metrics-address", "", "--resync-interval", "1", "--run-root", str(run))
    with open(log, "w") as logf:
        p = mqbed.spawn(argv, mqbed.node, stdout=logf, stderr=subprocess.STDOUT, deadline_s=120)
        try:
            def reconciles():
                recs = [r for r in _log(log.read_text()) if r.get("event") == "reconciled"]
                return recs if len(recs) >= 2 else None

            recs = wait_for(reconciles, 60)
            assert recs, log.read_text()[-3000:]
            os.kill(p.pid, signal.SIGTERM)  # unshare, python and setpriv exec: this pid is the agent
            assert p.wait(timeout=30) == 0
        finally:
            procs.stop(p)
    lines = _log(log.read_text())
    caps = next(r["capabilities"] for r in lines if "capabilities" in r)
    assert any("sch_fq unknown" in c and "verified when first applied" in c for c in caps), caps
    assert any("asking the kernel: the kernel answered EEXIST" in c for c in caps), caps
    refused = [r for r in lines if r.get("event") == "edt refused; the device goes to htb"]
    assert sorted(r["device"] for r in refused) == ["mq0", "sq0", "up0"], refused  # one warning per device
    assert all("Specified qdisc kind is unknown" in r["reason"] for r in refused), refused
    recs = [r for r in lines if r.get("event") == "reconciled"]
    assert recs[0]["changes"] > 0 and all(r["changes"] == 0 for r in recs[1:]), recs  # no flapping
    changes = [r["change"] for r in lines if r.get("event") == "kernel change"]
    # mq0: the mq root landed before its sch_fq were refused, and was removed again; sq0's sch_fq root never landed.
    assert any(c.startswith("delete root qdisc 7365: on mq0: edt refused by the kernel") for c in changes), changes
    assert not any("7365: on sq0" in c for c in changes), changes
    assert not any(r.get("event") == "kernel write failed" for r in lines), [r for r in lines if "error" in r]
    for dev in ("up0", "mq0", "sq0"):
        _htb_complete(mqbed, dev)
    # `shaperd status` (another process) says why those uplinks are on htb.
    st = mqbed.exec(*LEAST, PY, "-m", "shaperd", "status", "--config", str(cfg), "--run-root", str(run), "--json",
                    "--interval", "0.05", "--bpffs-root", str(pinfs), check=False)
    got = json.loads(st.stdout.splitlines()[-1])["edt_refused"]
    assert sorted(got) == ["mq0", "sq0", "up0"] and all("Specified qdisc kind is unknown" in r for r in got.values())
    text = mqbed.exec(*LEAST, PY, "-m", "shaperd", "status", "--config", str(cfg), "--run-root", str(run),
                      "--interval", "0.05", "--bpffs-root", str(pinfs), check=False).stdout
    assert "On htb because the kernel refused edt (node.dataplane edt/auto):\n  mq0: the kernel does not know" in text
