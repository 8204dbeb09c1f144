"""How a command reports its failure: a ``shaperd: ...`` line on stderr and, under ``-o json|yaml``, one object on stdout.

The object (``error_result``) holds the message, the exit code (core/exitcodes.py,
unchanged by the format) and, for a rejected tenants file, every problem with its
field path, so a script reading stdout learns why as well as that it failed.
``UsageError``: arguments that parse but contradict each other (exit 2, like an
argparse usage error).

Must not: decide exit codes (the caller passes them) or touch the node.
"""

from __future__ import annotations

from shaperd.core import format as output
from shaperd.core.errors import ConfigError, ShaperdError
from shaperd.core.exitcodes import err


MACHINE = ("json", "yaml")


class UsageError(ShaperdError):
    """Arguments that contradict each other; reported like argparse's usage errors, exit 2."""


def error_result(message: str, code: int, problems=(), **extra) -> dict:
    """The ``-o json|yaml`` object of a failed command: ``ok`` false, the message, the exit code, the problems."""
    return {**extra, "ok": False, "error": {"message": message, "exit_code": code,
                                            "problems": [{"path": p.path, "message": p.message} if hasattr(p, "path")
                                                         else {"path": "", "message": str(p)} for p in problems]}}


def fail(args, message: str, code: int, problems=(), **extra) -> int:
    """Say ``message`` on stderr; under -o json|yaml also print the error object on stdout. Returns ``code``."""
    err(message)
    if getattr(args, "output", None) in MACHINE:  # not a command's own other formats (rdma env's -o shell)
        output.emit(error_result(message, code, problems, **extra), args)
    return code


def fail_from(args, e: Exception, code: int, **extra) -> int:
    """``fail`` for an exception: a ConfigError's (or OpenSmConfigError's) problems come along."""
    problems = e.problems if isinstance(e, ConfigError) else getattr(e, "problems", ())
    return fail(args, str(e), code, problems, **extra)
