"""The capability probe leaves nothing on the node, whenever the process dies (issue 14: kill anywhere).

Measured before: processes killed during start-up left their probe's named
namespace (``shaperd-probe-PID``) behind, 2 times in 20 trials. The probe now
runs on a thread in an unnamed namespace; stale names of older versions are
swept when their PID is dead.
"""

from __future__ import annotations

import os

import pytest

from shaperd.engine import probe as engine_probe
from shaperd.kernel import probe


def test_sweep_removes_only_probe_namespaces_of_dead_processes(tmp_path):
    dead = 1
    while True:  # a pid that is not running now
        dead += 7919
        try:
            os.kill(dead, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            continue
    for name in (f"shaperd-probe-{dead}", f"shaperd-probe-{os.getpid()}", "shaperd-probe-x", "tenant-ns"):
        (tmp_path / name).write_text("")
    assert probe.sweep_stale(tmp_path) == [f"shaperd-probe-{dead}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"shaperd-probe-{os.getpid()}", "shaperd-probe-x", "tenant-ns"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare of a network namespace)")
def test_probe_runs_in_an_unnamed_namespace_of_its_own(monkeypatch):
    seen = {}
    ours = os.readlink("/proc/thread-self/ns/net")
    names_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    real = probe._probe

    def spy(*a):  # the bpffs root (None here)
        seen["ns"] = os.readlink("/proc/thread-self/ns/net")
        seen["names"] = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        return real(*a)

    monkeypatch.setattr(probe, "_probe", spy)
    caps = probe.probe_capabilities(checks=engine_probe.program_checks())
    assert caps.htb
    assert seen["ns"] != ours  # not the node's namespace
    # and no name for it while it ran: nothing to leak (other namespaces may come and go on a shared machine)
    assert not {n for n in seen["names"] - names_before if n.startswith(probe.LEGACY_PREFIX)}
    assert os.readlink("/proc/thread-self/ns/net") == ours
