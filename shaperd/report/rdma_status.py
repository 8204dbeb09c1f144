"""``shaperd rdma status [--json]``: the node's RDMA devices and ports, their owners, SL and TC, and what they sent.

Per port: link layer, state, rate, LID/SM LID (InfiniBand), netdevs and the
RoCE v2 GID index (RoCE), the owning tenant with its service level and
traffic class (the RDMA plan), and counters read twice ``--interval`` apart:
bytes (port_xmit_data x 4), packets, port_xmit_wait, their rates, and the
driver's hw counters. Notes say what could not be read or seen (netns
exclusive mode, a port without counters/, a saturated 32-bit counter, RDMA
netlink disagreeing with sysfs or absent).

The subnet manager's tables: ``collect(sm_check=...)`` takes a function
``port -> dict | None`` (a dict with at least ``ok``), or ``sm_check_for``
one ``watch -> that function`` (report/rdma_smcheck.py: every InfiniBand
port read with smpquery and compared; the CLI's default, ``--no-sm-check``
skips it). Its result is the port's ``sm_check`` field and the SM TABLES
column (ok / MISMATCH / NOT VERIFIED, details below the table); without a
check the field and the column are absent, never a made-up value.

Works without the daemon; needs no root to read sysfs (RDMA netlink
answers unprivileged reads too).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shaperd.core import format as output
from shaperd.core.exitcodes import EXIT_OK
from shaperd.core.inventory import RdmaDevice, RdmaPort
from shaperd.core.roots import Roots
from shaperd.core.units import format_rate
from shaperd.report.rdma_accounting import RdmaPortSeries
from shaperd.report.rdma_view import RdmaWatch

SmCheck = Callable[[RdmaPort], Mapping | None]


@dataclass
class NetlinkView:
    """What RDMA netlink says, for comparison with sysfs."""

    available: bool
    error: str | None = None
    devices: list[str] = field(default_factory=list)
    netns_exclusive: bool | None = None
    notes: list[str] = field(default_factory=list)


def read_netlink(devices: tuple[RdmaDevice, ...], netns: str | None = None, run_root: str = "/run",
                 reader_factory=None) -> NetlinkView:
    """Devices and ports over RDMA netlink, and where they disagree with sysfs (as notes)."""
    from shaperd.core.errors import KernelError
    from shaperd.kernel import rdma_nl

    try:
        reader = reader_factory() if reader_factory else rdma_nl.RdmaNlReader(netns, run_root=run_root)
    except rdma_nl.RdmaNetlinkAbsent as e:
        notes = [f"RDMA netlink: {e.cause}, yet sysfs shows devices"] if devices else []
        return NetlinkView(False, str(e), notes=notes)
    except KernelError as e:
        return NetlinkView(False, str(e), notes=[f"RDMA netlink unreadable: {e}"])
    view = NetlinkView(True)
    try:
        with reader:
            rows = reader.devices()
            view.devices = [d.name for d in rows]
            try:
                view.netns_exclusive = reader.system().netns_exclusive
            except KernelError:
                pass  # kernels before 5.2 have no RDMA_NLDEV_CMD_SYS_GET
            by_name = {d.name: d for d in devices}
            for d in rows:
                mine = by_name.get(d.name)
                if mine is None:
                    view.notes.append(f"{d.name}: seen over RDMA netlink, not in sysfs")
                    continue
                if d.node_guid and mine.node_guid and d.node_guid != mine.node_guid:
                    view.notes.append(f"{d.name}: node GUID {d.node_guid} over netlink, {mine.node_guid} in sysfs")
                for p in reader.ports(d.index, d.name):
                    sp = mine.port(p.port)
                    if sp is None:
                        view.notes.append(f"{p.ref}: port seen over RDMA netlink, not in sysfs")
                    elif p.state_name and sp.state and p.state_name != sp.state:
                        view.notes.append(f"{p.ref}: state {p.state_name} over netlink, {sp.state} in sysfs")
            for name in sorted(set(by_name) - set(view.devices)):
                view.notes.append(f"{name}: in sysfs, not over RDMA netlink")
    except KernelError as e:
        view.error = str(e)
        view.notes.append(f"RDMA netlink: {e}")
    if view.netns_exclusive:
        view.notes.append("RDMA netns mode is exclusive (RDMA netlink): devices in pod network namespaces are "
                          "not visible from here")
    return view


@dataclass
class PortStatus:
    device: str
    port: int
    link_layer: str
    state: str
    phys_state: str
    rate: str
    lid: int | None
    sm_lid: int | None
    netdevs: list[str]
    roce_v2_gid_index: int | None
    tenant: str | None
    service_level: int | None
    traffic_class: int | None
    dscp: int | None
    counters: dict | None  # None: unreadable
    hw_counters: dict
    notes: list[str]
    sm_check: Mapping | None = None  # absent from the output when no check ran


def _counters(s: RdmaPortSeries | None) -> tuple[dict | None, dict]:
    if s is None or not s.readable:
        return None, {}
    c = {"bytes": s.bytes_total, "packets": s.packets_total, "xmit_wait": s.wait_total, "rate_bps": s.rate_bps,
         "packet_rate_pps": s.packet_rate_pps, "xmit_wait_rate_per_s": s.wait_rate_per_s,
         "saturated": list(s.saturated), "resets": s.resets}
    hw = {n: {"total": v, "rate_per_s": s.hw_rates_per_s.get(n)} for n, v in s.hw_totals.items()}
    return c, hw


def collect(roots: Roots, config_path: str | None, interval_s: float, *, sleep=time.sleep, clock=time.monotonic,
            netlink: Callable[[tuple[RdmaDevice, ...]], NetlinkView] | None = None,
            sm_check: SmCheck | None = None, sm_check_for: Callable[[RdmaWatch], SmCheck] | None = None) -> dict:
    """Everything ``rdma status`` shows, as data (``sleep`` and ``clock`` injectable)."""
    w = RdmaWatch.open(roots, config_path, rate_window_s=max(interval_s, 0.001) * 2)
    t0 = clock()
    w.sample(t0)
    sleep(interval_s)
    t1 = clock()
    w.sample(t1)
    series = {(s.target.device, s.target.port): s for s in w.view()}
    if sm_check_for is not None:
        sm_check = sm_check_for(w)
    nl = netlink(w.devices) if netlink else None
    notes = list(w.notes) + ([x for x in w.plan.warnings if x not in w.notes] if w.plan else [])
    if config_path and w.config is None:
        notes.append(f"{config_path}: not a readable tenants file; no port has an owner")
    devices = []
    for d in w.devices:
        ports = []
        for p in d.ports:
            owner = w.plan.owners.get((p.device, p.port)) if w.plan else None
            t = w.plan.tenant(owner) if (w.plan and owner) else None
            s = series.get((p.device, p.port))
            counters, hw = _counters(s)
            ps = PortStatus(p.device, p.port, p.link_layer, p.state, p.phys_state, p.rate, p.lid, p.sm_lid,
                            list(p.netdevs), p.roce_v2_gid_index, owner,
                            t.service_level if t else None, t.traffic_class if t else None, t.dscp if t else None,
                            counters, hw, list(s.notes) if s else [])
            if sm_check is not None:
                ps.sm_check = sm_check(p)
            ports.append(ps)
        devices.append({"name": d.name, "node_guid": d.node_guid, "fw_ver": d.fw_ver or None, "pci": d.pci,
                        "is_vf": d.is_vf, "pf_pci": d.pf_pci, "sriov_numvfs": d.sriov_numvfs, "parent": d.parent,
                        "ports": [_port_dict(ps) for ps in ports]})
    out = {"window_s": round(t1 - t0, 3), "devices": devices, "notes": notes}
    if nl is not None:
        out["netlink"] = {"available": nl.available, "error": nl.error, "devices": nl.devices,
                          "netns_exclusive": nl.netns_exclusive}
        out["notes"].extend(nl.notes)
    return out


def _port_dict(ps: PortStatus) -> dict:
    d = dict(ps.__dict__)
    if d["sm_check"] is None:
        del d["sm_check"]
    return d


def render(status: dict) -> str:
    ports = [p for d in status["devices"] for p in d["ports"]]
    with_sm = any("sm_check" in p for p in ports)
    head = ["DEVICE", "PORT", "LINK", "STATE", "RATE", "TENANT", "SL", "TC", "NETDEV", "GID", "TX RATE", "BYTES",
            "PACKETS", "XMIT WAIT"] + (["SM TABLES"] if with_sm else [])
    lines = [head]

    def n(v):
        return "-" if v is None else str(v)

    for p in ports:
        c = p["counters"] or {}
        rate = c.get("rate_bps")
        row = [p["device"], str(p["port"]), p["link_layer"], p["state"], p["rate"].split(" (")[0] or "-",
               p["tenant"] or "(none)", n(p["service_level"]), n(p["traffic_class"]), ",".join(p["netdevs"]) or "-",
               n(p["roce_v2_gid_index"]), "-" if rate is None else format_rate(int(rate)), n(c.get("bytes")),
               n(c.get("packets")), n(c.get("xmit_wait"))]
        if with_sm:
            chk = p.get("sm_check")
            state = None if chk is None else chk.get("status", "verified" if chk.get("ok") else "mismatch")
            row.append({None: "-", "verified": "ok"}.get(state, str(state).upper()))
        lines.append(row)
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines]
    if not ports:
        out.append("(no RDMA device visible from here)")
    for p in ports:
        if p["hw_counters"]:
            hw = " ".join(f"{k}={v['total']}" for k, v in p["hw_counters"].items())
            out.append(f"{p['device']}:{p['port']} hw: {hw}")
    for p in ports:
        chk = p.get("sm_check")
        if chk and not chk.get("ok") and chk.get("summary"):
            out.append(f"SM tables {chk['summary']}")
    nl = status.get("netlink")
    if nl is not None:
        out.append("RDMA netlink: " + (f"{len(nl['devices'])} device(s) ({', '.join(nl['devices']) or 'none'})"
                                       if nl["available"] else f"not available ({nl['error']})"))
    notes = list(dict.fromkeys(status["notes"] + [x for p in ports for x in p["notes"]]))
    out.extend(f"note: {x}" for x in notes)
    return "\n".join(out)


def main(args) -> int:
    roots = Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root)
    nl = None if args.no_netlink else (lambda devs: read_netlink(devs, getattr(args, "netns", None), args.run_root))
    status = collect(roots, args.config, args.interval, netlink=nl, sm_check_for=None if args.no_sm_check else
                     _sm_check(args))
    print(output.dump(status, args.output) if output.machine(args) else render(status))
    sys.stdout.flush()
    return EXIT_OK


def _sm_check(args):
    from shaperd.kernel import ib_smp
    from shaperd.report.rdma_smcheck import for_watch

    return for_watch(ib_smp.reader(timeout_s=args.sm_check_timeout), dict(args.max_vls),
                     no_config=f"{args.config}: not a readable tenants file; no expected tables")


def register(sub, node_opts) -> None:
    from shaperd.rdma.opensm import max_vls_arg

    p = sub.add_parser("status", help="RDMA devices and ports: owners, SL and TC, counters and rates, notes")
    node_opts(p)
    output.add_output(p)
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="rate window (default 1)")
    p.add_argument("--no-netlink", action="store_true", help="do not cross-check sysfs with RDMA netlink")
    p.add_argument("--no-sm-check", action="store_true", help="do not read the SM's SL2VL/VLArb tables (smpquery)")
    p.add_argument("--max-vls", action="append", type=max_vls_arg, metavar="N|TYPE=N", default=[],
                   help="as given to 'rdma opensm-config' (the expected tables depend on it; default 8)")
    p.add_argument("--sm-check-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="deadline of each smpquery call (default 10)")
    p.set_defaults(fn=main)
