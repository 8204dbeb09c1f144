"""The capability probe runs on a thread in an unnamed network namespace of its own (root: unshare(2)).

Its name sweep is unit-tested (tests/unit/test_probe_netns.py); this asks the kernel.
"""

from __future__ import annotations

import os

import pytest

from shaperd.engine import probe as engine_probe
from shaperd.kernel import probe


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
