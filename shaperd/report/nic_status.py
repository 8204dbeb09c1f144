"""The NIC backends in ``shaperd status``: VF rates, devlink rate groups, RoCE DCB; configured vs read back.

Each section is collected by the function its own subcommand uses
(``rdma vf-rates``: cli_rdma_vf.read/as_json, ``rdma devlink``:
cli_rdma_devlink.collect, ``rdma dcb``: cli_rdma_dcb.collect), read only.
A backend with nothing on this node (no tenant VF, no devlink family or no
rate node, no RoCE uplink with a tenant or readable DCB) has no key and
prints nothing. A backend whose
read fails has its key with ``{"error": ...}`` and one line; the others are
still shown. Without a readable tenants file nothing is planned: no section.
"""

from __future__ import annotations

from shaperd.core.units import format_rate

KEYS = ("vf_rates", "devlink_rates", "dcb")


def _vf_rates(cfg, roots, reader, kernel):
    from shaperd.backends.vfrate import cli as cli_rdma_vf

    out = cli_rdma_vf.as_json(*cli_rdma_vf.read(cfg, roots, reader, kernel))
    pfs_bad = any(p["blocked"] or p["error"] for p in out["pfs"].values())
    return out if out["vfs"] or pfs_bad else None


def _devlink(cfg, roots, open_nl):
    from shaperd.backends.devlink import cli as cli_rdma_devlink

    out = cli_rdma_devlink.collect(cfg, roots, open_nl)
    if not out["enabled"]:
        # No family: nothing can be grouped here. Another probe failure is a read failure: shown.
        return None if out["family_absent"] else {"error": "; ".join(out["notes"]) or "devlink unavailable"}
    busy = any(d["pending"] or d["left_alone"] or d["error"] for d in out["devices"])
    return out if out["nodes"] or busy else None


def _dcb(cfg, roots, netns, client):
    from shaperd.backends.dcb import cli as cli_rdma_dcb

    out = cli_rdma_dcb.collect(cfg, roots, netns, client=client)
    # An uplink no tenant uses whose DCB cannot be read (no DCB in its driver) has nothing to show.
    out["netdevs"] = {nd: r for nd, r in out["netdevs"].items() if "configured" in r or "read" in r}
    return out if out["netdevs"] else None


def collect(cfg, roots, reader, *, netns=None, vf_kernel=None, open_devlink=None, dcb_client=None) -> dict:
    """{key: section} for the backends that have something on this node; one failing does not stop the rest.

    ``reader``: the status command's rtnetlink reader (VF info and, unless ``dcb_client``, DCB go over it);
    the other arguments are the kernel sides, injectable for tests."""
    if cfg is None:
        return {}
    if open_devlink is None:
        from shaperd.kernel import devlink as nl

        def open_devlink():
            return nl.DevlinkNl(netns, run_root=str(roots.run))
    if dcb_client is None:
        from shaperd.kernel.dcb import DcbClient

        dcb_client = DcbClient(reader)
    steps = (("vf_rates", lambda: _vf_rates(cfg, roots, reader, vf_kernel)),
             ("devlink_rates", lambda: _devlink(cfg, roots, open_devlink)),
             ("dcb", lambda: _dcb(cfg, roots, netns, dcb_client)))
    out = {}
    for key, step in steps:
        try:
            sec = step()
        except Exception as e:  # noqa: BLE001 - one backend's failure is shown in its section, not fatal
            sec = {"error": f"{type(e).__name__}: {e}"}
        if sec is not None:
            out[key] = sec
    return out


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = [head, *rows]
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines]


def _mbit(v) -> str:
    return "-" if v is None else str(v)


def _bps(bytes_per_s) -> str:
    return "-" if bytes_per_s is None else ("unlimited" if bytes_per_s == 0 else format_rate(bytes_per_s * 8))


def render_vf_rates(s: dict) -> list[str]:
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


def render_devlink(s: dict) -> list[str]:
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


def _at(values, i):
    return None if values is None or i >= len(values) else values[i]


def render_dcb(s: dict) -> list[str]:
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


def render(sections: dict) -> str:
    """One compact block per section present, in KEYS order; '' when none."""
    renderers = {"vf_rates": render_vf_rates, "devlink_rates": render_devlink, "dcb": render_dcb}
    return "\n\n".join("\n".join(renderers[k](sections[k])) for k in KEYS if k in sections)
