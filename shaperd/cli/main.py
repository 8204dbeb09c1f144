"""The ``shaperd`` command line: one entry point, one subcommand per job.

Exit codes (core/exitcodes.py): 0 done (including "nothing to change"); 1
some kernel write or device failed (the others were still enforced); 2 bad
input (tenants file, arguments): nothing in the kernel was changed. ``diff``
follows ``kubectl diff`` instead: 0 in sync, 1 changes pending, 2 bad input,
3 a device could not be read or is left alone (a root qdisc shaperd does not own).

This module owns the root parser (its global options), the dispatch and the
mapping of errors to exit codes. Each command group is a module of this
package with a ``register(subparsers)``, listed in ``GROUPS`` in the order
``--help`` shows them (a new group is one module and one line here): config
(check-config), reconcile (plan, diff, apply, teardown), run, status
(status, top), rdma (rdma ...), meta (completion; ``--version`` is a root
option), webhook, demo. Read commands take ``-o text|json|yaml`` (core/format.py).

Log lines (core/log.py) go to stderr from the daemons, ``run`` and
``webhook`` (their groups set ``log_lines``), and from any other command
only when asked for with ``--log-json`` or ``--log-level``. The root's options
are accepted after the subcommand as well (``global_options``); there the later
value wins. Under ``-o json|yaml`` a failure is also one object on stdout
(cli/errout.py), argparse's usage errors included. Otherwise a
command says what happened in its output and its problems as plain
``shaperd: ...`` lines on stderr (core/exitcodes.err), nothing else.
"""

from __future__ import annotations

import argparse
import sys

from shaperd.cli import config, demo, meta, rdma, reconcile, run, status, webhook
from shaperd.core import log
from shaperd.cli.errout import Parser, UsageError, fail_from
from shaperd.core.errors import ConfigError, ShaperdError
from shaperd.core.exitcodes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

GROUPS = (config, reconcile, run, status, rdma, meta, webhook, demo)


def global_options(p, root: bool) -> None:
    """The root parser's options. Every subcommand's parser gets them too (``root`` False), with defaults
    suppressed: given after the subcommand a value overrides the one before it, absent it leaves it alone."""
    dflt = (lambda v: v) if root else (lambda v: argparse.SUPPRESS)
    g = p if root else p.add_argument_group("global options (also accepted before the subcommand)")
    g.add_argument("--version", action=meta.VersionAction,
                   help="print version, git commit, Python and pyroute2, and exit")
    g.add_argument("--log-json", dest="log_json", action="store_true", default=dflt(None),
                   help="JSON log lines (default when stderr is not a terminal); commands other than run and "
                        "webhook write log lines only when given this or --log-level")
    g.add_argument("--log-level", default=dflt(None), choices=["debug", "info", "warning", "error"],
                   help="log lines at this level and above (default info)")


def _subparsers(p: argparse.ArgumentParser):
    """Every parser below ``p`` (subcommands, and theirs), each once."""
    seen: set[int] = set()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if id(child) not in seen:  # an alias names the same parser again
                    seen.add(id(child))
                    yield child
                    yield from _subparsers(child)


# Commands whose parse needs every group's whole tree. Any other command line gets the rdma group's
# one-line stub instead: its full tree lists every backend's subcommands, so building it imports the
# engine and all backends (0.4 s of a 2 s `shaperd apply`, and seconds of `shaperd status` under TCG).
# Likewise demo's: its tree is the test bed's (shaperd_bed.demo and its scenarios), 1.2 MiB of a
# daemon's RSS where the bed is installed (a developer's venv; never the image).
FULL_TREE = frozenset({"rdma", "completion"})
FULL_DEMO = frozenset({"demo", "completion"})


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The root parser. ``argv`` (the command line it will parse; all of it when None is passed by a
    caller that has none) decides only whether the rdma group is built whole (FULL_TREE)."""
    # Parser: a usage error under -o json|yaml is also the error object on stdout (cli/errout.py). Subparsers
    # are made of the same class (argparse's add_subparsers default), so theirs are too.
    ap = Parser(prog="shaperd", description=__doc__.splitlines()[0])
    global_options(ap, root=True)
    ap.set_defaults(root_parser=ap)  # for `completion`, which prints a script made from this parser
    sub = ap.add_subparsers(dest="cmd", required=True)
    whole = argv is None or not FULL_TREE.isdisjoint(argv)
    whole_demo = argv is None or not FULL_DEMO.isdisjoint(argv)
    for group in GROUPS:
        if group is rdma and not whole:
            rdma.register_stub(sub)
        elif group is demo and not whole_demo:
            demo.register_stub(sub)
        else:
            group.register(sub)
    for p in _subparsers(ap):
        if "-" in p.prefix_chars:  # not demo without the bed: it takes every argument as its own
            global_options(p, root=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    asked = args.log_json is not None or args.log_level is not None
    log.configure(json=args.log_json, level=args.log_level or "info",
                  enabled=asked or getattr(args, "log_lines", False))
    try:
        return args.fn(args)
    except UsageError as e:
        usage = getattr(args, "usage_parser", None)
        if usage is not None:
            usage.print_usage(sys.stderr)
        return fail_from(args, e, EXIT_BAD_INPUT)
    except ConfigError as e:
        return fail_from(args, e, EXIT_BAD_INPUT)
    except ShaperdError as e:  # KernelError and the rest: something failed
        return fail_from(args, e, EXIT_FAILED)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
