"""``shaperd status`` / ``shaperd top`` on the edt data plane: per-tenant rows read from each stamper's maps.

Owns which devices are shown (root qdisc 7365:, mq or sch_fq, the edt
backend's; its stamper on clsact egress at prio PRIO_STAMPER), how a reading
command opens their maps, and what a row means:

- maps: through the bpffs pins under ``--bpffs-root`` when the device has an
  entry there (``<root>/shaperd/<scope>/edt-stamper/<device>``, CAP_BPF), else
  by program id (CAP_SYS_ADMIN), both by kernel/edt_prog.py
  ``open_for_device``, as the rate controller does. A pin that is not the
  attached program's is refused (no fallback: the pins are what the agent
  uses). A device whose maps cannot be read gets one error naming it and
  what is missing; its rows are left out, never shown as zeros;
- per tenant (map key = the tenant's class minor, backends/ids.assign_minors;
  key DEFAULT_KEY = traffic of no tenant, "(none)"): guarantee and limit as
  the edt planner gives them to the controller, the rate in the map (Q16
  ns/byte, converted by the controller's ``rate_bps_of_q16``), the rate
  measured over the window between two readings, the stamper's byte, packet
  and horizon-drop counters (since the program was attached), the backlog
  (the tenant's departure clock minus now, CLOCK_MONOTONIC like
  bpf_ktime_get_ns; 0 when not ahead) and whether it sends above its
  guarantee (borrowing, with status's 1 % margin).

Reads only: never writes a rate, a clock or a pin. Speaks to the kernel only
through kernel/edt_prog.py and the rtnetlink reader it is given.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from shaperd.backends.edt.controller import rate_bps_of_q16
from shaperd.backends.edt.objects import DEFAULT_KEY, PRIO_STAMPER, ROOT_HANDLE
from shaperd.backends.common.objects import HANDLE_MAJOR, fmt_handle
from shaperd.core.units import format_rate
from shaperd.core.protocol import StatusSection
from shaperd.core.units import format_backlog_ns as format_backlog  # status and top show it alike

NONE_TENANT = "(none)"  # the default key: traffic of no tenant (edt_metrics labels it the same)
UNKNOWN_TENANT = "?"  # a key in the maps that the tenants file does not name (or no tenants file)
TC_H_ROOT = 0xFFFFFFFF
TC_H_CLSACT_EGRESS = 0xFFFFFFF3
BORROW_MARGIN = 1.01  # as report/status.py: above the guarantee by more than 1 %
POD_MARK = "└ pod"  # a capped pod's row, under its tenant's (the pod's name is the daemon's: its metrics, plan)
SECTION_TITLE = "EDT data plane (departure-time pacing)"


@dataclass(frozen=True)
class EdtDevice:
    """A device carrying the edt root; ``stamper`` is the attached stamper's program name, or None."""

    device: str
    ifindex: int
    stamper: str | None
    link: object = None  # the rtnetlink LinkRow (speed, queues) for the planner's shares
    error: str | None = None  # its clsact filters could not be dumped


@dataclass(frozen=True)
class Share:
    tenant: str
    guarantee_bps: int | None
    limit_bps: int | None


@dataclass(frozen=True)
class Reading:
    """One read of one stamper's maps."""

    stamper: str
    t_s: float  # monotonic seconds, for the rate window
    now_ns: int  # CLOCK_MONOTONIC ns, the stamper's clock, for the backlog
    stats: dict  # key -> Stats(bytes, packets, dropped)
    q16: dict  # key -> ns per byte, Q16 (0: no rate set)
    clocks: dict  # key -> the tenant's next departure time, ns
    parents: dict = field(default_factory=dict)  # capped pod's key -> its parent's key


@dataclass
class EdtRow:
    device: str
    tenant: str
    key: int
    classid: str  # the class id the map classifier writes into skb->priority (7368:<key>)
    guarantee_bps: int | None
    limit_bps: int | None
    map_rate_bps: int | None  # the departure rate in the stamper's map; None: no rate set (not paced)
    map_ns_per_byte_q16: int
    rate_bps: float | None  # measured over the window; None on the first reading
    bytes: int
    packets: int
    drops: int  # horizon drops by the stamper, since it was attached
    backlog_ns: int  # departure clock ahead of now
    borrowing: bool
    # A capped pod's own key: its parent's key (the tenant it is shown under); None on a tenant's row.
    parent_key: int | None = None


class Labels:
    """Tenant names and shares per map key, from the tenants file (None: keys only)."""

    def __init__(self, cfg=None, speed_of=lambda name: None):
        from shaperd.core.ids import assign_minors

        self.cfg = cfg
        self.speed_of = speed_of  # device name -> link speed bit/s or None (sysfs; tests inject)
        self.minors = assign_minors([t.name for t in cfg.tenants]) if cfg is not None else {}

    @classmethod
    def load(cls, config_path: str | None, sysfs_root: str = "/sys") -> Labels:
        from shaperd.core.config import load_file
        from shaperd.discovery.node import read_speed_bps
        from shaperd.core.errors import ConfigError
        from shaperd.core.roots import Roots

        cfg = None
        if config_path:
            try:
                cfg = load_file(config_path)
            except ConfigError:
                cfg = None  # as status's class labels: shown by key
        roots = Roots.of(sys=sysfs_root)
        return cls(cfg, lambda name: read_speed_bps(name, roots))

    def keys(self) -> set[int]:
        return set(self.minors.values()) | {DEFAULT_KEY}

    def shares(self, dev: EdtDevice) -> dict[int, Share]:
        """What the edt planner tells the controller about each key on ``dev``; from the file alone where the
        planner cannot size the device (no capacity known): then an unset limit and the reserve are unknown."""
        if self.cfg is None:
            return {DEFAULT_KEY: Share(NONE_TENANT, None, None)}
        from shaperd.backends.edt.plan import plan_device
        from shaperd.core.inventory import Link

        link = dev.link
        if link is not None:
            inv_link = Link(name=link.name, ifindex=link.ifindex, kind=link.kind,
                            speed_bps=None if link.kind else self.speed_of(link.name), mtu=link.mtu, up=link.up,
                            tx_queues=link.tx_queues)
            dp, _problems = plan_device(self.cfg, inv_link, self.minors)
            if dp is not None:
                return {s.key: Share(s.tenant or NONE_TENANT, s.guarantee_bps, s.limit_bps) for s in dp.shares}
        out = {DEFAULT_KEY: Share(NONE_TENANT, self.cfg.node.reserve_bps, None)}
        for t in self.cfg.tenants:
            out[self.minors[t.name]] = Share(t.name, t.guarantee_bps, t.limit_bps)
        return out


def devices(reader) -> list[EdtDevice]:
    """Every device whose root is the edt backend's (7365:), with the name of the stamper attached there."""
    from shaperd.core.errors import KernelError

    qdiscs = reader.qdiscs()
    links = {l.ifindex: l for l in reader.links()}
    roots = sorted(q.ifindex for q in qdiscs
                   if q.parent == TC_H_ROOT and q.handle == ROOT_HANDLE and q.kind in ("mq", "fq"))
    clsact = {q.ifindex for q in qdiscs if q.kind == "clsact"}
    out = []
    for idx in roots:
        link = links.get(idx)
        name = link.name if link is not None else str(idx)
        stamper, error = None, None
        if idx in clsact:
            try:
                for f in reader.filters(idx, TC_H_CLSACT_EGRESS, name):
                    if f.kind == "bpf" and f.prio == PRIO_STAMPER and f.prog_id:
                        stamper = f.name
            except KernelError as e:  # one device (gone meanwhile, busy) never hides the others
                error = str(e)
        out.append(EdtDevice(name, idx, stamper, link, error))
    return out


def open_stamper_maps(reader, dev: EdtDevice, pins):
    """The stamper's maps on ``dev``: through ``pins`` (the "edt-stamper" PinStore) when it has an entry for the
    device, else by program id. Raises BpfMapError (PinError) with a cause naming the device."""
    from shaperd.kernel import bpf_maps
    from shaperd.kernel import bpf_pins
    from shaperd.backends.edt import kernel_stamper as edt_prog

    pinned = False
    if pins is not None:
        try:
            pinned = dev.device in pins.entries()
        except bpf_pins.PinError:
            pinned = False  # an unreadable pin directory: by id, and say so if that fails too
    if pinned:
        return edt_prog.open_for_device(reader, dev.ifindex, dev.device, dev.stamper, pins)
    try:
        return edt_prog.open_for_device(reader, dev.ifindex, dev.device, dev.stamper)
    except bpf_maps.BpfMapError as e:
        where = f"no bpffs pins at {pins.path(dev.device)}" if pins is not None else "no bpffs root given"
        raise bpf_maps.BpfMapError(f"{e}; {where}, and reading the maps by program id needs CAP_SYS_ADMIN",
                                   e.errno) from None


def read_maps(maps, keys: set[int], t_s: float, mono_ns, stamper: str, scan_rates: bool = False) -> Reading:
    """One reading: counters of every key the stamper has seen, then the rates and clocks of those and ``keys``.

    ``scan_rates`` (no tenants file): every key with a rate set, from one batched read of the whole array
    (64 Ki entries, tens of ms in Python), else one lookup per key. ``mono_ns`` is read right after the
    clocks, so the backlog (clock - now) is not inflated by the time the other reads took."""
    stats = maps.read_stats()
    parents = maps.read_parents()
    if scan_rates:
        q16 = maps.read_set_rates()
        wanted = sorted(set(keys) | set(stats) | set(q16) | set(parents))
    else:
        wanted = sorted(set(keys) | set(stats) | set(parents))
        q16 = {k: v for k, v in maps.read_rates(wanted).items() if v}
    clocks = maps.read_clocks(wanted)
    return Reading(stamper, t_s, mono_ns(), stats, q16, clocks, parents)


def _mono_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class EdtWatch:
    """The edt devices' readings at status's instants: ``sample`` twice (or per window), then ``rows``/``errors``.

    Keeps each device's maps open between readings (reopened when the stamper changes or a read fails)."""

    def __init__(self, labels: Labels, pins=None, open_maps=None, clock=time.monotonic,
                 mono_ns=_mono_ns):
        self.labels = labels
        self.pins = pins
        self.open_maps = open_maps
        self.clock = clock
        self.mono_ns = mono_ns
        self._maps: dict[str, tuple[str, object]] = {}
        self.prev: dict[str, Reading] = {}
        self.cur: dict[str, Reading] = {}
        self.errors: dict[str, str] = {}
        self.devices: list[EdtDevice] = []

    def sample(self, reader) -> None:
        from shaperd.core.errors import KernelError
        from shaperd.kernel.bpf_maps import BpfMapError

        self.prev, self.cur, self.errors = self.cur, {}, {}
        self.devices = devices(reader)
        for dev in self.devices:
            try:
                if dev.error is not None:
                    raise BpfMapError(dev.error)
                if dev.stamper is None:
                    raise BpfMapError(f"no shaperd stamper attached on clsact egress (prio {PRIO_STAMPER})")
                held = self._maps.get(dev.device)
                if held is None or held[0] != dev.stamper:
                    self._close(dev.device)
                    held = self._maps[dev.device] = (dev.stamper, (self.open_maps or open_stamper_maps)(reader, dev, self.pins))
                self.cur[dev.device] = read_maps(held[1], self.labels.keys(), self.clock(), self.mono_ns,
                                                 dev.stamper, scan_rates=self.labels.cfg is None)
            except (BpfMapError, KernelError, OSError) as e:
                self._close(dev.device)
                self.errors[dev.device] = f"read edt stamper maps on {dev.device}: {e}"
        for gone in set(self._maps) - {d.device for d in self.devices}:
            self._close(gone)

    def _close(self, device: str) -> None:
        held = self._maps.pop(device, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        for device in list(self._maps):
            self._close(device)

    def rows(self) -> list[EdtRow]:
        out = []
        for dev in self.devices:
            cur = self.cur.get(dev.device)
            if cur is not None:
                out.extend(rows_of(dev, self.prev.get(dev.device), cur, self.labels))
        return out

    def doc(self) -> dict:
        """``-o json|yaml``: {"edt": rows, "edt_errors": [...]}; empty where no device carries the edt root."""
        if not self.devices:
            return {}
        return {"edt": [asdict(r) for r in self.rows()],
                "edt_errors": [{"device": d, "error": e} for d, e in sorted(self.errors.items())]}


def rows_of(dev: EdtDevice, prev: Reading | None, cur: Reading, labels: Labels) -> list[EdtRow]:
    """One row per key: every tenant of the file, the default key, and any key the maps hold; each capped
    pod's key (a key with a parent) right after its tenant's row, named by that tenant, its LIMIT its cap."""
    from shaperd.backends.edt.objects import Stats

    shares = labels.shares(dev)
    keys = sorted(set(shares) | labels.keys() | set(cur.stats) | set(cur.q16) | set(cur.parents))
    window_s = cur.t_s - prev.t_s if prev is not None else 0.0
    same = prev is not None and prev.stamper == cur.stamper and window_s > 0

    def row(k: int, share: Share, parent: int | None) -> EdtRow:
        st = cur.stats.get(k, Stats(0, 0, 0))
        rate = None
        if same:
            before = prev.stats.get(k, Stats(0, 0, 0))
            if st.bytes >= before.bytes:
                rate = (st.bytes - before.bytes) * 8 / window_s
        q16 = cur.q16.get(k, 0)
        clock = cur.clocks.get(k, 0)
        return EdtRow(
            device=dev.device, tenant=share.tenant, key=k, classid=fmt_handle(HANDLE_MAJOR << 16 | k),
            guarantee_bps=share.guarantee_bps, limit_bps=share.limit_bps,
            map_rate_bps=rate_bps_of_q16(q16) if q16 else None, map_ns_per_byte_q16=q16, rate_bps=rate,
            bytes=st.bytes, packets=st.packets, drops=st.dropped, backlog_ns=max(0, clock - cur.now_ns),
            borrowing=rate is not None and share.guarantee_bps is not None
            and rate > share.guarantee_bps * BORROW_MARGIN, parent_key=parent,
        )

    def share_of(k: int) -> Share:
        return shares.get(k) or Share(NONE_TENANT if k == DEFAULT_KEY else UNKNOWN_TENANT, None, None)

    out = []
    pods_of: dict[int, list[int]] = {}
    for k in keys:
        if k in cur.parents:
            pods_of.setdefault(cur.parents[k], []).append(k)
    for k in keys:
        if k in cur.parents:
            continue
        out.append(row(k, share_of(k), None))
        out.extend(_pod_row(row, p, cur, share_of(k).tenant) for p in pods_of.pop(k, ()))
    for parent, pods in sorted(pods_of.items()):  # a parent key the stamper holds no row for
        out.extend(_pod_row(row, p, cur, share_of(parent).tenant) for p in pods)
    return out


def _pod_row(row, key: int, cur: Reading, tenant: str) -> EdtRow:
    """A capped pod's key: no guarantee of its own; its limit is its cap, the static rate in the map."""
    q16 = cur.q16.get(key, 0)
    return row(key, Share(tenant, None, rate_bps_of_q16(q16) if q16 else None), cur.parents[key])


def _rate(bps) -> str:
    return "-" if bps is None else format_rate(int(bps))




def render(rows: list[EdtRow], errors: dict[str, str]) -> str:
    head = ("DEVICE", "TENANT", "KEY", "GUARANTEE", "LIMIT", "MAP RATE", "RATE", "BYTES", "PACKETS", "DROPS",
            "BACKLOG", "BORROWING")
    lines = [head]
    for r in rows:
        pod = r.parent_key is not None
        lines.append((r.device, POD_MARK if pod else r.tenant, str(r.key), _rate(r.guarantee_bps),
                      _rate(r.limit_bps), "unset" if r.map_rate_bps is None else format_rate(r.map_rate_bps),
                      _rate(r.rate_bps), str(r.bytes), str(r.packets), str(r.drops), format_backlog(r.backlog_ns),
                      "-" if pod else "yes" if r.borrowing else "no"))
    text = SECTION_TITLE + ":"
    if rows:
        widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
        text += "\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)
    for dev, err in sorted(errors.items()):
        text += f"\n  {dev}: {err}"
    return text


def pins_for(bpffs_root: str | None, netns: str | None):
    """The stampers' PinStore under ``--bpffs-root`` (the one the edt backend pins into), or None ('')."""
    if not bpffs_root:
        return None
    from shaperd.kernel import bpf_pins
    from shaperd.backends.edt import kernel_stamper as edt_prog

    return bpf_pins.PinStore(bpffs_root, bpf_pins.scope_for(netns)).sub(edt_prog.STAMPER_PINS)



class Section(StatusSection):
    """edt's ``shaperd status`` section: the stampers' maps at the window's ends (none: no key, no text)."""

    order = 20
    key = "edt"

    def __init__(self, inp):
        self.watch = EdtWatch(Labels.load(inp.config_path, str(inp.roots.sys)), pins_for(inp.bpffs_root, inp.netns))

    def sample(self, reader) -> None:
        self.watch.sample(reader)

    def collect(self, reader) -> dict:
        return self.watch.doc()

    def render(self, doc: dict) -> str:
        return render(self.watch.rows(), self.watch.errors) if self.watch.devices else ""

    def errors(self) -> list[str]:
        """A device whose maps cannot be read: the others are shown, status exits 1."""
        return list(self.watch.errors.values())

    def close(self) -> None:
        self.watch.close()


def sections(inp) -> list:
    return [Section(inp)]


class _Counters:
    """An edt row as top's accounting counters: demand (qlen) = the departure clock ahead of now."""

    def __init__(self, r):
        self.bytes, self.packets, self.drops, self.overlimits = r.bytes, r.packets, r.drops, 0
        self.backlog_bytes, self.qlen = 0, 1 if r.backlog_ns > 0 else 0
        self.rate_Bps = (r.guarantee_bps or 0) // 8
        self.ceil_Bps = (r.limit_bps or 0) // 8


class TopPlane:
    """``shaperd top``'s edt rows: the stampers' counters per tenant of the file, backlog as time."""

    name = "edt"

    def __init__(self, inp):
        self.watch = EdtWatch(Labels.load(inp.config_path, str(inp.roots.sys)), pins_for(inp.bpffs_root, inp.netns))
        self._backlog: dict = {}

    def sample(self, reader) -> tuple[dict, dict]:
        from shaperd.backends.common.objects import HANDLE_MAJOR
        from shaperd.core.protocol import ClassTarget

        self.watch.sample(reader)
        stats, targets, self._backlog = {}, {}, {}
        for r in self.watch.rows():
            pod = r.parent_key is not None
            if r.tenant == UNKNOWN_TENANT or (r.tenant == NONE_TENANT and not pod):
                continue
            key = (r.device, HANDLE_MAJOR << 16 | r.key)
            stats[key] = _Counters(r)
            # A capped pod ranks right after its tenant ("train" < "train pod 25001"), with no guarantee of
            # its own (what it sends lives in its tenant's) and its cap as limit.
            tenant = f"{r.tenant} pod {r.key}" if pod else r.tenant
            targets[key] = ClassTarget(tenant, r.device, key[1], 0 if pod else r.guarantee_bps, r.limit_bps)
            self._backlog[key] = r.backlog_ns
        return stats, targets

    def backlog(self, series) -> tuple[int | None, int | None]:
        """(backlog bytes, backlog ns) of a row: edt's is time (the departure clock ahead of now)."""
        return None, self._backlog.get((series.target.device, series.target.classid), 0)

    def errors(self) -> dict[str, str]:
        return dict(self.watch.errors)

    def close(self) -> None:
        self.watch.close()
