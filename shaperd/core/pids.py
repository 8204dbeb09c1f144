"""Whether a process id is alive: the one check behind the leftovers shaperd sweeps by PID.

Used by kernel/probe.py (legacy ``shaperd-probe-PID`` namespaces) and
kernel/bpf_pins.py (probe pin scopes ``probe-PID``). EPERM means the process
exists (someone else's), so it is alive. No I/O beyond kill(pid, 0).
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
