"""The node's capabilities, probed once at start, with the backends' own programs tried.

kernel/probe.py probes what the kernel offers (qdiscs, classifiers, bpf(), the kernel's evidence
files) and tries the eBPF programs it is handed; the programs are the backends' (the map
classifier, edt's stamper: each spec's ``program_checks``), so the engine hands them down. Callers (the daemon, the CLI, tests)
probe through here.
"""

from __future__ import annotations

from shaperd.core.inventory import Capabilities
from shaperd.engine.registry import REGISTRY
from shaperd.kernel import probe as kernel_probe


def program_checks() -> kernel_probe.ProgramChecks:
    """The registered backends' programs for the probe (their specs' ``program_checks``)."""
    return REGISTRY.program_checks()


def probe_capabilities(**kw) -> Capabilities:
    """kernel/probe.py's probe_capabilities (same arguments) with the backends' program checks."""
    return kernel_probe.probe_capabilities(checks=program_checks(), **kw)
