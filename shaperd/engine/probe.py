"""The node's capabilities, probed once at start, with the backends' own programs tried.

kernel/probe.py probes what the kernel offers (qdiscs, classifiers, bpf(), the kernel's evidence
files) and tries the eBPF programs it is handed; the programs are the backends' (the map
classifier, edt's stamper: each spec's ``program_checks``), so the engine hands them down. Callers (the daemon, the CLI, tests)
probe through here.

Where the probe found bpf() refused by a seccomp filter (``Capabilities.bpf_refused``), this is where it is
said, once per probe: one warning log line naming the likely cause (``seccomp_refusal_line``) and the fix.
The same fact makes the node degraded (report/degraded.py) and sets ``shaperd_bpf_syscall_refused``.
"""

from __future__ import annotations

import os

from shaperd.core import log
from shaperd.core.inventory import Capabilities
from shaperd.engine.registry import REGISTRY
from shaperd.kernel import probe as kernel_probe


def program_checks() -> kernel_probe.ProgramChecks:
    """The registered backends' programs for the probe (their specs' ``program_checks``)."""
    return REGISTRY.program_checks()


# Where docs/kubernetes.md explains the refusal and the seccomp-localhost component.
SECCOMP_DOC = "docs/kubernetes.md#bpf-refused-by-seccomp"


def probe_capabilities(**kw) -> Capabilities:
    """kernel/probe.py's probe_capabilities (same arguments) with the backends' program checks; a bpf() refused
    by seccomp is said here, in one warning line."""
    caps = kernel_probe.probe_capabilities(checks=program_checks(), **kw)
    if caps.bpf_refused == kernel_probe.BPF_REFUSED_BY_SECCOMP:
        log.get("shaperd.probe").warning("bpf() refused by seccomp", reason=caps.bpf_refused,
                                         **seccomp_refusal_line())
    return caps


def seccomp_refusal_line(environ=None) -> dict:
    """The warning's fields: the likely cause where this process runs (a pod: the container runtime's
    RuntimeDefault profile; a systemd unit: its SystemCallFilter=), what it costs, and the fix."""
    env = os.environ if environ is None else environ
    effect = ("cls_bpf, the eBPF map classifier, the marks backend and edt are unavailable: classifying with u32, "
              "pods recognised by address only")
    if "KUBERNETES_SERVICE_HOST" in env or "INVOCATION_ID" not in env:
        cause = ("the container runtime's seccomp profile (RuntimeDefault) refuses bpf(): containerd < 1.6.9 "
                 "and CRI-O (containers/common's profile) allow bpf only with CAP_SYS_ADMIN, not CAP_BPF")
        fix = f"use the seccomp-localhost component ({SECCOMP_DOC})"
    else:
        cause = ("the systemd unit's SystemCallFilter= refuses bpf() (systemd's @privileged set holds bpf: "
                 "`systemd-analyze syscall-filter @privileged`)")
        fix = "allow bpf in the unit (SystemCallFilter=bpf after the ~@privileged line; systemd/shaperd.service)"
    return {"cause": cause, "effect": effect, "fix": fix}
