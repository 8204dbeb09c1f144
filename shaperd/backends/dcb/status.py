"""dcb's part of ``shaperd status``: RoCE traffic classes per uplink, configured vs read back (read only).

Collected by the same function as ``shaperd rdma dcb`` (cli.py: collect). An uplink no tenant uses
whose DCB cannot be read (no DCB in its driver) has nothing to show.
"""

from __future__ import annotations

from shaperd.core.format import table as _table

KEY = "dcb"


def collect(cfg, roots, netns, client):
    from shaperd.backends.dcb import cli as cli_rdma_dcb

    out = cli_rdma_dcb.collect(cfg, roots, netns, client=client)
    # An uplink no tenant uses whose DCB cannot be read (no DCB in its driver) has nothing to show.
    out["netdevs"] = {nd: r for nd, r in out["netdevs"].items() if "configured" in r or "read" in r}
    return out if out["netdevs"] else None


def _at(values, i):
    return None if values is None or i >= len(values) else values[i]


def render(s: dict) -> list[str]:
    lines = ["RoCE DCB (ETS share, max rate per TC):"]
    if "error" in s:
        return lines + [f"  error: {s['error']}"]
    for nd, r in s["netdevs"].items():
        lines.append(f"  {nd}:")
        rd = r.get("read") or {}
        rows = []
        for t in (r.get("configured") or {}).get("tenants", []):
            max_cfg = f"{t['maxrate_kbps']} kbit/s" if t["maxrate_kbps"] else "unlimited"
            share, mx = _at(rd.get("tc_bw_pct"), t["tc"]), _at(rd.get("maxrate_kbps"), t["tc"])
            rows.append((t["tenant"], str(t["dscp"]), f"TC{t['tc']}", f"{t['share_pct']} %", max_cfg,
                         "-" if share is None else f"{share} %",
                         "-" if mx is None else (f"{mx} kbit/s" if mx else "unlimited")))
        if rows:
            lines += ["    " + l for l in _table(("TENANT", "DSCP", "TC", "SHARE", "MAX", "READ SHARE", "READ MAX"),
                                                 rows)]
        if r["error"]:
            lines.append(f"    error: {r['error']}")
        lines += [f"    did not stick: {k}" for k in r["not_sticking"]]
        lines += [f"    not in effect: {w}" for w in r["would_write"]]
        if r["blocked"]:
            lines.append(f"    not enforced: {r['blocked']}")
    return lines


class Section:
    order = 42
    key = KEY

    def __init__(self, inp, client=None):
        self.inp, self.client = inp, client

    def sample(self, reader) -> None:
        pass

    def collect(self, reader) -> dict:
        client = self.client
        if client is None:
            from shaperd.kernel.dcb import DcbClient

            client = DcbClient(reader)
        sec = collect(self.inp.config, self.inp.roots, self.inp.netns, client)
        return {KEY: sec} if sec is not None else {}

    def render(self, doc: dict) -> str:
        return "\n".join(render(doc[KEY])) if KEY in doc else ""

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def sections(inp) -> list:
    return [Section(inp)] if inp.config is not None else []
