"""The source design's table, the targets, and per-scenario detail, as text.

Pure: works on :class:`~.scenarios.ScenarioResult` objects (or their
``to_dict()`` form) and returns markdown strings or plain dicts.

Source-table percentages follow the source design: a tenant's figure is its
goodput relative to its goodput when alone on the unshaped link (scenario 1,
mode ``none``); link utilisation is the summed goodput over the link rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

# The source design's verification table (tenant A %, tenant B %, link %).
SOURCE_TABLE: list[tuple[str, str, tuple[float, float, float]]] = [
    ("each alone", "alone/none", (100, 100, 50)),
    ("together, no isolation", "together/none", (55, 45, 100)),
    ("together, with isolation", "together/{mode}", (90, 60, 95)),
    ("with bandwidth guarantee", "pressure/{mode}", (95, 80, 90)),
]

TARGETS = {
    "guarantee": "every tenant that wants its guarantee gets >= 98 % of it (scenarios 3, 4, 5)",
    "limit": "no tenant exceeds its limit by > 3 % over any 1 s window",
    "utilisation": "demand above capacity: link carries >= 95 % of a single unshaped tenant's",
    "alone": "a tenant alone reaches >= 97 % of its limit",
    "convergence": "scenario 6: newcomer reaches its guarantee in < 1 s",
    "latency": "scenario 7: probe RTT (reported, no bound)",
}


def _d(r: Any) -> dict:
    return r if isinstance(r, dict) else r.to_dict()


def index(results: Iterable[Any]) -> dict[str, dict]:
    """scenario/mode -> result dict (errors included, with 'error' set)."""
    out = {}
    for r in results:
        d = _d(r)
        out[f"{d['scenario']}/{d['mode']}"] = d
    return out


def _tenant(d: dict | None, k: str) -> dict | None:
    if not d or d.get("error"):
        return None
    return d.get("tenants", {}).get(k)


def alone_reference(idx: dict[str, dict]) -> dict[str, float | None]:
    ref = {}
    for k in ("a", "b"):
        t = _tenant(idx.get("alone/none"), k)
        ref[k] = t["goodput_bps"] if t else None
    return ref


def source_rows(idx: dict[str, dict], modes: tuple[str, ...] = ("shaperd", "hand-tc")) -> list[dict]:
    """Rows of the source table with measured figures for each mode."""
    ref = alone_reference(idx)
    rows = []
    for label, key, src in SOURCE_TABLE:
        row: dict[str, Any] = {"scenario": label, "source": {"a": src[0], "b": src[1], "link": src[2]}}
        for mode in modes if "{mode}" in key else ("none",):
            d = idx.get(key.format(mode=mode))
            row[mode] = _pct_triplet(d, ref, alone=(key == "alone/none"))
        rows.append(row)
    return rows


def _pct_triplet(d: dict | None, ref: dict, alone: bool = False) -> dict | None:
    if not d or d.get("error"):
        return {"error": d.get("error")} if d else None
    link = d["link_bps"]
    out: dict[str, Any] = {}
    tot = 0.0
    for k in ("a", "b"):
        t = d["tenants"].get(k)
        if t is None:
            out[k] = None
            continue
        out[k] = 100.0 * t["goodput_bps"] / ref[k] if ref.get(k) else None
        out[f"{k}_mbit"] = t["goodput_bps"] / 1e6
        tot += t["goodput_bps"]
    if alone:  # each alone: average utilisation of the two solo runs
        n = sum(1 for k in ("a", "b") if d["tenants"].get(k))
        out["link"] = 100.0 * tot / n / link if n else None
    else:
        out["link"] = 100.0 * tot / link
    return out


@dataclass
class TargetOutcome:
    target: str
    mode: str
    value: float | None
    threshold: float | None
    ok: bool | None
    detail: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def targets(idx: dict[str, dict], mode: str) -> list[TargetOutcome]:
    """Evaluate the project's targets for one shaping mode (measure, don't assert)."""
    out: list[TargetOutcome] = []
    # guarantee, in scenarios 3 (together), 4 (pressure), 5 (udp)
    worst, where = None, ""
    worst_g = None
    for sc in ("together", "pressure", "udp"):
        d = idx.get(f"{sc}/{mode}")
        if not d or d.get("error"):
            continue
        for k, t in d["tenants"].items():
            if t.get("wants_guarantee") and t.get("pct_of_guarantee") is not None:
                if worst is None or t["pct_of_guarantee"] < worst:
                    worst, where = t["pct_of_guarantee"], f"{sc}:{k}"
                    g = t.get("guarantee_bps")
                    worst_g = 100.0 * t["goodput_bps"] / g if g else None
    out.append(TargetOutcome("guarantee", mode, worst, 98.0, None if worst is None else worst >= 98.0,
                             f"worst {where} (L2 rate after warm-up; goodput {_f(worst_g)} %)"))
    # limit excess, any shaped scenario
    worst, where = None, ""
    for key, d in idx.items():
        if not key.endswith("/" + mode) or d.get("error"):
            continue
        for k, t in d["tenants"].items():
            e = t.get("limit_excess_pct")
            if e is not None and (worst is None or e > worst):
                worst, where = e, f"{d['scenario']}:{k}"
    out.append(TargetOutcome("limit", mode, worst, 3.0, None if worst is None else worst <= 3.0,
                             f"highest 1 s window over limit: {where}"))
    # utilisation under overload vs single unshaped tenant
    ref = alone_reference(idx)
    single = max((v for v in ref.values() if v), default=None)
    worst, where = None, ""
    for sc in ("together", "pressure"):
        d = idx.get(f"{sc}/{mode}")
        if not d or d.get("error") or not single:
            continue
        tot = sum(t["goodput_bps"] for t in d["tenants"].values())
        v = 100.0 * tot / single
        if sc == "together":
            # limits sum to the link here; only meaningful if they do
            pass
        if worst is None or v < worst:
            worst, where = v, sc
    out.append(TargetOutcome("utilisation", mode, worst, 95.0, None if worst is None else worst >= 95.0,
                             f"lowest total goodput vs single unshaped tenant: {where}"))
    # alone reaches its limit
    d = idx.get(f"alone/{mode}")
    worst, where = None, ""
    if d and not d.get("error"):
        for k, t in d["tenants"].items():
            p = t.get("pct_of_limit")
            if p is not None and (worst is None or p < worst):
                worst, where = p, k
    out.append(TargetOutcome("alone", mode, worst, 97.0, None if worst is None else worst >= 97.0,
                             f"lowest % of limit (L2): tenant {where}"))
    d = idx.get(f"converge/{mode}")
    if d and not d.get("error"):
        reach, settle = d["extra"].get("reach_s"), d["extra"].get("settle_s")
        out.append(TargetOutcome("convergence", mode, settle, 1.0,
                                 None if settle is None else settle < 1.0,
                                 f"reach {_f(reach, 2)} s, settled {_f(settle, 2)} s (0.1 s samples)"))
    else:
        out.append(TargetOutcome("convergence", mode, None, 1.0, None, "not run"))
    d = idx.get(f"latency/{mode}")
    if d and not d.get("error"):
        rtt = d["extra"].get("rtt", {})
        out.append(TargetOutcome("latency", mode, rtt.get("p99_ms"), None, None,
                                 f"p50 {_f(rtt.get('p50_ms'), 3)} ms, p99 {_f(rtt.get('p99_ms'), 3)} ms"))
    return out


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _pcts(t: dict | None) -> str:
    if t is None:
        return "not run"
    if "error" in t:
        return "error"
    return f"{_f(t.get('a'), 0)} % / {_f(t.get('b'), 0)} % / {_f(t.get('link'), 0)} %"


def render_source_table(idx: dict[str, dict], modes: tuple[str, ...] = ("shaperd", "hand-tc")) -> str:
    rows = source_rows(idx, modes)
    head = "| scenario | source design A / B / link | measured: shaperd | baseline: hand-written tc |"
    lines = [head, "|---|---|---|---|"]
    for r in rows:
        s = r["source"]
        src = f"{s['a']:g} % / {s['b']:g} % / {s['link']:g} %"
        if "none" in r:
            m = _pcts(r["none"]) + " (unshaped)"
            lines.append(f"| {r['scenario']} | {src} | {m} | {m} |")
        else:
            lines.append(f"| {r['scenario']} | {src} | {_pcts(r.get('shaperd'))} | {_pcts(r.get('hand-tc'))} |")
    return "\n".join(lines)


def render_targets(idx: dict[str, dict], modes: tuple[str, ...] = ("shaperd", "hand-tc")) -> str:
    per_mode = {m: {t.target: t for t in targets(idx, m)} for m in modes}
    lines = ["| target | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for key, text in TARGETS.items():
        cells = []
        for m in modes:
            t = per_mode[m].get(key)
            if t is None or (t.value is None and key != "latency"):
                cells.append("-")
                continue
            if key == "latency":
                cells.append(t.detail if t.value is not None else "-")
                continue
            mark = "" if t.ok is None else (" ok" if t.ok else " MISSED")
            unit = " s" if key == "convergence" else " %"
            cells.append(f"{_f(t.value)}{unit}{mark} ({t.detail})")
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_details(results: Iterable[Any]) -> str:
    lines = ["| scenario | mode | A Mbit/s | B Mbit/s | A % of G / L | B % of G / L | worst 1 s vs limit | "
             "drops uplink / wire | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        d = _d(r)
        if d.get("error"):
            lines.append(f"| {d['scenario']} | {d['mode']} | error: {d['error'][:80]} | | | | | | |")
            continue
        cells = []
        gl = []
        worst = None
        for k in ("a", "b"):
            t = d["tenants"].get(k)
            if not t:
                cells.append("-")
                gl.append("-")
                continue
            tag = " udp" if t["protocol"] == "UDP" else ""
            cells.append(f"{t['goodput_bps'] / 1e6:.0f}{tag}")
            gl.append(f"{_f(t.get('pct_of_guarantee'), 0)} / {_f(t.get('pct_of_limit'), 0)}"
                      if t.get("guarantee_bps") else "-")
            e = t.get("limit_excess_pct")
            if e is not None and (worst is None or e > worst):
                worst = e
        q = d.get("qdiscs", {})
        drops = f"{q.get('uplink', {}).get('drops', '-')} / {q.get('wire', {}).get('drops', '-')}"
        notes = []
        ex = d.get("extra", {})
        if "settle_s" in ex:
            notes.append(f"B reaches G in {_f(ex.get('reach_s'), 1)} s, settled {_f(ex.get('settle_s'), 1)} s")
        if "rtt" in ex:
            notes.append(f"B ping p50 {_f(ex['rtt'].get('p50_ms'), 3)} ms p99 {_f(ex['rtt'].get('p99_ms'), 3)} ms")
        if "idle_rtt" in ex:
            notes.append(f"(idle p50 {_f(ex['idle_rtt'].get('p50_ms'), 3)} ms)")
        if "udp_sent_bps" in ex:
            notes.append(f"UDP offered {ex['udp_sent_bps'] / 1e6:.0f} Mbit/s")
        lines.append(f"| {d['scenario']} | {d['mode']} | {cells[0]} | {cells[1]} | {gl[0]} | {gl[1]} | "
                     f"{_f(worst) + ' %' if worst is not None else '-'} | {drops} | {'; '.join(notes)} |")
    return "\n".join(lines)


def render(results: Iterable[Any], *, link_mbit: float, modes: tuple[str, ...] = ("shaperd", "hand-tc"),
           title: str | None = None) -> str:
    results = list(results)
    idx = index(results)
    parts = []
    if title:
        parts.append(title)
    parts.append(f"Source design's table, measured on a {link_mbit:g} Mbit/s emulated link "
                 "(tenant % = goodput vs that tenant alone on the unshaped link; link % = goodput / link rate):")
    parts.append(render_source_table(idx, modes))
    parts.append("Targets (measured, L2 rate as tc accounts it unless noted):")
    parts.append(render_targets(idx, modes))
    parts.append("Per scenario (goodput; G = guarantee, L = limit, both L2):")
    parts.append(render_details(results))
    return "\n\n".join(parts) + "\n"


def to_json(results: Iterable[Any], **meta: Any) -> dict:
    results = [_d(r) for r in results]
    idx = index(results)
    modes = tuple(m for m in ("shaperd", "hand-tc") if any(k.endswith("/" + m) for k in idx))
    return {**meta, "source_table": source_rows(idx, modes),
            "targets": {m: [t.to_dict() for t in targets(idx, m)] for m in modes},
            "results": results}
