"""``shaperd top``: a refreshing per-tenant view of one node, read straight from the kernel.

Works with or without the daemon: it samples class counters like ``shaperd
status`` (report/status.py: same classes, same labels via class_labels; read
through kernel/rtnl.py like the daemon's sampler) and feeds them through the same accounting as
the daemon's metrics (report/sampler.py), so "borrowed" and "below
guarantee" mean the same thing in both places (accumulated since ``top``
started). Guarantee and limit are what the kernel enforces (HTB rate/ceil).
On a terminal each view replaces the last; otherwise views are printed one
after another as plain text with no escape codes. The bar is coloured on a
terminal unless NO_COLOR is set; ``-o json|yaml`` prints one document per view. The tenants' RDMA ports
are sampled at the same instants and shown below (report/rdma_view.py).

A capped pod's own class (kubernetes.io/egress-bandwidth) is a row of its own right under its tenant's
(its series' target names the pod): GUARANTEE is its share of the tenant's guarantee, LIMIT its cap
as enforced (the annotation, at most its tenant's limit). SENT is bytes since top started.

Each data plane is a registered backend's top plane (its spec's ``top``: htb's class counters,
edt's stampers' maps), read at the same instants and fed through an Accumulator of its own, so
their rows mean the same: RATE measured, BORROWED above the guarantee, BELOW-G while backlogged
yet under 98 % of the guarantee. Rows are ranked together (by tenant, then device); the PLANE
column says which plane a row is on, and a plane's BACKLOG may be bytes (htb) or time (edt).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from shaperd.core import format as output
from shaperd.core.exitcodes import EXIT_OK
from shaperd.backends.common.objects import fmt_handle
from shaperd.core.units import format_rate
from shaperd.report.sampler import Accumulator, TenantSeries

BAR_WIDTH = 30
CLEAR = "\x1b[H\x1b[2J"


def bar(rate_bps: float | None, guarantee_bps: int, limit_bps: int, width: int = BAR_WIDTH) -> str:
    """Rate against guarantee and limit, scaled to the limit.

    ``#`` up to the guarantee, ``+`` above it (borrowed), ``.`` unused
    headroom; ``|`` marks the guarantee where the rate has not reached it.
    """
    if limit_bps <= 0:
        return "[" + "?" * width + "]"
    filled = 0 if rate_bps is None else min(width, round(width * rate_bps / limit_bps))
    g = min(width, round(width * guarantee_bps / limit_bps))
    cells = []
    for i in range(width):
        if i < filled:
            cells.append("#" if i < g else "+")
        elif i == g and g < width:
            cells.append("|")
        else:
            cells.append(".")
    return "[" + "".join(cells) + "]"


def paint_bar(text: str, enabled: bool) -> str:
    """The bar in colour: green within the guarantee, yellow borrowed; unchanged when colour is off (NO_COLOR)."""
    if not enabled:
        return text
    return "".join(output.paint(c, "32" if c == "#" else "33" if c == "+" else "", c in "#+") for c in text)


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}TB"


@dataclass
class PlaneView:
    """One plane's rows for a view: its series, how a row's backlog reads (bytes, ns), its read errors."""

    name: str
    series: tuple[TenantSeries, ...] = ()
    backlog: Callable = lambda s: (s.backlog_bytes, None)
    errors: dict = field(default_factory=dict)


def ranked(views: list[PlaneView]) -> list[tuple[PlaneView, TenantSeries]]:
    """Every plane's rows in one ranking: by tenant, then device (then plane); a capped pod's row right
    after its tenant's on the same device and plane."""
    both = [(v, s) for v in views for s in v.series]
    return sorted(both, key=lambda vs: (vs[1].target.tenant, vs[1].target.device, vs[0].name, vs[1].target.pod))


def _drops_key(plane: str, s: TenantSeries) -> tuple:
    return (plane, s.target.device, s.target.classid)


def who(s: TenantSeries) -> str:
    """The TENANT cell: the tenant, or a capped pod indented under it (named so without a tenant)."""
    if not s.target.pod:
        return s.target.tenant
    return f"  pod {s.target.pod}" if s.target.tenant else f"pod {s.target.pod} (no tenant)"


def render(views: list[PlaneView], drops_base: dict, window_s: float, node: str = "", rdma=(),
           color: bool = False, sent_base: dict | None = None) -> str:
    from shaperd.core.units import format_backlog_ns

    sent_base = sent_base or {}
    head = ("TENANT", "PLANE", "DEVICE", "CLASS", "RATE", "RATE VS GUARANTEE | LIMIT", "GUARANTEE", "LIMIT",
            "SENT", "DROPS", "BACKLOG", "BORROWED", "BELOW-G")
    lines = [head]
    for v, s in ranked(views):
        b_bytes, b_ns = v.backlog(s)
        backlog = _bytes(b_bytes) if b_ns is None else format_backlog_ns(b_ns)
        lines.append((
            who(s), v.name, s.target.device, fmt_handle(s.target.classid),
            "-" if s.rate_bps is None else format_rate(int(s.rate_bps)),
            bar(s.rate_bps, s.guarantee_bps, s.limit_bps),
            format_rate(s.guarantee_bps), format_rate(s.limit_bps),
            _bytes(s.bytes - sent_base.get(_drops_key(v.name, s), s.bytes)),
            str(s.drops - drops_base.get(_drops_key(v.name, s), s.drops)), backlog,
            _bytes(s.borrowed_bytes), f"{s.below_guarantee_s:.1f}s",
        ))
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    # Widths come from the plain text; colour (escape codes, zero width on screen) goes in after padding.
    body = "\n".join("  ".join(paint_bar(c.ljust(w), color) if i == 5 and n else c.ljust(w)
                               for i, (c, w) in enumerate(zip(l, widths))).rstrip()
                     for n, l in enumerate(lines))
    for v in views:
        for dev, err in sorted(v.errors.items()):
            body += f"\n{v.name} {dev}: {err}"
    title = f"shaperd top{' ' + node if node else ''}  {time.strftime('%H:%M:%S')}  rate window {window_s:.1f}s  " \
            "(SENT, DROPS, BORROWED and BELOW-G since top started)"
    if not any(v.series for v in views):
        body += "\n(no tenant class on any device: no shaperd qdisc, or no tenants file to name classes)"
    if rdma:
        from shaperd.report.rdma_view import render_table as rdma_table

        body += "\n\nRDMA ports (measured at the HCA):\n" + rdma_table(rdma)
    return f"{title}\n{body}"


def view_doc(views: list[PlaneView], drops_base: dict, window_s: float, rdma=(), sent_base: dict | None = None) -> dict:
    """One view as ``-o json|yaml`` prints it: the same figures as the table, rates in bit/s, bytes in bytes.

    Every row has the same keys: ``backlog_bytes`` is None on a plane whose backlog is time, ``backlog_ns``
    on one whose backlog is bytes."""
    from shaperd.report.rdma_view import tenant_rows

    sent_base = sent_base or {}

    def row(v: PlaneView, s: TenantSeries) -> dict:
        b_bytes, b_ns = v.backlog(s)
        return {"tenant": s.target.tenant, "pod": s.target.pod or None, "plane": v.name, "device": s.target.device,
                "classid": fmt_handle(s.target.classid),
                "sent_bytes_since_start": s.bytes - sent_base.get(_drops_key(v.name, s), s.bytes),
                "rate_bps": s.rate_bps, "guarantee_bps": s.guarantee_bps, "limit_bps": s.limit_bps,
                "drops_since_start": s.drops - drops_base.get(_drops_key(v.name, s), s.drops),
                "backlog_bytes": b_bytes, "backlog_ns": b_ns,
                "borrowed_bytes_since_start": s.borrowed_bytes,
                "below_guarantee_s_since_start": s.below_guarantee_s}

    doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rate_window_s": window_s,
           "tenants": [row(v, s) for v, s in ranked(views)], "rdma": tenant_rows(rdma)}
    for v in views:
        if v.errors:
            doc[f"{v.name}_errors"] = [{"device": d, "error": e} for d, e in sorted(v.errors.items())]
    return doc


def main(args) -> int:
    from shaperd.core.roots import Roots
    from shaperd.engine.registry import REGISTRY
    from shaperd.kernel.rtnl import RtnlReader
    from shaperd.report.rdma_view import RdmaWatch
    from shaperd.report.status import status_input

    reader = RtnlReader(getattr(args, "netns", None))
    inp = status_input(args)
    planes = [spec.top(inp) for spec in REGISTRY.specs if spec.top is not None]
    accs = {p.name: Accumulator(rate_window_s=max(2.0, args.interval)) for p in planes}
    rdma = RdmaWatch.open(Roots.of(sys=args.sysfs_root), args.config, rate_window_s=max(2.0, args.interval))
    tty = sys.stdout.isatty()
    color = output.use_color(sys.stdout)
    machine = output.machine(args)
    drops_base: dict = {}
    sent_base: dict = {}
    window = max(2.0, args.interval)
    n = 0
    try:
        while True:
            now = time.monotonic()
            for p in planes:
                stats, targets = p.sample(reader)
                accs[p.name].ingest(now, stats, targets)
                for s in accs[p.name].series.values():
                    drops_base.setdefault(_drops_key(p.name, s), s.drops)
                    sent_base.setdefault(_drops_key(p.name, s), s.bytes)
            rdma.sample(now)
            views = [PlaneView(p.name, accs[p.name].view(), p.backlog, p.errors()) for p in planes]
            if machine and n > 0:  # one document per view; the first sample has no rates yet
                doc = view_doc(views, drops_base, window, rdma=rdma.view(), sent_base=sent_base)
                print(("---\n" if args.output == "yaml" else "") + output.dump(doc, args.output, indent=None), flush=True)
            elif not machine and (n > 0 or args.iterations is None):
                text = render(views, drops_base, window, rdma=rdma.view(), color=color, sent_base=sent_base)
                print((CLEAR if tty else "") + text + ("" if tty else "\n"), flush=True)
            if n > 0 and args.iterations is not None and n >= args.iterations:
                return EXIT_OK
            n += 1
            time.sleep(args.interval)
    finally:
        for p in planes:
            p.close()
        reader.close()
