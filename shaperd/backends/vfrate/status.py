"""vfrate's part of ``shaperd status``: each tenant's VFs, configured vs as the PF reads them back (read only).

Collected by the same functions as ``shaperd rdma vf-rates`` (cli.py: read/as_json). A node with no
tenant VF has no key and prints nothing; a failed read is shown in the section (the others still are).
"""

from __future__ import annotations

from shaperd.core.format import table as _table

KEY = "vf_rates"


def collect(cfg, roots, reader, diff_one, kernel=None):
    from shaperd.backends.vfrate import cli

    out = cli.as_json(*cli.read(cfg, roots, reader, diff_one, kernel))
    pfs_bad = any(p["blocked"] or p["error"] for p in out["pfs"].values())
    return out if out["vfs"] or pfs_bad else None


def _mbit(v) -> str:
    return "-" if v is None else str(v)


def render(s: dict) -> list[str]:
    lines = ["SR-IOV VF rates (Mbit/s, min/max):"]
    if "error" in s:
        return lines + [f"  error: {s['error']}"]
    rows = [(r["tenant"], r["pf"], str(r["vf"]), f"{r['min_mbps']}/{r['max_mbps']}",
             f"{_mbit(r['reported_min_mbps'])}/{_mbit(r['reported_max_mbps'])}",
             "yes" if r["min_rate_supported"] else f"no ({r['reason']})", r["state"]) for r in s["vfs"]]
    if rows:
        lines += ["  " + l for l in _table(("TENANT", "PF", "VF", "CONFIGURED", "READ BACK", "MIN RATE", "STATE"),
                                           rows)]
    lines += [f"  note: {r['tenant']} vf {r['vf']}: {r['note']}" for r in s["vfs"] if r["note"]]
    lines += [f"  {pf}: {p['blocked'] or p['error']}" for pf, p in s["pfs"].items() if p["blocked"] or p["error"]]
    return lines


class Section:
    order = 40
    key = KEY

    def __init__(self, inp, kernel=None):
        self.inp, self.kernel = inp, kernel

    def sample(self, reader) -> None:
        pass

    def collect(self, reader) -> dict:
        sec = collect(self.inp.config, self.inp.roots, reader, self.inp.diff_one, self.kernel)
        return {KEY: sec} if sec is not None else {}

    def render(self, doc: dict) -> str:
        return "\n".join(render(doc[KEY])) if KEY in doc else ""

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def sections(inp) -> list:
    return [Section(inp)] if inp.config is not None else []
