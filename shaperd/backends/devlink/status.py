"""devlink's part of ``shaperd status``: the tenants' rate groups, configured vs read back (read only).

Collected by the same function as ``shaperd rdma devlink`` (cli.py: collect). No devlink family or no
rate node: no key, no text; any other probe failure is a read failure, shown.
"""

from __future__ import annotations

from shaperd.core.format import table as _table
from shaperd.core.units import format_rate

KEY = "devlink_rates"


def collect(cfg, roots, open_nl):
    from shaperd.backends.devlink import cli as cli_rdma_devlink

    out = cli_rdma_devlink.collect(cfg, roots, open_nl)
    if not out["enabled"]:
        # No family: nothing can be grouped here. Another probe failure is a read failure: shown.
        return None if out["family_absent"] else {"error": "; ".join(out["notes"]) or "devlink unavailable"}
    busy = any(d["pending"] or d["left_alone"] or d["error"] for d in out["devices"])
    return out if out["nodes"] or busy else None


def _bps(bytes_per_s) -> str:
    return "-" if bytes_per_s is None else ("unlimited" if bytes_per_s == 0 else format_rate(bytes_per_s * 8))


def render(s: dict) -> list[str]:
    lines = ["devlink rate groups (tx_share/tx_max):"]
    if "error" in s:
        return lines + [f"  error: {s['error']}"]
    rows = []
    for n in s["nodes"]:
        k = n["kernel"]
        rows.append((n["tenant"], f"{n['device']}/{n['node']}", f"{_bps(n['tx_share_Bps'])}/{_bps(n['tx_max_Bps'])}",
                     "not in the kernel" if k is None else f"{_bps(k['tx_share_Bps'])}/{_bps(k['tx_max_Bps'])}"))
    if rows:
        lines += ["  " + l for l in _table(("TENANT", "NODE", "CONFIGURED", "READ BACK"), rows)]
    for d in s["devices"]:
        lines += [f"  pending: {op}" for op in d["pending"]]
        lines += [f"  {d['device']}: {k.replace('_', ' ')}: {d[k]}" for k in ("left_alone", "error") if d[k]]
    return lines


class Section:
    order = 41
    key = KEY

    def __init__(self, inp, open_nl=None):
        self.inp = inp
        if open_nl is None:
            from shaperd.kernel import devlink as nl

            def open_nl():
                return nl.DevlinkNl(inp.netns, run_root=str(inp.roots.run))
        self.open_nl = open_nl

    def sample(self, reader) -> None:
        pass

    def collect(self, reader) -> dict:
        sec = collect(self.inp.config, self.inp.roots, self.open_nl)
        return {KEY: sec} if sec is not None else {}

    def render(self, doc: dict) -> str:
        return "\n".join(render(doc[KEY])) if KEY in doc else ""

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def sections(inp) -> list:
    return [Section(inp)] if inp.config is not None else []
