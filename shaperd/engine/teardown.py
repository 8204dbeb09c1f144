"""What a teardown keeps of the backends' "nothing desired", and how it says what it could not do.

Each backend's ``teardown(observed)`` returns every target it found (the
protocol, core/protocol.py). Here, once for all of them:

- ``kept``: the targets worth reporting: removals to apply, an unreadable
  target, one deliberately left alone, or a note; an empty one is dropped;
- ``unreadable``: a target that could not be read fails the teardown, in
  words that name the backend, the device, the cause and what of the
  backend's may remain there (its ``teardown_remains``), so the operator
  never reads "0 changed" off a node that still carries shaperd's state.

The loop that applies and records lives in the reconciler (Reconciler.teardown). Pure.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff

# A backend that does not say what it leaves behind.
DEFAULT_REMAINS = "what it owns there"


def kept(diffs: list[TargetDiff]) -> list[TargetDiff]:
    """The targets a teardown applies or reports: with removals, an error or ``blocked``."""
    return [td for td in diffs if td.ops or td.error or td.blocked]


def remains(backend) -> str:
    return getattr(backend, "teardown_remains", DEFAULT_REMAINS)


def unreadable(name: str, what_remains: str, target: str, error: str) -> str:
    """'teardown htb on up0: could not read it (read classes on up0: ...): its root qdisc ... may remain'."""
    return f"teardown {name} on {target}: could not read it ({error}): {what_remains} may remain"


def backend_unreadable(name: str, what_remains: str, error: str) -> str:
    """A backend that failed as a whole (its node-wide read, or a bug): nothing of it was torn down."""
    return f"teardown {name}: {error}: {what_remains} may remain on any device"

