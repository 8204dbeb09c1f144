"""htb's part of ``shaperd status`` and ``shaperd top``: its classes' counters, read straight from the kernel.

Reads HTB class counters (twice, a short window apart, in status) and labels classes with tenant
names from the tenants file (class ids are derived from names, so no saved state is needed);
without a readable tenants file classes are shown by id. Capped pods' classes (derived from pod
uids, which status does not know) are labelled from the file the applying process keeps
(podlabels.py) and shown under their tenant, with their cap. A second section says which classifier
path each shaped device uses (classifier_status.py). The top plane feeds the same counters to
top's accounting, pods' classes as rows of their own. Reads only.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from shaperd.backends.common.objects import DEFAULT_CLASS_MINOR, HANDLE_MAJOR, ROOT_CLASS_MINOR, fmt_handle
from shaperd.core.config import load_file
from shaperd.core.errors import ConfigError
from shaperd.core.ids import assign_minors
from shaperd.core.protocol import ClassTarget, StatusSection
from shaperd.core.units import format_rate


@dataclass
class Row:
    device: str
    tenant: str
    classid: str
    guarantee_bps: int
    limit_bps: int
    rate_bps: float | None  # over the window; None on the first sample
    bytes: int
    packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    borrowing: bool  # sending above its guarantee, on bandwidth lent by the parent
    borrows: int
    # A capped pod's own class: its namespace/name and its annotation's cap (bit/s); None for other classes.
    pod: str | None = None
    cap_bps: int | None = None


def class_labels(config_path: str | None) -> dict[int, str]:
    labels = {HANDLE_MAJOR << 16 | DEFAULT_CLASS_MINOR: "(default)", HANDLE_MAJOR << 16 | ROOT_CLASS_MINOR: "(root)"}
    if not config_path:
        return labels
    try:
        cfg = load_file(config_path)
    except ConfigError:
        return labels
    minors = assign_minors([t.name for t in cfg.tenants])
    for name, minor in minors.items():
        labels[HANDLE_MAJOR << 16 | minor] = name
    labels.update(scope_labels(cfg, minors))
    return labels


def scope_labels(cfg, minors: dict[str, int]) -> dict[int, str]:
    """Destination-scope leaves (issue 12): 'tenant-a/rest' and 'tenant-a->10.244.0.0/16'."""
    from shaperd.backends.htb.scopes import scope_minors

    smins = scope_minors(cfg.tenants, minors)
    out = {}
    for key, minor in smins.items():
        tenant, kind, *rest = key.split("\0")
        out[HANDLE_MAJOR << 16 | minor] = f"{tenant}/rest" if kind == "rest" else f"{tenant}->{rest[0]}"
    return out


def sample(reader) -> dict[tuple[str, int], object]:
    """One read of every shaperd class on every shaped device: {(device, classid): class row}."""
    from shaperd.backends.htb.observe import read_counters

    return read_counters(reader)


def pod_labels(inp) -> tuple[dict[int, dict], dict[int, str]]:
    """The capped pods' classes and their tenants' rest leaves, as the applying process recorded them."""
    from shaperd.backends.htb import podlabels

    return podlabels.read(podlabels.path_for(getattr(inp, "run_root", "/run"), getattr(inp, "netns", None)))


def rows(prev: dict, cur: dict, window_s: float, labels: dict[int, str], pods: dict[int, dict] | None = None) -> list[Row]:
    """One row per class; a capped pod's (``pods``: classid -> podlabels entry) right after its tenant's
    class on the same device (a pod of no tenant after the default class)."""
    pods = pods or {}
    out = []
    for (dev, cid), st in sorted(cur.items()):
        before = prev.get((dev, cid))
        rate = None
        if before is not None and window_s > 0 and st.bytes >= before.bytes:
            rate = (st.bytes - before.bytes) * 8 / window_s
        pod = pods.get(cid)
        out.append(
            Row(
                device=dev, tenant=(pod["tenant"] or "") if pod else labels.get(cid, "?"), classid=fmt_handle(cid),
                guarantee_bps=st.rate_Bps * 8, limit_bps=st.ceil_Bps * 8, rate_bps=rate,
                bytes=st.bytes, packets=st.packets, drops=st.drops, overlimits=st.overlimits,
                backlog_bytes=st.backlog_bytes,
                borrowing=rate is not None and rate > st.rate_Bps * 8 * 1.01 and cid & 0xFFFF != ROOT_CLASS_MINOR,
                borrows=st.borrows,
                pod=pod["pod"] if pod else None, cap_bps=pod.get("cap_bps") if pod else None,
            )
        )
    return _pods_under_tenants(out)


def _pods_under_tenants(rs: list[Row]) -> list[Row]:
    """Pod rows moved right after the row of their tenant's class (or the default class) on their device."""
    pods = [r for r in rs if r.pod is not None]
    if not pods:
        return rs
    out = []
    for r in rs:
        if r.pod is not None:
            continue
        out.append(r)
        parent = "(default)" if r.tenant == "(default)" else r.tenant
        out.extend(sorted((p for p in pods if p.device == r.device and (p.tenant or "(default)") == parent),
                          key=lambda p: p.pod))
    placed = {id(r) for r in out}
    return out + [p for p in pods if id(p) not in placed]  # a tenant no longer in the tenants file: at the end


def render_table(rs: list[Row], empty_note: str = "(no device carries shaperd's qdisc)") -> str:
    head = ("DEVICE", "TENANT", "CLASS", "GUARANTEE", "LIMIT", "RATE", "BYTES", "PACKETS", "DROPS", "OVERLIMITS", "BORROWING")
    lines = [head]
    for r in rs:
        who = r.tenant if r.pod is None else f"  pod {r.pod}" + (f" (cap {format_rate(r.cap_bps)})" if r.cap_bps else "")
        lines.append((
            r.device, who, r.classid, format_rate(r.guarantee_bps), format_rate(r.limit_bps),
            "-" if r.rate_bps is None else format_rate(int(r.rate_bps)),
            str(r.bytes), str(r.packets), str(r.drops), str(r.overlimits), "yes" if r.borrowing else "no",
        ))
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)
    if not rs:
        text += "\n" + empty_note
    return text


class ClassesSection(StatusSection):
    """The class table (always shown: its empty line says why there is nothing)."""

    order = 10
    key = "classes"

    def __init__(self, inp):
        self.inp = inp
        self.labels = class_labels(inp.config_path)
        self.prev: dict = {}
        self.cur: dict = {}
        self.t0 = self.t1 = time.monotonic()

    def sample(self, reader) -> None:
        self.prev, self.t0 = self.cur, self.t1
        self.cur, self.t1 = sample(reader), time.monotonic()

    def collect(self, reader) -> dict:
        pods, rests = pod_labels(self.inp)  # read per window: pods come and go under --watch
        labels = {**self.labels, **{cid: f"{t}/rest" for cid, t in rests.items()}}
        self.rows = rows(self.prev, self.cur, self.t1 - self.t0, labels, pods)
        return {"classes": [asdict(r) for r in self.rows]}

    def render(self, doc: dict) -> str:
        other_plane = bool(doc.get("edt"))
        return render_table(self.rows, "(no device on the HTB data plane)") if other_plane else render_table(self.rows)


class ClassifierSection(StatusSection):
    """Which classifier path (eBPF map or u32) and offload each device carrying shaperd's HTB root uses."""

    order = 60
    key = "classifier"

    def __init__(self, inp):
        from shaperd.backends.htb.offload_probe import DeviceProbe

        self.inp = inp
        self.probe = DeviceProbe(inp.netns, inp.roots)  # read-only: driver and ethtool features

    def collect(self, reader) -> dict:
        from shaperd.backends.htb import classifier_status

        paths = classifier_status.with_offload_reasons(classifier_status.collect(reader), reader.links(), self.probe,
                                                       self.inp.refused.get("htb"))
        return {"classifier": paths} if paths else {}  # only where a device carries shaperd's HTB

    def render(self, doc: dict) -> str:
        from shaperd.backends.htb import classifier_status

        return classifier_status.render(doc["classifier"]) if doc.get("classifier") else ""


def sections(inp) -> list:
    return [ClassesSection(inp), ClassifierSection(inp)]


class TopPlane:
    """``shaperd top``'s htb rows: the class counters of the tenants' classes, with their labels."""

    name = "htb"

    def __init__(self, inp):
        self.inp = inp
        self.labels = class_labels(inp.config_path)

    def sample(self, reader) -> tuple[dict, dict]:
        stats = sample(reader)
        pods, _ = pod_labels(self.inp)  # per sample: pods come and go while top runs
        targets = {k: ClassTarget(self.labels[k[1]], k[0], k[1]) for k in stats
                   if k[1] in self.labels and not self.labels[k[1]].startswith("(")}
        for k in stats:  # capped pods' classes: rows of their own, under their tenant (report/top.py)
            pod = pods.get(k[1])
            if pod is not None:
                targets[k] = ClassTarget(pod.get("tenant") or "", k[0], k[1], pod=pod["pod"])
        return stats, targets

    def backlog(self, series) -> tuple[int | None, int | None]:
        """(backlog bytes, backlog ns) of a row: HTB's is bytes."""
        return series.backlog_bytes, None

    def errors(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass
