"""What a teardown keeps of the backends' "nothing desired", and how it says what it could not do.

Each backend's ``teardown(observed)`` returns every target it found (the
protocol, core/protocol.py). Here, once for all of them:

- ``kept``: the targets worth reporting: removals to apply, an unreadable
  target, one deliberately left alone, or a note; an empty one is dropped;
- ``unreadable``: a target that could not be read fails the teardown, in
  words that name the backend, the device, the cause and what of the
  backend's may remain there (its ``teardown_remains``), so the operator
  never reads "0 changed" off a node that still carries shaperd's state;
- ``clsacts``: the clsact qdiscs as they were before any backend removed
  its filters, and the removal of those that held only shaperd's
  (backends/common/clsact.py says why that is the rule).

The loop that applies and records lives in the reconciler (Reconciler.teardown). Pure,
apart from ``clsacts`` reading the node through the kernel layer's reader.
"""

from __future__ import annotations

from shaperd.backends.common import clsact
from shaperd.core.protocol import TargetDiff

# A backend that does not say what it leaves behind.
DEFAULT_REMAINS = "what it owns there"
# The clsact qdiscs are shared ground, not a backend's: their outcomes are reported under this name.
CLSACT = "clsact"
CLSACT_REMAINS = "a clsact qdisc shaperd added"


def kept(diffs: list[TargetDiff]) -> list[TargetDiff]:
    """The targets a teardown applies or reports: with removals, an error, ``blocked`` or a note."""
    return [td for td in diffs if td.ops or td.error or td.blocked or td.note]


def remains(backend) -> str:
    return getattr(backend, "teardown_remains", DEFAULT_REMAINS)


def unreadable(name: str, what_remains: str, target: str, error: str) -> str:
    """'teardown htb on up0: could not read it (read classes on up0: ...): its root qdisc ... may remain'."""
    return f"teardown {name} on {target}: could not read it ({error}): {what_remains} may remain"


def backend_unreadable(name: str, what_remains: str, error: str) -> str:
    """A backend that failed as a whole (its node-wide read, or a bug): nothing of it was torn down."""
    return f"teardown {name}: {error}: {what_remains} may remain on any device"


def clsact_owners(backends) -> dict:
    """backend name -> its ``owns_clsact_filter``, for the backends that attach to clsact."""
    return {b.name: b.owns_clsact_filter for b in backends if hasattr(b, "owns_clsact_filter")}


def clsacts(reads, inv, backends) -> list[clsact.Clsact]:
    """Every clsact on the node as it is now, its filters sorted by owner (read before any removal)."""
    owners = clsact_owners(backends)
    if not owners:
        return []
    return clsact.read(reads, {l.ifindex: l.name for l in inv.links}, owners)


def clsact_diffs(found: list[clsact.Clsact], backends) -> list[tuple[object | None, TargetDiff]]:
    """(the backend whose ``apply`` deletes it, or None, the diff) per clsact kept: removals, errors, notes."""
    by_name = {b.name: b for b in backends}
    return [(by_name.get(owner) if owner else None, td) for owner, td in clsact.teardown(found)]
