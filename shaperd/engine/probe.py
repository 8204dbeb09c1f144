"""The node's capabilities, probed once at start, with the backends' own programs tried.

kernel/probe.py probes what the kernel offers (qdiscs, classifiers, bpf(), the kernel's evidence
files) and tries the eBPF programs it is handed; the programs are the backends' (the map
classifier, edt's stamper), so the engine hands them down. Callers (the daemon, the CLI, tests)
probe through here.
"""

from __future__ import annotations

from shaperd.backends.common import kernel_classifier
from shaperd.backends.edt import kernel_stamper
from shaperd.core.inventory import Capabilities
from shaperd.kernel import probe as kernel_probe


def program_checks() -> kernel_probe.ProgramChecks:
    """The backends' programs for the probe (looked up at call time, so a test may replace one)."""
    return kernel_probe.ProgramChecks(
        classifier_attach=lambda ipr, ifindex: kernel_classifier.probe(ipr, ifindex),
        classifier_load=lambda root: kernel_classifier.probe_load(root),
        stamper_load=lambda root: kernel_stamper.probe_load(root),
    )


def probe_capabilities(**kw) -> Capabilities:
    """kernel/probe.py's probe_capabilities (same arguments) with the backends' program checks."""
    return kernel_probe.probe_capabilities(checks=program_checks(), **kw)
