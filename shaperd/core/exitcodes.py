"""How a command ends: its exit code, and the one way it says what went wrong on stderr.

Every command: 0 done (including "nothing to change"); 1 some kernel write,
device or file failed (the others were still done); 2 bad input (the
tenants file, arguments): nothing was changed. ``diff`` follows ``kubectl
diff`` instead: 0 in sync, 1 changes pending, 2 bad input, 3 a device could
not be read or is left alone. 130: interrupted (SIGINT).

``err`` prints a problem as one plain ``shaperd: ...`` line (the form
"verb object on device: cause"), never as a log record: log lines belong to
the daemon, or to a command asked for them (shaperd/cli/main.py).

Must not: import anything of shaperd's (every command module imports this).
"""

from __future__ import annotations

import sys

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_DIFF_PENDING, EXIT_DIFF_ERROR = 1, 3  # diff only (kubectl diff: 1 differences, >1 error)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def err(msg: str) -> None:
    """``shaperd: msg`` on stderr."""
    print(f"shaperd: {msg}", file=sys.stderr)
