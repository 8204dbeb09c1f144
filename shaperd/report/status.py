"""``shaperd status``: live per-tenant class stats read straight from the kernel.

Works with or without the daemon: it reads HTB class counters twice, a short
window apart, and labels classes with tenant names from the tenants file
(class ids are derived from names, so no saved state is needed). Without a
readable tenants file, classes are shown by id. The RDMA path is read at the
same instants and shown beside it (report/rdma_view.py): the tenants' RDMA
ports and what they sent. After them, one section per NIC backend that has
something on this node (report/nic_status.py: VF rates, devlink rate groups,
RoCE DCB; configured vs read back), read through the same functions as
``shaperd rdma vf-rates``, ``rdma devlink`` and ``rdma dcb``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

from shaperd.core import exitcodes
from shaperd.core import format as output
from shaperd.core.config import load_file
from shaperd.core.errors import ConfigError
from shaperd.core.ids import assign_minors
from shaperd.backends.common.objects import DEFAULT_CLASS_MINOR, HANDLE_MAJOR, ROOT_CLASS_MINOR, fmt_handle
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


def rows(prev: dict, cur: dict, window_s: float, labels: dict[int, str]) -> list[Row]:
    out = []
    for (dev, cid), st in sorted(cur.items()):
        before = prev.get((dev, cid))
        rate = None
        if before is not None and window_s > 0 and st.bytes >= before.bytes:
            rate = (st.bytes - before.bytes) * 8 / window_s
        out.append(
            Row(
                device=dev, tenant=labels.get(cid, "?"), classid=fmt_handle(cid),
                guarantee_bps=st.rate_Bps * 8, limit_bps=st.ceil_Bps * 8, rate_bps=rate,
                bytes=st.bytes, packets=st.packets, drops=st.drops, overlimits=st.overlimits,
                backlog_bytes=st.backlog_bytes,
                borrowing=rate is not None and rate > st.rate_Bps * 8 * 1.01 and cid & 0xFFFF != ROOT_CLASS_MINOR,
                borrows=st.borrows,
            )
        )
    return out


def render_table(rs: list[Row], empty_note: str = "(no device carries shaperd's qdisc)") -> str:
    head = ("DEVICE", "TENANT", "CLASS", "GUARANTEE", "LIMIT", "RATE", "BYTES", "PACKETS", "DROPS", "OVERLIMITS", "BORROWING")
    lines = [head]
    for r in rs:
        lines.append((
            r.device, r.tenant, r.classid, format_rate(r.guarantee_bps), format_rate(r.limit_bps),
            "-" if r.rate_bps is None else format_rate(int(r.rate_bps)),
            str(r.bytes), str(r.packets), str(r.drops), str(r.overlimits), "yes" if r.borrowing else "no",
        ))
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)
    if not rs:
        text += "\n" + empty_note
    return text


def main(args) -> int:
    from shaperd.kernel.rtnl import RtnlReader

    from shaperd.core.roots import Roots
    from shaperd.backends.edt import status as edt_status
    from shaperd.report import rdma_view

    ipr = RtnlReader(getattr(args, "netns", None))
    labels = class_labels(args.config)
    nic_cfg = rdma_view.load_config(args.config)
    nic_roots = Roots.of(sys=args.sysfs_root, proc=args.procfs_root, run=args.run_root, kubelet=args.kubelet_root)
    rdma = rdma_view.RdmaWatch.open(Roots.of(sys=args.sysfs_root), args.config, rate_window_s=args.interval)
    edt = edt_status.EdtWatch(edt_status.Labels.load(args.config, args.sysfs_root),
                              edt_status.pins_for(getattr(args, "bpffs_root", ""), getattr(args, "netns", None)))
    try:
        return _loop(args, ipr, labels, nic_cfg, nic_roots, rdma, edt)
    finally:
        edt.close()


def _loop(args, ipr, labels, nic_cfg, nic_roots, rdma, edt) -> int:
    from shaperd.backends.htb.offload_probe import DeviceProbe
    from shaperd.backends.common import classifier_status
    from shaperd.engine import refusals_file as edt_refused
    from shaperd.backends.edt import status as edt_status
    from shaperd.report import nic_status
    from shaperd.report import rdma_view

    offload_probe = DeviceProbe(getattr(args, "netns", None), nic_roots)  # read-only: driver and ethtool features
    prev = sample(ipr)
    t0 = time.monotonic()
    rdma.sample(t0)
    edt.sample(ipr)
    while True:
        time.sleep(args.interval)
        cur = sample(ipr)
        t1 = time.monotonic()
        rdma.sample(t1)
        edt.sample(ipr)
        rs = rows(prev, cur, t1 - t0, labels)
        ports = rdma.view()
        nic = nic_status.collect(nic_cfg, nic_roots, ipr, netns=getattr(args, "netns", None))
        paths = classifier_status.with_offload_reasons(
            classifier_status.collect(ipr), ipr.links(), offload_probe,
            edt_refused.read(edt_refused.path_for(getattr(args, "run_root", "/run"), getattr(args, "netns", None))).get("htb"))
        if output.machine(args):  # -o json: one compact line per window (JSON lines under --watch)
            extra = {"classifier": paths} if paths else {}  # only where a device carries shaperd's HTB
            doc = {"window_s": round(t1 - t0, 3), "classes": [asdict(r) for r in rs], **edt.doc(),
                   "rdma": rdma_view.tenant_rows(ports), **nic, **extra, **edt_refused.doc(args)}
            print(("---\n" if args.watch and args.output == "yaml" else "") + output.dump(doc, args.output, indent=None))
            for err in edt.errors.values():
                exitcodes.err(err)
        else:
            if args.watch and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            print(render_table(rs, "(no device on the HTB data plane)") if edt.devices else render_table(rs))
            if edt.devices:
                print("\n" + edt_status.render(edt.rows(), edt.errors))
            if ports:
                print("\nRDMA ports (measured at the HCA; not shaped by tc):\n" + rdma_view.render_table(ports))
            if nic:
                print("\n" + nic_status.render(nic))
            if paths:
                print("\n" + classifier_status.render(paths))
            if refused := edt_refused.render(args):
                print("\n" + refused)
        sys.stdout.flush()
        if not args.watch:
            return 1 if edt.errors else 0  # a device unreadable: the others were shown (cli: 1 a device failed)
        prev, t0 = cur, t1
