"""``shaperd status`` / ``top`` on the edt data plane, from fake map reads (no root): report/edt_status.py.

Two readings with an injected clock give the measured rate; the rate in the map is shown through the
controller's conversion; labels come from the tenants file (key = class minor, default key "(none)");
an unreadable device is one line naming it, no rows, and status exits 1; top ranks edt rows with HTB rows.
"""

from __future__ import annotations

import errno
import json

import pytest
import structlog

from shaperd.cli import main as cli
from shaperd.core import config
from shaperd.core.protocol import ClassTarget
from shaperd.backends.edt import controller
from shaperd.backends.edt.objects import DEFAULT_KEY, PRIO_STAMPER, ROOT_HANDLE, Stats
from shaperd.core.ids import assign_minors
from shaperd.kernel import bpf_maps
from shaperd.kernel import bpf_pins
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.kernel.rtnl_rows import FilterRow, LinkRow, QdiscRow
from shaperd.backends.edt import status as edt_status
from shaperd.core.roots import Roots
from shaperd.report import top
from shaperd.report.sampler import Accumulator

M = 1_000_000
CFG_TEXT = """
node: {interfaces: [eth0, eth1], dataplane: edt, capacity: 1Gbps, reserve: 10Mbps}
tenants:
  - {name: train, bandwidthGuarantee: 300Mbps, priority: 100}
  - {name: batch, bandwidthGuarantee: 100Mbps, bandwidthLimit: 500Mbps}
"""
CFG = config.load_text(CFG_TEXT)
MINORS = assign_minors(["train", "batch"])
TRAIN, BATCH = MINORS["train"], MINORS["batch"]
STAMPER = "shpe_0123456789"


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()  # cli.main() pointed structlog at this test's captured stderr, closed after it


class Reader:
    """eth0 and eth1 with the edt root (mq 7365:) and clsact; eth0 and eth1 carry the stamper unless told."""

    def __init__(self, stamped=("eth0", "eth1"), edt=("eth0", "eth1")):
        self.names = {2: "eth0", 3: "eth1", 4: "eth2"}
        self.stamped, self.edt = stamped, edt

    def links(self):
        return [LinkRow(i, n, "veth", 1500, True, 4) for i, n in self.names.items()]

    def qdiscs(self, ifindex=0, device="node"):
        out = [QdiscRow(4, 0x73680000, 0xFFFFFFFF, "htb")]  # an HTB uplink: not edt's
        for i, n in self.names.items():
            if n in self.edt:
                out += [QdiscRow(i, ROOT_HANDLE, 0xFFFFFFFF, "mq"), QdiscRow(i, 0xFFFF0000, 0xFFFFFFF1, "clsact")]
        return out

    def filters(self, ifindex, parent, device):
        assert parent == 0xFFFFFFF3
        if device not in self.stamped:
            return [FilterRow(ifindex, parent, 0x100, 3, 1, "bpf", name="shcls_x", prog_id=7)]  # the classifier only
        return [FilterRow(ifindex, parent, 0x100, 3, 1, "bpf", name="shcls_x", prog_id=7),
                FilterRow(ifindex, parent, PRIO_STAMPER, 3, 1, "bpf", name=STAMPER, prog_id=40 + ifindex)]


class FakeMaps:
    """A stamper's maps as StamperMaps reads them; the test moves the counters between readings."""

    def __init__(self, stats=None, q16=None, clocks=None, parents=None):
        self.stats = dict(stats or {})
        self.q16 = dict(q16 or {})
        self.clocks = dict(clocks or {})
        self.parents = dict(parents or {})
        self.closed = False
        self.scans = 0

    def read_stats(self):
        return dict(self.stats)

    def read_parents(self):
        return {k: v for k, v in self.parents.items() if v}

    def read_set_rates(self):
        self.scans += 1
        return {k: v for k, v in self.q16.items() if v}

    def read_rates(self, keys):
        return {k: self.q16.get(k, 0) for k in keys}

    def read_clocks(self, keys):
        return {k: self.clocks.get(k, 0) for k in keys}

    def close(self):
        self.closed = True


class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def watch(maps_by_dev, labels=None, clock=None, now_ns=5_000_000_000):
    opened = []

    def open_maps(reader, dev, pins):
        opened.append(dev.device)
        m = maps_by_dev[dev.device]
        if isinstance(m, Exception):
            raise m
        return m

    w = edt_status.EdtWatch(labels or edt_status.Labels(CFG), open_maps=open_maps, clock=clock or Clock(),
                            mono_ns=lambda: now_ns)
    return w, opened


def by_key(rows, device="eth0"):
    return {r.key: r for r in rows if r.device == device}


def test_rows_from_two_readings_carry_the_map_rate_the_measured_rate_counters_backlog_and_borrowing():
    q_train, q_batch = controller.ns_per_byte_q16(450 * M), controller.ns_per_byte_q16(100 * M)
    eth0 = FakeMaps({TRAIN: Stats(1_000, 10, 0), BATCH: Stats(0, 0, 0)},
                    {TRAIN: q_train, BATCH: q_batch, DEFAULT_KEY: controller.ns_per_byte_q16(10 * M)},
                    {TRAIN: 5_003_000_000, BATCH: 4_000_000_000})
    clock = Clock(100.0)
    w, _ = watch({"eth0": eth0, "eth1": FakeMaps()}, clock=clock)
    w.sample(Reader())
    first = by_key(w.rows())
    assert first[TRAIN].rate_bps is None and first[TRAIN].bytes == 1_000  # one reading: no rate yet
    # 0.5 s later: train sent 25 MB (400 Mbit/s, above its 300 Mbit/s guarantee), batch 2.5 MB (40 Mbit/s).
    eth0.stats = {TRAIN: Stats(25_001_000, 20_010, 3), BATCH: Stats(2_500_000, 2_000, 0)}
    clock.t = 100.5
    w.sample(Reader())
    rows = by_key(w.rows())
    train, batch, none = rows[TRAIN], rows[BATCH], rows[DEFAULT_KEY]
    assert (train.tenant, batch.tenant, none.tenant) == ("train", "batch", "(none)")
    assert train.classid == f"7368:{TRAIN:x}" and train.key == TRAIN
    assert train.rate_bps == pytest.approx(400 * M) and batch.rate_bps == pytest.approx(40 * M)
    assert none.rate_bps == 0  # counted nothing: zero is read, not assumed (the key had a rate set)
    assert train.map_rate_bps == controller.rate_bps_of_q16(q_train) and abs(train.map_rate_bps - 450 * M) < 1000
    assert batch.map_rate_bps == 100 * M and train.map_ns_per_byte_q16 == q_train
    assert (train.bytes, train.packets, train.drops) == (25_001_000, 20_010, 3)
    assert train.backlog_ns == 3_000_000 and batch.backlog_ns == 0  # clock behind now: no backlog
    assert train.borrowing and not batch.borrowing
    # Shares as the edt planner gives them to the controller: capacity 1 Gbit, reserve for the default key.
    assert (train.guarantee_bps, train.limit_bps) == (300 * M, 1000 * M)
    assert (batch.guarantee_bps, batch.limit_bps) == (100 * M, 500 * M)
    assert (none.guarantee_bps, none.limit_bps) == (10 * M, 1000 * M)
    assert sorted(rows) == sorted([TRAIN, BATCH, DEFAULT_KEY])
    # eth1: the stamper has set nothing and seen nothing: the file's tenants with an unset rate.
    eth1 = by_key(w.rows(), "eth1")
    assert {r.tenant for r in eth1.values()} == {"train", "batch", "(none)"}
    assert all(r.map_rate_bps is None and r.bytes == 0 for r in eth1.values())
    text = edt_status.render(w.rows(), w.errors)
    assert text.startswith("EDT data plane (departure-time pacing):")
    line = next(l for l in text.splitlines() if l.startswith("eth0") and " train " in l)
    assert "300Mbps" in line and "400Mbps" in line and "3.0ms" in line and line.rstrip().endswith("yes")
    assert "unset" in text
    assert eth0.scans == 0  # with a tenants file: lookups of its keys and the counted ones, not a 64 Ki scan


def test_without_a_tenants_file_rows_show_keys_and_nothing_is_invented():
    stray = 0x2A
    maps = FakeMaps({stray: Stats(5_000, 5, 0)}, {stray: controller.ns_per_byte_q16(8 * M)})
    w, _ = watch({"eth0": maps, "eth1": FakeMaps()}, labels=edt_status.Labels(None))
    w.sample(Reader(stamped=("eth0",), edt=("eth0",)))
    rows = by_key(w.rows())
    assert sorted(rows) == sorted([stray, DEFAULT_KEY])
    assert rows[stray].tenant == "?" and rows[DEFAULT_KEY].tenant == "(none)"
    assert rows[stray].guarantee_bps is None and rows[stray].limit_bps is None and not rows[stray].borrowing
    assert rows[stray].map_rate_bps == 8 * M and rows[DEFAULT_KEY].map_rate_bps is None
    assert maps.scans == 1  # no tenants file: the whole rates array, so a key with a rate but no traffic shows
    line = next(l for l in edt_status.render(w.rows(), {}).splitlines() if l.startswith("eth0") and " 42 " in l)
    assert line.split()[3:6] == ["-", "-", "8Mbps"]  # guarantee, limit unknown; the map's rate


def test_an_unreadable_device_is_one_line_naming_it_with_no_rows_and_the_other_still_shows():
    cause = bpf_maps.BpfMapError("open BPF program id 43: Operation not permitted; no bpffs pins at /x/eth1, and "
                                 "reading the maps by program id needs CAP_SYS_ADMIN", errno.EPERM)
    w, opened = watch({"eth0": FakeMaps({TRAIN: Stats(1, 1, 0)}), "eth1": cause})
    w.sample(Reader())
    assert {r.device for r in w.rows()} == {"eth0"}  # nothing for eth1: no fake zeros
    assert list(w.errors) == ["eth1"] and w.errors["eth1"].startswith("read edt stamper maps on eth1: ")
    assert "CAP_SYS_ADMIN" in w.errors["eth1"]
    text = edt_status.render(w.rows(), w.errors)
    assert "  eth1: read edt stamper maps on eth1: open BPF program id 43" in text
    doc = w.doc()
    assert {r["device"] for r in doc["edt"]} == {"eth0"} and doc["edt_errors"] == [
        {"device": "eth1", "error": w.errors["eth1"]}]
    # Retried at the next reading (opened again), while eth0's maps stay open.
    w.sample(Reader())
    assert opened == ["eth0", "eth1", "eth1"]


def test_an_edt_root_without_the_stamper_is_reported_not_shown_as_idle():
    w, opened = watch({"eth0": FakeMaps()})
    w.sample(Reader(stamped=(), edt=("eth0",)))
    assert w.rows() == [] and opened == []
    assert "no shaperd stamper attached on clsact egress" in w.errors["eth0"]


def test_a_device_whose_filters_cannot_be_dumped_is_reported_and_the_others_still_show():
    from shaperd.core.errors import KernelError

    reader = Reader()
    dump = reader.filters

    def filters(ifindex, parent, device):
        if device == "eth1":
            raise KernelError("dump", "filters", "eth1", "No such device", errno.ENODEV)
        return dump(ifindex, parent, device)

    reader.filters = filters
    w, _ = watch({"eth0": FakeMaps({TRAIN: Stats(1, 1, 0)})})
    w.sample(reader)
    assert {r.device for r in w.rows()} == {"eth0"}
    assert "No such device" in w.errors["eth1"] and w.errors["eth1"].startswith("read edt stamper maps on eth1")


def test_a_replaced_stamper_reopens_its_maps_and_gives_no_rate_across_the_reset():
    old, new = FakeMaps({TRAIN: Stats(9_000_000, 9, 0)}), FakeMaps({TRAIN: Stats(1_000, 1, 0)})
    maps = {"eth0": old}
    clock = Clock()
    w, opened = watch(maps, clock=clock)
    reader = Reader(edt=("eth0",))
    w.sample(reader)
    maps["eth0"] = new
    reader.filters = lambda i, p, d: [FilterRow(i, p, PRIO_STAMPER, 3, 1, "bpf", name="shpe_ffffffffff", prog_id=99)]
    clock.t += 1
    w.sample(reader)
    assert old.closed and opened == ["eth0", "eth0"]
    assert by_key(w.rows())[TRAIN].rate_bps is None and by_key(w.rows())[TRAIN].bytes == 1_000
    w.close()
    assert new.closed


def test_the_json_rows_have_stable_keys_with_units_in_their_names():
    w, _ = watch({"eth0": FakeMaps({TRAIN: Stats(1, 1, 0)}), "eth1": FakeMaps()})
    w.sample(Reader())
    doc = w.doc()
    assert list(doc) == ["edt", "edt_errors"]
    keys = {tuple(r) for r in doc["edt"]}
    assert keys == {("device", "tenant", "key", "classid", "guarantee_bps", "limit_bps", "map_rate_bps",
                     "map_ns_per_byte_q16", "rate_bps", "bytes", "packets", "drops", "backlog_ns", "borrowing",
                     "parent_key")}
    json.dumps(doc)
    none, _ = watch({})
    none.sample(Reader(edt=()))
    assert none.doc() == {}  # no edt root on this node: no key at all (status's doc keeps its shape)


def test_maps_open_through_the_devices_pins_when_it_has_an_entry_else_by_id(tmp_path, monkeypatch):
    calls = []

    def fake_open(reader, ifindex, device, name, pins=None):
        calls.append((device, name, pins))
        if pins is None:
            raise bpf_maps.BpfMapError("open BPF program id 42: Operation not permitted (needs CAP_BPF or root)",
                                       errno.EPERM)
        return "maps"

    monkeypatch.setattr(edt_prog, "open_for_device", fake_open)
    pins = edt_status.pins_for(str(tmp_path), None)
    assert pins.base == tmp_path / "shaperd" / "host" / "edt-stamper"
    assert edt_status.pins_for("", None) is None
    (pins.base / "eth0").mkdir(parents=True)  # an entry, as the edt backend pins it when it loads the stamper
    dev0 = edt_status.EdtDevice("eth0", 2, STAMPER)
    dev1 = edt_status.EdtDevice("eth1", 3, STAMPER)
    assert edt_status.open_stamper_maps(None, dev0, pins) == "maps" and calls == [("eth0", STAMPER, pins)]
    with pytest.raises(bpf_maps.BpfMapError) as e:
        edt_status.open_stamper_maps(None, dev1, pins)
    assert calls[-1] == ("eth1", STAMPER, None)
    assert f"no bpffs pins at {pins.path('eth1')}" in str(e.value) and "needs CAP_SYS_ADMIN" in str(e.value)
    assert e.value.errno == errno.EPERM


def test_a_pin_of_another_program_is_not_bypassed_by_id(tmp_path, monkeypatch):
    def fake_open(reader, ifindex, device, name, pins=None):
        assert pins is not None, "a device with pins is read through them only"
        raise bpf_pins.PinError(f"adopt edt stamper maps on {device}: pinned program id 5 is not the attached id 6",
                                errno.ESTALE)

    monkeypatch.setattr(edt_prog, "open_for_device", fake_open)
    pins = edt_status.pins_for(str(tmp_path), None)
    (pins.base / "eth0").mkdir(parents=True)
    w = edt_status.EdtWatch(edt_status.Labels(CFG), pins=pins)
    w.sample(Reader(edt=("eth0",)))
    assert w.rows() == [] and "pinned program id 5 is not the attached id 6" in w.errors["eth0"]


def _status(monkeypatch, tmp_path, maps_by_dev):
    """cli status with the kernel faked: no HTB class, no RDMA, no NIC sections; the edt maps injected."""
    from shaperd.kernel import rtnl
    from shaperd.backends.htb import classifier_status
    from shaperd.backends.dcb import status as dcb_status
    from shaperd.backends.devlink import status as devlink_status
    from shaperd.backends.htb import status as htb_status
    from shaperd.backends.vfrate import status as vf_status

    monkeypatch.setattr(rtnl, "RtnlReader", lambda netns=None, **kw: Reader())
    monkeypatch.setattr(htb_status, "sample", lambda reader: {})
    monkeypatch.setattr(classifier_status, "collect", lambda reader: {})
    for nic in (vf_status, devlink_status, dcb_status):  # no NIC section: their kernel sides are not faked here
        monkeypatch.setattr(nic, "sections", lambda inp: [])
    from shaperd.cli import status as cli_status

    monkeypatch.setattr(cli_status, "_status_degraded", lambda args: None)  # no plan and diff of the host's kernel

    def open_maps(reader, dev, pins):
        m = maps_by_dev[dev.device]
        if isinstance(m, Exception):
            raise m
        return m

    monkeypatch.setattr(edt_status, "open_stamper_maps", open_maps)
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG_TEXT)
    return ["status", "--config", str(cfg), "--sysfs-root", str(tmp_path), "--interval", "0", "--bpffs-root", ""]


def test_status_json_has_the_edt_list_beside_the_classes_and_exits_1_when_a_device_is_unreadable(
        monkeypatch, tmp_path, capsys):
    argv = _status(monkeypatch, tmp_path, {"eth0": FakeMaps({TRAIN: Stats(7, 1, 0)}), "eth1": FakeMaps()})
    assert cli.main(argv + ["-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[:4] == ["window_s", "classes", "edt", "edt_errors"] and doc["edt_errors"] == []
    assert {(r["device"], r["tenant"]) for r in doc["edt"]} >= {("eth0", "train"), ("eth1", "(none)")}
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert text.index("(no device on the HTB data plane)") < text.index("EDT data plane (departure-time pacing)")
    broken = bpf_maps.BpfMapError("no bpffs root given, and reading the maps by program id needs CAP_SYS_ADMIN")
    argv = _status(monkeypatch, tmp_path, {"eth0": FakeMaps({TRAIN: Stats(7, 1, 0)}), "eth1": broken})
    assert cli.main(argv + ["-o", "json"]) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert {r["device"] for r in doc["edt"]} == {"eth0"} and [e["device"] for e in doc["edt_errors"]] == ["eth1"]
    assert "shaperd: read edt stamper maps on eth1: no bpffs root given" in out.err and "Traceback" not in out.err
    assert cli.main(argv) == 1
    assert "eth1: read edt stamper maps on eth1: no bpffs root given" in capsys.readouterr().out


def _series(acc, tenant, device, classid, g, lim, t0_bytes, t1_bytes, qlen=0):
    from types import SimpleNamespace as NS

    tgt = ClassTarget(tenant, device, classid, g, lim)
    for t, b in ((0.0, t0_bytes), (1.0, t1_bytes)):
        acc.ingest(t, {(device, classid): NS(bytes=b, packets=1, drops=0, overlimits=0, backlog_bytes=100 * qlen,
                                             qlen=qlen, rate_Bps=g // 8, ceil_Bps=lim // 8)}, {(device, classid): tgt})


def test_top_ranks_edt_rows_with_htb_rows_and_says_which_plane_each_is_on():
    from shaperd.core.protocol import StatusInput

    htb = Accumulator()
    _series(htb, "batch", "eth2", 0x73680000 | BATCH, 100 * M, 500 * M, 0, 12_500_000)
    edt_acc = Accumulator()
    maps = FakeMaps({TRAIN: Stats(0, 0, 0), BATCH: Stats(0, 0, 0)}, {}, {TRAIN: 5_002_000_000})
    w, _ = watch({"eth0": maps}, clock=Clock(0.0))
    plane = edt_status.TopPlane(StatusInput(config=None, config_path=None, roots=Roots.of()))
    plane.watch.close()
    plane.watch = w  # edt's top plane on the faked maps
    reader = Reader(edt=("eth0",))
    edt_acc.ingest(0.0, *plane.sample(reader))
    maps.stats = {TRAIN: Stats(50_000_000, 40_000, 2), BATCH: Stats(1_250_000, 1_000, 0)}
    w.clock.t = 1.0
    edt_acc.ingest(1.0, *plane.sample(reader))
    assert {s.target.tenant for s in edt_acc.view()} == {"train", "batch"}  # "(none)" is left out, as HTB's default
    views = [top.PlaneView("htb", htb.view()), top.PlaneView("edt", edt_acc.view(), plane.backlog)]
    ranked = [(s.target.tenant, v.name, s.target.device) for v, s in top.ranked(views)]
    assert ranked == [("batch", "edt", "eth0"), ("batch", "htb", "eth2"), ("train", "edt", "eth0")]
    text = top.render(views, {}, 2.0)
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["TENANT", "PLANE", "DEVICE"]
    train = next(l for l in lines if l.startswith("train"))
    assert train.split()[1:4] == ["edt", "eth0", f"7368:{TRAIN:x}"] and "400Mbps" in train and "2.0ms" in train
    doc = top.view_doc(views, {}, 2.0)
    assert [(r["tenant"], r["plane"]) for r in doc["tenants"]] == [("batch", "edt"), ("batch", "htb"), ("train", "edt")]
    assert len({tuple(r) for r in doc["tenants"]}) == 1  # the same keys on both planes
    t = doc["tenants"][2]
    assert t["rate_bps"] == pytest.approx(400 * M) and t["backlog_ns"] == 2_000_000 and t["backlog_bytes"] is None
    assert t["borrowed_bytes_since_start"] == pytest.approx(50_000_000 - 300 * M / 8)
    assert doc["tenants"][1]["backlog_ns"] is None and doc["tenants"][1]["backlog_bytes"] == 0


def test_now_is_read_right_after_the_clocks_so_slow_reads_before_them_do_not_inflate_the_backlog():
    order = []

    class Slow(FakeMaps):
        def read_stats(self):
            order.append("stats")
            return super().read_stats()

        def read_clocks(self, keys):
            order.append("clocks")
            return super().read_clocks(keys)

    def now():
        order.append("now")
        return 1_000_000_000

    reading = edt_status.read_maps(Slow({TRAIN: Stats(1, 1, 0)}, {}, {TRAIN: 1_000_500_000}), {TRAIN}, 1.0, now,
                                   STAMPER)
    assert order == ["stats", "clocks", "now"]
    (row,) = [r for r in edt_status.rows_of(edt_status.EdtDevice("eth0", 2, STAMPER), None, reading,
                                            edt_status.Labels(CFG)) if r.key == TRAIN]
    assert row.backlog_ns == 500_000


def test_a_capped_pods_key_is_a_row_under_its_tenant_with_its_cap_and_what_it_sent():
    pod, lone = 0x6000, 0x6001  # lone: a capped pod of no tenant, under the default key
    cap = controller.ns_per_byte_q16(100 * M)
    eth0 = FakeMaps({TRAIN: Stats(0, 0, 0), pod: Stats(0, 0, 0)},
                    {TRAIN: controller.ns_per_byte_q16(450 * M), pod: cap, lone: controller.ns_per_byte_q16(5 * M)},
                    {pod: 5_002_000_000}, parents={pod: TRAIN, lone: DEFAULT_KEY})
    clock = Clock(100.0)
    w, _ = watch({"eth0": eth0, "eth1": FakeMaps()}, clock=clock)
    w.sample(Reader())
    # 0.5 s: the pod sent 5 MB (80 Mbit/s), counted under its own key and under train's.
    eth0.stats = {TRAIN: Stats(6_000_000, 6_000, 0), pod: Stats(5_000_000, 5_000, 1)}
    clock.t = 100.5
    w.sample(Reader())
    rows = [r for r in w.rows() if r.device == "eth0"]
    order = [(r.tenant, r.key, r.parent_key) for r in rows]
    i = order.index(("train", TRAIN, None))
    assert order[i + 1] == ("train", pod, TRAIN)  # right after its tenant
    j = order.index(("(none)", DEFAULT_KEY, None))
    assert order[j + 1] == ("(none)", lone, DEFAULT_KEY)
    p = rows[i + 1]
    assert p.guarantee_bps is None and p.limit_bps == p.map_rate_bps == 100 * M and not p.borrowing
    assert p.rate_bps == pytest.approx(80 * M) and (p.bytes, p.drops, p.backlog_ns) == (5_000_000, 1, 2_000_000)
    assert p.classid == f"7368:{pod:x}"
    text = edt_status.render(w.rows(), w.errors).splitlines()
    k = next(n for n, l in enumerate(text) if l.startswith("eth0") and " train " in l)
    assert text[k + 1].split()[:5] == ["eth0", "└", "pod", str(pod), "-"] and "100Mbps" in text[k + 1]
    assert text[k + 1].rstrip().endswith("-")  # no borrowing of its own
    doc = w.doc()
    assert {(r["key"], r["parent_key"]) for r in doc["edt"] if r["device"] == "eth0" and r["parent_key"]} == {
        (pod, TRAIN), (lone, DEFAULT_KEY)}
    # top: the pod ranks right after its tenant, with its cap as limit and no guarantee.
    plane = edt_status.TopPlane.__new__(edt_status.TopPlane)
    plane.watch, plane._backlog = w, {}
    w.prev = {}
    stats, targets = plane.sample(type("R", (), {"qdiscs": Reader().qdiscs, "links": Reader().links,
                                                  "filters": Reader().filters})())
    tenants = {t.tenant: t for t in targets.values() if t.device == "eth0"}
    assert tenants[f"train pod {pod}"].guarantee_bps == 0 and tenants[f"train pod {pod}"].limit_bps == 100 * M
    assert f"(none) pod {lone}" in tenants and "(none)" not in tenants
    assert sorted(tenants)[:2] == ["(none) pod 24577", "batch"] and sorted(tenants).index(f"train pod {pod}") == \
        sorted(tenants).index("train") + 1
