"""The capability probe leaves nothing on the node, whenever the process dies (issue 14: kill anywhere).

Measured before: processes killed during start-up left their probe's named
namespace (``shaperd-probe-PID``) behind, 2 times in 20 trials. The probe now
runs on a thread in an unnamed namespace; stale names of older versions are
swept when their PID is dead. That the probe really runs in a namespace of its
own is a kernel question: tests/integration/test_probe_netns.py.
"""

from __future__ import annotations

import os

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
