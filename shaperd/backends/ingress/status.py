"""Tenant ingress in ``shaperd status`` and ``shaperd top``: the IFBs' class counters, read straight from the kernel.

Each of shaperd's IFBs (kind ifb, ``shpi-*``, root 7369:) is shown under the uplink it is fed from (the
link whose ``ids.ifb_name`` it is). Classes are labelled with tenant names from the tenants file (the
minors derive from the names, so no saved state is needed); without a readable tenants file by class id.
The ``ingress`` status section sits beside the egress class table; the top plane "ingress" puts each
tenant's inbound rows beside its egress rows (same accounting: report/sampler.py). Reads only.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from shaperd.backends.common.objects import fmt_handle
from shaperd.backends.ingress.objects import IFB_KIND, INGRESS_MAJOR, INGRESS_ROOT, class_label, ingress_classid
from shaperd.core.ids import ifb_name, is_ifb_name
from shaperd.core.protocol import ClassTarget, StatusSection
from shaperd.core.units import format_rate
from shaperd.kernel.rtnl_rows import TC_H_ROOT, HtbClassRow


def ifb_uplinks(links) -> dict[int, tuple[str, str]]:
    """IFB ifindex -> (uplink, IFB name) for each of shaperd's IFBs (uplink: the IFB's own name when the
    link it is fed from is gone)."""
    by_ifb = {ifb_name(l.name): l.name for l in links if not is_ifb_name(l.name)}
    return {l.ifindex: (by_ifb.get(l.name, l.name), l.name) for l in links
            if l.kind == IFB_KIND and is_ifb_name(l.name)}


def read_counters(reader) -> dict[tuple[str, int], HtbClassRow]:
    """{(uplink, classid): class row with counters} for every class of every IFB carrying shaperd's tree."""
    ifbs = ifb_uplinks(reader.links())
    if not ifbs:
        return {}  # no IFB of shaperd's: nothing more to read
    owned = {q.ifindex for q in reader.root_qdiscs()
             if q.parent == TC_H_ROOT and q.kind == "htb" and q.handle == INGRESS_ROOT and q.ifindex in ifbs}
    out = {}
    for idx in sorted(owned):
        uplink, ifb = ifbs[idx]
        for c in reader.htb_classes(idx, ifb):
            if c.classid >> 16 == INGRESS_MAJOR:
                out[(uplink, c.classid)] = c
    return out


def tenant_labels(cfg) -> dict[int, str]:
    """classid -> tenant for the tenants with an ingress block (from the tenants file; {} without one)."""
    if cfg is None:
        return {}
    from shaperd.backends.ingress.plan import ingress_minors

    minors = ingress_minors(cfg)
    return {ingress_classid(minors[t.name]): t.name for t in cfg.tenants if t.ingress is not None}


@dataclass
class Row:
    device: str  # the uplink
    tenant: str
    classid: str
    guarantee_bps: int | None  # configured (None: none); the default and root classes: HTB's rate
    limit_bps: int | None  # configured (None: the capacity, HTB's ceil shown)
    rate_bps: float | None  # received over the window; None on the first sample
    bytes: int
    packets: int
    drops: int
    backlog_bytes: int


def rows(prev: dict, cur: dict, window_s: float, cfg) -> list[Row]:
    labels = tenant_labels(cfg)
    conf = {t.name: t.ingress for t in cfg.tenants if t.ingress is not None} if cfg is not None else {}
    out = []
    for (dev, cid), st in sorted(cur.items()):
        before = prev.get((dev, cid))
        rate = None
        if before is not None and window_s > 0 and st.bytes >= before.bytes:
            rate = (st.bytes - before.bytes) * 8 / window_s
        tenant = class_label(cid, labels)
        ing = conf.get(tenant)
        out.append(Row(
            device=dev, tenant=tenant, classid=fmt_handle(cid),
            guarantee_bps=(ing.guarantee_bps if ing is not None else st.rate_Bps * 8),
            limit_bps=(ing.limit_bps if ing is not None and ing.limit_bps is not None else st.ceil_Bps * 8),
            rate_bps=rate, bytes=st.bytes, packets=st.packets, drops=st.drops, backlog_bytes=st.backlog_bytes))
    return out


def render_table(rs: list[Row]) -> str:
    head = ("DEVICE", "TENANT", "CLASS", "GUARANTEE", "LIMIT", "RECEIVED", "BYTES", "PACKETS", "DROPS", "BACKLOG")
    lines = [head]
    for r in rs:
        lines.append((r.device, r.tenant, r.classid,
                      "none" if r.guarantee_bps is None else format_rate(r.guarantee_bps),
                      "-" if r.limit_bps is None else format_rate(r.limit_bps),
                      "-" if r.rate_bps is None else format_rate(int(r.rate_bps)),
                      str(r.bytes), str(r.packets), str(r.drops), f"{r.backlog_bytes}B"))
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)


class IngressSection(StatusSection):
    """Tenant ingress: per uplink, each tenant's inbound class on its IFB (and the default class)."""

    order = 15
    key = "ingress"

    def __init__(self, inp):
        self.cfg = inp.config
        self.prev: dict = {}
        self.cur: dict = {}
        self.t0 = self.t1 = time.monotonic()

    def sample(self, reader) -> None:
        self.prev, self.t0 = self.cur, self.t1
        self.cur, self.t1 = read_counters(reader), time.monotonic()

    def wanted(self) -> bool:
        return self.cfg is not None and any(t.ingress is not None for t in self.cfg.tenants)

    def collect(self, reader) -> dict:
        self.rows = rows(self.prev, self.cur, self.t1 - self.t0, self.cfg)
        if not self.rows and not self.wanted():
            return {}  # nothing inbound is shaped here, nor asked for: no key, no text
        return {"ingress": [asdict(r) for r in self.rows]}

    def render(self, doc: dict) -> str:
        if "ingress" not in doc:
            return ""
        body = render_table(self.rows) if self.rows else "(no IFB carries shaperd's ingress tree)"
        return "Tenant ingress (received over the shaped uplinks, shaped on their IFBs):\n" + body


def sections(inp) -> list:
    return [IngressSection(inp)]


class TopPlane:
    """``shaperd top``'s "ingress" rows: what each tenant receives over each uplink, beside its egress rows."""

    name = "ingress"

    def __init__(self, inp):
        self.labels = tenant_labels(inp.config)

    def sample(self, reader) -> tuple[dict, dict]:
        stats = read_counters(reader)
        targets = {k: ClassTarget(self.labels[k[1]], k[0], k[1]) for k in stats if k[1] in self.labels}
        return stats, targets

    def backlog(self, series) -> tuple[int | None, int | None]:
        return series.backlog_bytes, None

    def errors(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass

