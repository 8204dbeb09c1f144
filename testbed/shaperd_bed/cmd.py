"""Running external commands for the bed, optionally inside a network namespace.

Every command is an argument list (never a shell string).  Commands that run
inside a namespace are wrapped in ``ip netns exec NS``, which execs the
command directly (no extra fork), so a returned pid is the command's pid.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

IP = "ip"
TC = "tc"


class CommandError(RuntimeError):
    """A command the bed needed failed; carries argv, rc and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"command failed (rc={returncode}): {' '.join(self.argv)}: {stderr.strip()}")


def in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    """Return *argv* wrapped so that it runs inside *netns* (or as is if None)."""
    if netns is None:
        return list(argv)
    return [IP, "netns", "exec", netns, *argv]


def run(argv: Sequence[str], netns: str | None = None, *, check: bool = True,
        timeout: float = 30.0, input: str | None = None) -> subprocess.CompletedProcess:
    """Run a short command to completion and return its CompletedProcess (text)."""
    full = in_netns(netns, argv)
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise CommandError(full, proc.returncode, proc.stderr)
    return proc


def have(program: str) -> bool:
    """True if *program* is on PATH."""
    return shutil.which(program) is not None
