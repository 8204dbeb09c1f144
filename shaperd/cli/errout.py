"""How a command reports its failure: a ``shaperd: ...`` line on stderr and, under ``-o json|yaml``, one object on stdout.

The object (``error_result``) holds the message, the exit code (core/exitcodes.py,
unchanged by the format) and, for a rejected tenants file, every problem with its
field path, so a script reading stdout learns why as well as that it failed.
``UsageError``: arguments that parse but contradict each other (exit 2, like an
argparse usage error). ``Parser``: the argparse parser every shaperd parser is; its
usage errors (an unknown option, a missing argument, a bad choice) keep argparse's
usage and ``error:`` lines on stderr and, when the command line asks for ``-o
json|yaml`` anywhere (before or after the subcommand), also print the error object
on stdout, with the usage exit code (2).

Must not: decide exit codes (the caller passes them) or touch the node.
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

from shaperd.core import format as output
from shaperd.core.errors import ConfigError, ShaperdError
from shaperd.core.exitcodes import EXIT_BAD_INPUT, err


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


def asked_format(argv: list[str]) -> str | None:
    """The output format a command line asks for (``-o F``, ``-oF``, ``--output F``, ``--output=F``,
    ``--json``; the last one given wins), read from the raw words: a usage error stops argparse before it
    would have parsed them. Words after ``--`` are operands, not options. None: none asked for."""
    fmt = None
    words = list(argv)
    for i, w in enumerate(words):
        if w == "--":
            break
        if w in ("-o", "--output"):
            fmt = words[i + 1] if i + 1 < len(words) else fmt
        elif w.startswith("--output="):
            fmt = w.split("=", 1)[1]
        elif w.startswith("-o") and not w.startswith("--") and len(w) > 2:
            fmt = w[2:].lstrip("=")
        elif w == "--json":
            fmt = "json"
    return fmt


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors also said as the error object on stdout under ``-o json|yaml``.

    ``argv``: the words being parsed (set by the root's ``parse_args``, shared by every subparser made from it,
    since a usage error may be found by any of them)."""

    argv: list[str] = []

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's, recording the words first
        Parser.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str):
        """argparse's usage and ``PROG: error: MESSAGE`` on stderr, then (-o json|yaml) the object on stdout;
        exits 2 (EXIT_BAD_INPUT, argparse's own usage code)."""
        self.print_usage(sys.stderr)
        fmt = asked_format(Parser.argv)
        if fmt in MACHINE:
            output.emit(error_result(f"{self.prog}: {message}", EXIT_BAD_INPUT), SimpleNamespace(output=fmt))
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")
