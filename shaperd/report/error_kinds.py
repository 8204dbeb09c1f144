"""Which kind of error a reconcile hit, as the label of ``shaperd_reconcile_errors_total``.

Owns the fixed set of kinds (label values stay few) and the two ways to
classify: a finished reconcile's Report (``report_error_kinds``) and an
exception that stopped one (``exception_kind``).

Must not: count anything (health.AgentState does) or import the reconciler;
a Report is read through the attributes named below only.
"""

from __future__ import annotations

ERROR_KINDS = ("netlink", "discovery", "internal", "device_read", "kernel_write", "foreign_qdisc", "plan")


def report_error_kinds(rep) -> set[str]:
    """Which kinds of error a reconciler Report carries.

    Reads ``rep.problems`` (config problems for this node) and, for each of
    ``rep.devices``, ``.error`` (its state could not be read), ``.failed``
    (writes the kernel refused) and ``.blocked`` (a qdisc shaperd does not own).
    """
    kinds = set()
    if rep.problems:
        kinds.add("plan")
    for d in rep.devices:
        if d.error:
            kinds.add("device_read")
        if d.failed:
            kinds.add("kernel_write")
        if d.blocked:
            kinds.add("foreign_qdisc")
    return kinds


def exception_kind(e: Exception) -> str:
    """The kind of an exception that ended a reconcile before it produced a Report."""
    from shaperd.core.errors import DiscoveryError, KernelError

    if isinstance(e, KernelError):
        return "netlink"
    if isinstance(e, DiscoveryError):
        return "discovery"
    return "internal"
