"""One reconcile of this node, shown or done: ``plan``, ``diff``, ``apply`` and ``teardown``.

- ``plan``: the desired state as the equivalent tc (and ip link, devlink,
  dcb) commands, for this kernel's capabilities as ``diff`` and ``apply``
  find them (probed when root; the probe writes nothing to the node: it
  tests in a network namespace of its own); writes nothing.
- ``diff``: what ``apply`` would change; exits like ``kubectl diff`` (0 in
  sync, 1 changes pending, 2 bad input, 3 a device unreadable or left alone).
- ``apply``: reconcile once and exit, printing what changed (``-o json|yaml``:
  diff's object of what was done, with the exit code).
- ``teardown``: remove what shaperd owns and nothing else; ``--dry-run``
  prints the same removals as "would ..." and sends none.

diff, apply and teardown print their Report the same way (``_print_outcomes``,
``outcomes_result`` for -o json|yaml). Problems go to stderr as ``shaperd:
...`` lines (core/exitcodes.err).
"""

from __future__ import annotations

from shaperd.cli.errout import fail_from
from shaperd.cli.node import node_opts
from shaperd.cli.node import reconciler as _reconciler
from shaperd.core import format as output
from shaperd.core.config import load_file
from shaperd.core.errors import ConfigError, ShaperdError
from shaperd.core.exitcodes import EXIT_BAD_INPUT, EXIT_DIFF_ERROR, EXIT_DIFF_PENDING, EXIT_FAILED, EXIT_OK, err

TAKE_OVER_HELP = "replace a root qdisc shaperd does not own"


def register(sub) -> None:
    p = sub.add_parser("plan", help="print the desired state as equivalent tc commands (no root needed)")
    node_opts(p)
    output.add_output(p, "text: tc commands (default); json|yaml: the planned objects")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("diff", help="print what apply would change on this node; exit 0 in sync, 1 changes "
                       "pending, 2 bad input, 3 a device unreadable or left alone")
    node_opts(p)
    output.add_output(p)
    p.add_argument("--take-over", action="store_true", help=TAKE_OVER_HELP)
    p.set_defaults(fn=cmd_diff)

    p = sub.add_parser("apply", help="reconcile once and exit; prints what changed")
    node_opts(p)
    output.add_output(p, "text: what changed (default); json|yaml: the same as diff's object, of what was done")
    p.add_argument("--take-over", action="store_true", help=TAKE_OVER_HELP)
    p.set_defaults(fn=cmd_apply)

    p = sub.add_parser("teardown", help="remove what shaperd owns and nothing else")
    node_opts(p, config=False)
    p.add_argument("--dry-run", action="store_true", help="print what would be removed; send nothing")
    output.add_output(p)
    p.set_defaults(fn=cmd_teardown)


def plan_warnings(plan) -> list[str]:
    """The plan's warnings and, after them, every refused pod annotation value (these commands run once:
    each is printed; the daemon logs each once, engine/annotations.py)."""
    return list(plan.warnings) + [a.warning() for a in plan.tenancy.invalid_annotations]


def _print_plan_notes(plan, caps) -> None:
    for note in caps.notes:
        print(f"# note: {note}")
    for w in plan_warnings(plan):
        print(f"# warning: {w}")


def _print_problems(plan) -> None:
    for pr in plan.problems:
        err(f"device not shaped: {pr}")


def cmd_plan(args) -> int:
    from shaperd.backends.htb.plan import HtbPlan
    from shaperd.backends.htb.render import render

    cfg = load_file(args.config)
    rec = _reconciler(args, read_only=True)  # probed as diff and apply probe (when root), writing nothing
    p = rec.plan(cfg)
    if output.machine(args):
        output.emit({"notes": list(rec.capabilities.notes), "warnings": plan_warnings(p),
                     "problems": [str(pr) for pr in p.problems], "desired": p.desired}, args)
        return EXIT_BAD_INPUT if p.problems else EXIT_OK
    _print_plan_notes(p, rec.capabilities)
    marks = p.desired["marks"].marks if "marks" in p.desired else ()
    print(render(p.desired.get("htb", HtbPlan()), marks), end="")
    # Other backends (VF rates, devlink, DCB, ...) print their writes as equivalent command lines.
    for b in rec.enabled:
        if b.name not in ("htb", "marks") and hasattr(b, "render") and b.name in p.desired:
            text = b.render(p.desired[b.name])
            if text:
                print(text, end="" if text.endswith("\n") else "\n")
    _print_problems(p)
    return EXIT_BAD_INPUT if p.problems else EXIT_OK


def cmd_diff(args) -> int:
    """Like ``kubectl diff``: 0 in sync, 1 changes pending, 2 bad input, 3 a device unreadable or left alone."""
    cfg = load_file(args.config)
    try:
        rec = _reconciler(args)
        rep = rec.diff(cfg)
    except ShaperdError as e:  # not ConfigError (that is bad input, exit 2): the node could not be read
        if isinstance(e, ConfigError):
            raise
        return fail_from(args, e, EXIT_DIFF_ERROR)
    if output.machine(args):
        output.emit(outcomes_result(rep, planned=True), args)
    else:
        _print_outcomes(rep, planned=True)
    return diff_exit(rep)


def diff_exit(rep) -> int:
    if rep.problems:
        return EXIT_BAD_INPUT
    if any(d.error or d.blocked or d.failed for d in rep.devices):
        return EXIT_DIFF_ERROR
    return EXIT_DIFF_PENDING if rep.changes else EXIT_OK


def outcomes_result(rep, planned: bool) -> dict:
    """diff's and teardown's -o json|yaml object: per target what would change (``planned``) or what did."""
    head = {"in_sync": rep.changes == 0 and rep.ok} if planned else {}
    return {**head, "ok": rep.ok, "changes": rep.changes, "duration_s": round(rep.duration_s, 6),
            "warnings": plan_warnings(rep.plan), "problems": [str(p) for p in rep.plan.problems],
            "targets": [{"backend": d.backend, "device": d.device, "ops": [op.describe() for op in d.ops],
                         "failed": [str(e) for _, e in d.failed], "blocked": d.blocked, "error": d.error}
                        for d in rep.devices]}


def cmd_apply(args) -> int:
    cfg = load_file(args.config)
    rec = _reconciler(args)
    rep = rec.apply(cfg)
    if output.machine(args):
        _print_errors(rep)  # stderr says what failed in every format; stdout holds the one object
        output.emit({**outcomes_result(rep, planned=False), "exit_code": _exit(rep)}, args)
    else:
        _print_outcomes(rep, planned=False)
    return _exit(rep)


def _print_errors(rep) -> None:
    for d in rep.devices:
        if d.error:
            err(d.error)
        if d.blocked:
            err(f"{d.device}: {d.blocked}")
        for op, e in d.failed:
            err(str(e))
    _print_problems(rep.plan)


def _exit(rep) -> int:
    if rep.problems:
        return EXIT_BAD_INPUT
    return EXIT_OK if rep.ok else EXIT_FAILED


def _print_outcomes(rep, planned: bool) -> None:
    for w in plan_warnings(rep.plan):
        print(f"warning: {w}")
    for d in rep.devices:
        if d.error:
            err(d.error)
        if d.blocked:
            err(f"{d.device}: {d.blocked}")
        for op in d.ops:
            print(("would " if planned else "") + op.describe())
        for op, e in d.failed:
            err(str(e))
    _print_problems(rep.plan)
    verb = "would change" if planned else "changed"
    print(f"{rep.changes} {verb}; {len(rep.planned_devices)} device(s) planned in {rep.duration_s * 1000:.1f} ms")


def cmd_teardown(args) -> int:
    """Remove what shaperd owns; ``--dry-run``: the same removals, printed as "would ...", none sent.

    Exit 1 when a target could not be read or a removal failed: shaperd's state may remain there (each
    such target is named on stderr), so "N changed" with exit 0 means nothing of shaperd's is left."""
    rec = _reconciler(args, probe=False, teardown=True)
    rep = rec.teardown(dry_run=args.dry_run)
    notes = [d.note for d in rep.devices if d.note]
    if output.machine(args):
        output.emit({"dry_run": args.dry_run, **outcomes_result(rep, planned=args.dry_run), "notes": notes}, args)
    else:
        for note in notes:
            print(note)
        _print_outcomes(rep, planned=args.dry_run)
        failed = sorted({f"{d.backend} on {d.device}" for d in rep.devices if d.error or d.blocked or d.failed})
        if failed:
            err(f"teardown incomplete: {len(failed)} target(s) not torn down ({', '.join(failed)}); "
                "shaperd's state may remain there")
    return EXIT_OK if rep.ok else EXIT_FAILED
