"""``shaperd status`` and ``shaperd top`` for the pod ingress caps: per capped pod, its cap and what it received.

Read only, straight from the kernel: every root qdisc and ingress qdisc in one dump, shaperd's tbf 7368:
counters (bytes and packets the pod received through it, drops, backlog), sampled at both ends of the window
for a rate. Which pod and tenant an interface is for comes from the labels the applying process recorded
(labels.py); an interface with shaperd's tbf and no label is shown by device alone. Per pod the state says
whether its cap is enforced: "in sync", "out of sync", "not enforced" (no shaperd qdisc there yet), or
"left alone" with the foreign root qdisc it found (the CNI bandwidth plugin's tbf 1:, say). An ``ingress``
qdisc on the pod's interface (the plugin's egress side) is named with the IFB its filters redirect to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shaperd.core.errors import KernelError
from shaperd.core.format import table
from shaperd.core.protocol import StatusSection
from shaperd.core.units import format_rate
from shaperd.backends.common.objects import fmt_handle
from shaperd.backends.podingress import diff as pdiff
from shaperd.backends.podingress import labels
from shaperd.backends.podingress.objects import INGRESS_FILTER_PARENT, INGRESS_KIND, ROOT_HANDLE, TC_H_ROOT, ObservedRoot
from shaperd.backends.podingress.plan import tbf_for

KEY = "pod_ingress"


@dataclass
class Sample:
    t: float
    roots: dict[int, ObservedRoot] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    ingress: dict[int, tuple[str, ...] | str] = field(default_factory=dict)  # ifindex -> IFB names, or an error


class Watch:
    """Samples of the kernel's root qdiscs, labelled with the recorded pods; the rows status and top print."""

    def __init__(self, record_path, clock=time.monotonic):
        self.record_path, self.clock = record_path, clock
        self.prev: Sample | None = None
        self.cur: Sample | None = None
        self.labels: dict[int, dict] = {}
        self.errors: dict[str, str] = {}

    def sample(self, reader) -> None:
        self.labels = labels.read(self.record_path)
        self.errors = {}
        try:
            qdiscs = reader.qdiscs()
            names = {l.ifindex: l.name for l in reader.links()}
        except KernelError as e:
            self.errors["node"] = str(e)
            return
        s = Sample(self.clock(), names=names)
        for q in qdiscs:
            if q.parent == TC_H_ROOT:
                s.roots[q.ifindex] = ObservedRoot(q.ifindex, q.kind, q.handle, q.tbf, q.counters)
        for q in qdiscs:
            if q.kind == INGRESS_KIND and (q.ifindex in self.labels or _owned(s, q.ifindex)):
                dev = names.get(q.ifindex, str(q.ifindex))
                try:
                    fs = reader.filters(q.ifindex, INGRESS_FILTER_PARENT, dev)
                    s.ingress[q.ifindex] = tuple(names.get(i, f"ifindex {i}")
                                                 for i in dict.fromkeys(f.mirred[1] for f in fs if f.mirred is not None))
                except KernelError as e:
                    s.ingress[q.ifindex] = str(e)
        self.prev, self.cur = self.cur, s

    def rows(self) -> list[dict]:
        s = self.cur
        if s is None:
            return []
        window = s.t - self.prev.t if self.prev is not None else 0.0
        out = []
        devices = {i for i in self.labels if i in s.names} | {i for i in s.roots if _owned(s, i)}
        for idx in sorted(devices, key=lambda i: s.names.get(i, "")):
            lab = self.labels.get(idx)
            if lab is not None and lab.get("device") != s.names.get(idx):
                lab = None  # the ifindex was reused by another interface: the label is not its
                if not _owned(s, idx):
                    continue
            out.append(_row(s, self.prev, window, idx, lab))
        return out


def _owned(s: Sample, idx: int) -> bool:
    r = s.roots.get(idx)
    return r is not None and r.owned


def _row(s: Sample, prev: Sample | None, window: float, idx: int, lab: dict | None) -> dict:
    root = s.roots.get(idx)
    cap = lab.get("cap_bps") if lab else None
    c = root.counters if root is not None and root.owned else None
    rate = None
    if c is not None and prev is not None and window > 0:
        before = prev.roots.get(idx)
        bc = before.counters if before is not None and before.owned else None
        if bc is not None and c.bytes >= bc.bytes:
            rate = (c.bytes - bc.bytes) * 8 / window
    if root is not None and root.owned:
        state = "in sync" if cap is None or pdiff.in_sync(tbf_for(cap), root.tbf) else "out of sync"
    elif pdiff.replaceable(root):
        state = "not enforced: no shaperd qdisc here"
    else:
        state = f"left alone: {pdiff.describe_root(root)} is not shaperd's"
    ing = s.ingress.get(idx)
    note = None
    if isinstance(ing, str):
        note = f"ingress qdisc, filters unreadable: {ing}"
    elif ing is not None:
        note = "ingress qdisc" + (f" redirecting to {', '.join(ing)}" if ing else "") + \
               " (the CNI bandwidth plugin's egress shaping): left alone"
    tbf = root.tbf if root is not None and root.owned else None
    return {"namespace": lab.get("namespace") if lab else None, "pod": lab.get("name") if lab else None,
            "tenant": lab.get("tenant") if lab else None, "device": s.names.get(idx, str(idx)), "cap_bps": cap,
            "enforced_rate_bps": tbf.rate_Bps * 8 if tbf else None,
            "burst_bytes": round(pdiff.burst_bytes(tbf)) if tbf else None, "limit_bytes": tbf.limit_bytes if tbf else None,
            "received_bytes": c.bytes if c else None, "received_packets": c.packets if c else None,
            "drops": c.drops if c else None, "backlog_bytes": c.backlog_bytes if c else None,
            "received_rate_bps": rate, "state": state, "note": note,
            "root": f"{root.kind} {fmt_handle(root.handle)}" if root is not None else None}


def _who(r: dict) -> str:
    return f"{r['namespace']}/{r['pod']}" if r["pod"] else "?"


def _rate(v) -> str:
    return "-" if v is None else format_rate(int(v))


def lines(rows: list[dict]) -> list[str]:
    body = [(_who(r), r["tenant"] or "-", r["device"], _rate(r["cap_bps"]), _rate(r["received_rate_bps"]),
             "-" if r["received_bytes"] is None else str(r["received_bytes"]),
             "-" if r["drops"] is None else str(r["drops"]), r["state"]) for r in rows]
    out = table(("POD", "TENANT", "DEVICE", "CAP", "RECEIVED", "BYTES", "DROPS", "STATE"), body)
    out += [f"note: {_who(r)} on {r['device']}: {r['note']}" for r in rows if r["note"]]
    return out


class Section(StatusSection):
    order = 25
    key = KEY

    def __init__(self, inp):
        self.watch = Watch(labels.path_for(inp.run_root, inp.netns))

    def sample(self, reader) -> None:
        self.watch.sample(reader)

    def collect(self, reader) -> dict:
        rows = self.watch.rows()
        return {KEY: rows} if rows else {}

    def render(self, doc: dict) -> str:
        if KEY not in doc:
            return ""
        return "\n".join(["Pod ingress caps (tbf on each pod's host interface):"] + ["  " + l for l in lines(doc[KEY])])

    def errors(self) -> list[str]:
        return [f"pod ingress: {dev}: {e}" for dev, e in sorted(self.watch.errors.items())]


def sections(inp) -> list:
    return [Section(inp)]


class TopPlane:
    """``shaperd top``'s pod ingress rows: one per capped pod whose tbf is in place, under its tenant (the row's
    target names the pod). A cap has no guarantee: GUARANTEE and LIMIT are both the cap, so BORROWED is what
    passed above it (the bucket's burst) and BELOW-G the time it was queued yet under 98 % of it."""

    name = "pod ingress"

    def __init__(self, inp):
        self.watch = Watch(labels.path_for(inp.run_root, inp.netns))

    def sample(self, reader) -> tuple[dict, dict]:
        from shaperd.core.protocol import ClassTarget

        self.watch.sample(reader)
        s = self.watch.cur
        stats, targets = {}, {}
        if s is None:
            return stats, targets
        for idx, root in s.roots.items():
            if not root.owned or root.counters is None or root.tbf is None:
                continue
            dev = s.names.get(idx, str(idx))
            lab = self.watch.labels.get(idx)
            if lab is not None and lab.get("device") != dev:
                lab = None  # the ifindex was reused: not that pod's
            cap = lab["cap_bps"] if lab else root.tbf.rate_Bps * 8
            key = (dev, ROOT_HANDLE)
            stats[key] = root.counters
            targets[key] = ClassTarget(lab.get("tenant") or "" if lab else "", dev, ROOT_HANDLE, cap, cap,
                                       pod=f"{lab['namespace']}/{lab['name']}" if lab else "(unknown pod)")
        return stats, targets

    def backlog(self, series) -> tuple[int | None, int | None]:
        return series.backlog_bytes, None

    def errors(self) -> dict[str, str]:
        return dict(self.watch.errors)

    def close(self) -> None:
        pass
