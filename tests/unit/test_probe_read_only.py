"""The read-only capability probe (``shaperd plan`` as root): the same tests, nothing written to the node.

A full probe sweeps older versions' probe namespaces from <run>/netns and pins a throwaway set under
the bpffs root (then removes it); the read-only one does neither and checks instead whether pinning
would work (bpf_pins.pinnable). No kernel here: the namespace call and the loads are replaced.
"""

from __future__ import annotations

import errno
import os

import pytest

from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.core.inventory import Capabilities
from shaperd.engine import probe as engine_probe
from shaperd.kernel import bpf, bpf_pins, kind_ask, probe


@pytest.fixture
def loads(monkeypatch):
    """Record how the classifier and stamper probes were asked; cls_bpf loads."""
    seen: dict[str, list] = {"classifier": [], "stamper": []}
    monkeypatch.setattr(bpf, "bpf_supported", lambda: (True, "ok"))
    monkeypatch.setattr(bpf_classify, "probe_load",
                        lambda root, read_only=False: seen["classifier"].append((root, read_only)) or ("pins", "ok"))
    monkeypatch.setattr(edt_prog, "probe_load",
                        lambda root, read_only=False: seen["stamper"].append((root, read_only)) or (True, "ok"))
    monkeypatch.delenv("SHAPERD_CLASSIFIER", raising=False)
    return seen


@pytest.fixture
def no_netns(monkeypatch):
    def refuse():
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(probe, "unshare_netns", refuse)
    # sch_fq unknown from the (empty) files: the kernel would be asked (a request it refuses); not here.
    monkeypatch.setattr(kind_ask, "ask",
                        lambda kind, *a, **kw: kind_ask.KindAnswer(kind, kind_ask.NO_ANSWER, "not asked"))


def test_read_only_without_a_probe_namespace_sweeps_nothing_and_pins_nothing(monkeypatch, tmp_path, loads, no_netns):
    monkeypatch.setattr(probe, "sweep_stale", lambda d: pytest.fail(f"swept {d} in a read-only probe"))
    caps = probe.probe_capabilities(str(tmp_path), run_root=str(tmp_path / "run"), bpffs_root="/x/bpf",
                                    checks=engine_probe.program_checks(), read_only=True)
    assert loads == {"classifier": [("/x/bpf", True)], "stamper": [("/x/bpf", True)]}
    assert caps.bpf_maps and caps.bpf_adopt == "pins" and caps.bpf_pin_root == "/x/bpf"  # as the full probe says


def test_the_full_probe_still_sweeps_and_tests_pins(monkeypatch, tmp_path, loads, no_netns):
    swept = []
    monkeypatch.setattr(probe, "sweep_stale", lambda d: swept.append(d) or [])
    probe.probe_capabilities(str(tmp_path), run_root=str(tmp_path / "run"), bpffs_root="/x/bpf",
                             checks=engine_probe.program_checks())
    assert swept == [tmp_path / "run" / "netns"]
    assert loads == {"classifier": [("/x/bpf", False)], "stamper": [("/x/bpf", False)]}


@pytest.mark.parametrize("read_only", [True, False])
def test_the_probe_thread_passes_read_only_on(monkeypatch, read_only):
    got = []
    monkeypatch.setattr(probe, "unshare_netns", lambda: None)  # stay here: _probe itself is replaced
    monkeypatch.setattr(probe, "_probe", lambda root, checks, ro: got.append((root, ro)) or Capabilities())
    box: dict = {}
    probe._in_own_netns(box, "/x/bpf", probe.NO_CHECKS, read_only)
    assert got == [("/x/bpf", read_only)] and "caps" in box


MOUNTINFO = r"""22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/root rw
23 22 0:22 / /sys rw,nosuid shared:2 - sysfs sysfs rw
24 23 0:23 / /sys/fs/bpf rw,nosuid shared:3 - bpf bpf rw,mode=700
40 22 0:40 / /srv/my\040pins rw - bpf bpf rw
41 22 0:41 / /srv/over rw - bpf bpf rw
42 22 0:42 / /srv/over rw - tmpfs tmpfs rw
"""


@pytest.fixture
def mountinfo(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return path


def test_pinnable_reads_the_filesystem_from_the_mount_table(mountinfo, tmp_path):
    # No directory is made or written: only the mount table (and, on a bpffs, the permissions) are read.
    ok, why = bpf_pins.pinnable("/sys/kernel", mountinfo)
    assert not ok and why == "/sys/kernel is not on a bpffs (/sys is sysfs)"
    ok, why = bpf_pins.pinnable("/srv/over", mountinfo)  # the last mount on a mount point is the one seen
    assert not ok and "(/srv/over is tmpfs)" in why
    ok, why = bpf_pins.pinnable(tmp_path / "nowhere", tmp_path / "absent")
    assert not ok and why.startswith("read mount table ")


def test_pinnable_undoes_mountinfo_escapes(mountinfo, monkeypatch):
    monkeypatch.setattr(os.path, "realpath", lambda p: str(p))
    checked = []
    monkeypatch.setattr(os, "access", lambda p, mode, effective_ids=False: checked.append((str(p), effective_ids))
                        or True)
    ok, why = bpf_pins.pinnable("/srv/my pins", mountinfo)
    assert ok, why
    assert checked == [("/srv/my pins", True)]  # <root>/shaperd does not exist yet: root itself must be writable



def test_pinnable_checks_shaperds_own_directory_once_it_exists(tmp_path, monkeypatch):
    root = tmp_path / "fs"
    (root / "shaperd").mkdir(parents=True)
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO + f"50 22 0:50 / {os.path.realpath(root)} rw - bpf bpf rw\n")
    checked = []
    monkeypatch.setattr(os, "access", lambda p, mode, effective_ids=False: checked.append(str(p)) or True)
    assert bpf_pins.pinnable(root, table)[0]
    assert checked == [str(root / "shaperd")]
    assert sorted(p.name for p in root.iterdir()) == ["shaperd"] and not any((root / "shaperd").iterdir())


def test_pinnable_says_why_a_directory_is_not_writable(mountinfo, monkeypatch):
    monkeypatch.setattr(os.path, "realpath", lambda p: str(p))
    monkeypatch.setattr(os, "access", lambda p, mode, effective_ids=False: False)
    ok, why = bpf_pins.pinnable("/srv/my pins", mountinfo)
    assert not ok and why == "/srv/my pins: not writable by this process (file permissions of the bpffs directory)"
