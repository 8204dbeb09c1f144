"""``shaperd status``: what each tenant gets, read straight from the kernel, one section per backend.

Works with or without the daemon. The frame samples every section at both ends of a short window
and prints them in their ``order``: each registered backend's sections (its spec's ``status``:
htb's classes and classifier paths, edt's stampers, the NIC backends' configured vs read back),
the tenants' RDMA ports (report/rdma_view.py: what they sent, measured at the HCA) and, last, the
uplinks on htb because the kernel refused edt (engine/refusals_file.py). A section with nothing
on this node has no key and prints nothing; a section whose read fails says so in its place and
the others are still shown. Last, where the caller gives a ``degraded`` function (the CLI: the plan
and read of ``shaperd diff``), the "degraded: ..." line of report/degraded.py, and ``degraded`` in
-o json. Exit 1 when a section could not read a device or a target is left alone, 2 for a plan problem.
"""

from __future__ import annotations

import sys
import time

from shaperd.core import exitcodes
from shaperd.core import format as output
from shaperd.core.protocol import StatusInput

class RdmaSection:
    """The tenants' RDMA ports and what they sent (not a backend: measured at the HCA, never shaped by tc)."""

    order = 30
    key = "rdma"

    def __init__(self, inp: StatusInput, rate_window_s: float):
        from shaperd.core.roots import Roots
        from shaperd.report.rdma_view import RdmaWatch

        self.watch = RdmaWatch.open(Roots.of(sys=str(inp.roots.sys)), inp.config_path, rate_window_s=rate_window_s)

    def sample(self, reader) -> None:
        self.watch.sample(time.monotonic())

    def collect(self, reader) -> dict:
        from shaperd.report.rdma_view import tenant_rows

        self.ports = self.watch.view()
        return {"rdma": tenant_rows(self.ports)}

    def render(self, doc: dict) -> str:
        from shaperd.report.rdma_view import render_table

        return "RDMA ports (measured at the HCA; not shaped by tc):\n" + render_table(self.ports) if self.ports else ""

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class RefusedSection:
    """The uplinks on htb because the kernel refused edt there (what the applying process recorded)."""

    order = 90
    key = "edt_refused"

    def __init__(self, args):
        self.args = args

    def sample(self, reader) -> None:
        pass

    def collect(self, reader) -> dict:
        from shaperd.engine import refusals_file

        return refusals_file.doc(self.args)

    def render(self, doc: dict) -> str:
        from shaperd.engine import refusals_file

        return refusals_file.render(self.args)

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def status_input(args) -> StatusInput:
    """The sections' input from the command's arguments (the tenants file read once, if readable)."""
    from shaperd.core.roots import Roots
    from shaperd.engine import refusals_file
    from shaperd.engine.reconciler import diff_one
    from shaperd.report.rdma_view import load_config

    netns = getattr(args, "netns", None)
    run_root = getattr(args, "run_root", "/run")
    return StatusInput(
        config=load_config(args.config), config_path=args.config,
        roots=Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=run_root, kubelet=args.kubelet_root),
        netns=netns, bpffs_root=getattr(args, "bpffs_root", "") or "", run_root=run_root, diff_one=diff_one,
        refused=refusals_file.read(refusals_file.path_for(run_root, netns)))


def sections_for(inp: StatusInput, args) -> list:
    """Every registered backend's sections, the report's own beside them, in print order."""
    from shaperd.engine.registry import REGISTRY

    out: list = [RdmaSection(inp, args.interval), RefusedSection(args)]
    for spec in REGISTRY.specs:
        if spec.status is not None:
            out.extend(spec.status(inp))
    return sorted(out, key=lambda s: s.order)


def main(args, degraded=None) -> int:
    """``degraded``: None, or a function returning report.degraded.Degraded for this instant (called per window)."""
    from shaperd.kernel.rtnl import RtnlReader

    reader = RtnlReader(getattr(args, "netns", None))
    sections = sections_for(status_input(args), args)
    try:
        return _loop(args, reader, sections, degraded)
    finally:
        for s in sections:
            s.close()


def _collect(s, reader) -> dict:
    """One section's keys for this window; a failing read is that section's error, never the others'."""
    try:
        return s.collect(reader)
    except Exception as e:  # noqa: BLE001 - one backend's failure is shown in its section, not fatal
        return {s.key: {"error": f"{type(e).__name__}: {e}"}}


def _sample_all(sections, reader) -> None:
    for s in sections:
        s.sample(reader)


def _loop(args, reader, sections, degraded=None) -> int:
    _sample_all(sections, reader)
    t0 = time.monotonic()
    while True:
        time.sleep(args.interval)
        _sample_all(sections, reader)
        t1 = time.monotonic()
        doc: dict = {"window_s": round(t1 - t0, 3)}
        for s in sections:
            doc.update(_collect(s, reader))
        errors = [e for s in sections for e in s.errors()]
        deg = degraded() if degraded is not None else None  # plan problems and targets left alone
        if deg is not None:
            doc["degraded"] = deg.doc()
        if output.machine(args):  # -o json: one compact line per window (JSON lines under --watch)
            print(("---\n" if args.watch and args.output == "yaml" else "") + output.dump(doc, args.output, indent=None))
            for e in errors:
                exitcodes.err(e)
        else:
            if args.watch and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            texts = [t for t in (_render(s, doc) for s in sections) if t]
            if deg:
                texts.append(deg.render())
            print("\n\n".join(texts))
        sys.stdout.flush()
        if not args.watch:
            if deg and deg.problems:
                return 2  # as plan and apply: the tenants file asks for what this node cannot plan
            # a device unreadable, or a target left alone (as apply: 1 a device failed); the others were shown
            return 1 if errors or deg else 0
        t0 = t1


def _render(s, doc: dict) -> str:
    """A section's text; one whose read failed and cannot render says so in its place."""
    try:
        return s.render(doc)
    except Exception as e:  # noqa: BLE001
        sec = doc.get(s.key)
        return f"{s.key}: error: {sec['error'] if isinstance(sec, dict) and 'error' in sec else e}"
