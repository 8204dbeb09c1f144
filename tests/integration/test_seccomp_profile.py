"""Every system call the agent makes in a traced run is in the shipped Localhost seccomp profile.

scripts/gen-seccomp-profile's own scenario, run here under strace (root, fresh namespaces, the pod's
capabilities through setpriv): ``shaperd run`` through a reconcile, a metrics scrape, a reload and a stop,
then ``status -o json``, ``diff`` and ``--version``. A call missing from
daemonset/components/seccomp-localhost/agent.json fails the test, naming it (re-run the script).
"""

from __future__ import annotations

import shutil

import pytest

from tests.unit.test_kustomize_seccomp import gen

from .conftest import needs_root

pytestmark = [needs_root, pytest.mark.skipif(not shutil.which("strace") or not shutil.which("setpriv"),
                                             reason="needs strace and setpriv (scripts/setup installs strace)")]


@pytest.mark.slow  # 8-35 s (--durations, quiet)
def test_every_call_the_agent_made_is_allowed_by_the_profile(tmp_path):
    g = gen()
    made = g.trace(work=tmp_path)
    assert {"bpf", "socket", "execve"} <= made, sorted(made)  # the trace saw the agent, and its bpf()
    missing = sorted(made - g.committed())
    assert not missing, f"{g.TARGET.name} lacks {missing}: re-run scripts/gen-seccomp-profile as root"
