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

Uplinks on the edt data plane (report/edt_status.py: the stampers' maps)
are read at the same instants and fed through a second Accumulator, so
their rows mean the same: RATE measured, BORROWED above the guarantee,
BELOW-G while backlogged (the departure clock ahead of now at both ends of
an interval) yet under 98 % of the guarantee. They are ranked with the HTB
rows (by tenant, then device); the PLANE column says which plane a row is
on, and an edt row's BACKLOG is time (clock - now), not bytes.
"""

from __future__ import annotations

import sys
import time

from shaperd.core import format as output
from shaperd.core.exitcodes import EXIT_OK
from shaperd.backends.common.objects import fmt_handle
from shaperd.core.units import format_rate
from shaperd.report.sampler import Accumulator, TenantSeries, Target
from shaperd.report.status import class_labels

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


def ranked(series: tuple[TenantSeries, ...], edt: tuple[TenantSeries, ...] = ()) -> list[tuple[str, TenantSeries]]:
    """HTB and edt rows in one ranking: by tenant, then device (then plane)."""
    both = [("htb", s) for s in series] + [("edt", s) for s in edt]
    return sorted(both, key=lambda ps: (ps[1].target.tenant, ps[1].target.device, ps[0]))


def _drops_key(plane: str, s: TenantSeries) -> tuple:
    return (s.target.device, s.target.classid) if plane == "htb" else ("edt", s.target.device, s.target.classid)


def render(series: tuple[TenantSeries, ...], drops_base: dict, window_s: float, node: str = "", rdma=(),
           color: bool = False, edt: tuple[TenantSeries, ...] = (), edt_backlog_ns: dict | None = None,
           edt_errors: dict | None = None) -> str:
    from shaperd.backends.edt.status import format_backlog

    head = ("TENANT", "PLANE", "DEVICE", "CLASS", "RATE", "RATE VS GUARANTEE | LIMIT", "GUARANTEE", "LIMIT",
            "DROPS", "BACKLOG", "BORROWED", "BELOW-G")
    lines = [head]
    for plane, s in ranked(series, edt):
        backlog = (_bytes(s.backlog_bytes) if plane == "htb"
                   else format_backlog((edt_backlog_ns or {}).get((s.target.device, s.target.classid), 0)))
        lines.append((
            s.target.tenant, plane, s.target.device, fmt_handle(s.target.classid),
            "-" if s.rate_bps is None else format_rate(int(s.rate_bps)),
            bar(s.rate_bps, s.guarantee_bps, s.limit_bps),
            format_rate(s.guarantee_bps), format_rate(s.limit_bps),
            str(s.drops - drops_base.get(_drops_key(plane, s), s.drops)), backlog,
            _bytes(s.borrowed_bytes), f"{s.below_guarantee_s:.1f}s",
        ))
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    # Widths come from the plain text; colour (escape codes, zero width on screen) goes in after padding.
    body = "\n".join("  ".join(paint_bar(c.ljust(w), color) if i == 5 and n else c.ljust(w)
                               for i, (c, w) in enumerate(zip(l, widths))).rstrip()
                     for n, l in enumerate(lines))
    for dev, err in sorted((edt_errors or {}).items()):
        body += f"\nedt {dev}: {err}"
    title = f"shaperd top{' ' + node if node else ''}  {time.strftime('%H:%M:%S')}  rate window {window_s:.1f}s  " \
            "(DROPS, BORROWED and BELOW-G since top started)"
    if not series and not edt:
        body += "\n(no tenant class on any device: no shaperd qdisc, or no tenants file to name classes)"
    if rdma:
        from shaperd.report.rdma_view import render_table as rdma_table

        body += "\n\nRDMA ports (measured at the HCA):\n" + rdma_table(rdma)
    return f"{title}\n{body}"


def view_doc(series: tuple[TenantSeries, ...], drops_base: dict, window_s: float, rdma=(),
             edt: tuple[TenantSeries, ...] = (), edt_backlog_ns: dict | None = None,
             edt_errors: dict | None = None) -> dict:
    """One view as ``-o json|yaml`` prints it: the same figures as the table, rates in bit/s, bytes in bytes.

    Every row has the same keys: ``backlog_bytes`` is None on an edt row, ``backlog_ns`` on an HTB row."""
    from shaperd.report.rdma_view import tenant_rows

    def row(plane: str, s: TenantSeries) -> dict:
        key = (s.target.device, s.target.classid)
        return {"tenant": s.target.tenant, "plane": plane, "device": s.target.device,
                "classid": fmt_handle(s.target.classid),
                "rate_bps": s.rate_bps, "guarantee_bps": s.guarantee_bps, "limit_bps": s.limit_bps,
                "drops_since_start": s.drops - drops_base.get(_drops_key(plane, s), s.drops),
                "backlog_bytes": s.backlog_bytes if plane == "htb" else None,
                "backlog_ns": (edt_backlog_ns or {}).get(key, 0) if plane == "edt" else None,
                "borrowed_bytes_since_start": s.borrowed_bytes,
                "below_guarantee_s_since_start": s.below_guarantee_s}

    doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rate_window_s": window_s,
           "tenants": [row(p, s) for p, s in ranked(series, edt)], "rdma": tenant_rows(rdma)}
    if edt_errors:
        doc["edt_errors"] = [{"device": d, "error": e} for d, e in sorted(edt_errors.items())]
    return doc


class _EdtCounters:
    """An edt row as the Accumulator's Counters: demand (qlen) = the departure clock ahead of now."""

    def __init__(self, r):
        self.bytes, self.packets, self.drops, self.overlimits = r.bytes, r.packets, r.drops, 0
        self.backlog_bytes, self.qlen = 0, 1 if r.backlog_ns > 0 else 0
        self.rate_Bps = (r.guarantee_bps or 0) // 8
        self.ceil_Bps = (r.limit_bps or 0) // 8


def edt_ingest(acc: Accumulator, t: float, rows) -> dict:
    """Feed status's edt rows (report/edt_status.py) to ``acc``; tenants of the file only, as for HTB.

    Returns {(device, classid): backlog_ns} for the view."""
    from shaperd.backends.common.objects import HANDLE_MAJOR
    from shaperd.backends.edt.status import NONE_TENANT, UNKNOWN_TENANT

    stats, targets, backlog = {}, {}, {}
    for r in rows:
        if r.tenant in (NONE_TENANT, UNKNOWN_TENANT):
            continue
        key = (r.device, HANDLE_MAJOR << 16 | r.key)
        stats[key] = _EdtCounters(r)
        targets[key] = Target(r.tenant, r.device, key[1], r.guarantee_bps, r.limit_bps)
        backlog[key] = r.backlog_ns
    acc.ingest(t, stats, targets)
    return backlog


def main(args) -> int:
    from shaperd.kernel.rtnl import RtnlReader
    from shaperd.core.roots import Roots
    from shaperd.report.rdma_view import RdmaWatch
    from shaperd.report.status import sample

    from shaperd.backends.edt import status as edt_status

    reader = RtnlReader(getattr(args, "netns", None))
    labels = class_labels(args.config)
    edt = edt_status.EdtWatch(edt_status.Labels.load(args.config, args.sysfs_root),
                              edt_status.pins_for(getattr(args, "bpffs_root", ""), getattr(args, "netns", None)))
    edt_acc = Accumulator(rate_window_s=max(2.0, args.interval))
    rdma = RdmaWatch.open(Roots.of(sys=args.sysfs_root), args.config, rate_window_s=max(2.0, args.interval))
    acc = Accumulator(rate_window_s=max(2.0, args.interval))
    tty = sys.stdout.isatty()
    color = output.use_color(sys.stdout)
    machine = output.machine(args)
    drops_base: dict = {}
    n = 0
    try:
        while True:
            stats = sample(reader)
            targets = {k: Target(labels[k[1]], k[0], k[1]) for k in stats
                       if k[1] in labels and not labels[k[1]].startswith("(")}
            now = time.monotonic()
            acc.ingest(now, stats, targets)
            rdma.sample(now)
            edt.sample(reader)
            backlog = edt_ingest(edt_acc, now, edt.rows())
            for s in acc.series.values():
                drops_base.setdefault((s.target.device, s.target.classid), s.drops)
            for s in edt_acc.series.values():
                drops_base.setdefault(_drops_key("edt", s), s.drops)
            more = dict(edt=edt_acc.view(), edt_backlog_ns=backlog, edt_errors=edt.errors)
            if machine and n > 0:  # one document per view; the first sample has no rates yet
                doc = view_doc(acc.view(), drops_base, acc.rate_window_s, rdma=rdma.view(), **more)
                print(("---\n" if args.output == "yaml" else "") + output.dump(doc, args.output, indent=None), flush=True)
            elif not machine and (n > 0 or args.iterations is None):
                text = render(acc.view(), drops_base, acc.rate_window_s, rdma=rdma.view(), color=color, **more)
                print((CLEAR if tty else "") + text + ("" if tty else "\n"), flush=True)
            if n > 0 and args.iterations is not None and n >= args.iterations:
                return EXIT_OK
            n += 1
            time.sleep(args.interval)
    finally:
        edt.close()
        reader.close()
