"""The edt rate loop on fake maps with an injected clock: it steps, writes only changed rates, survives a failure."""

from shaperd.core import config
from shaperd.backends.edt import plan as edt_plan
from shaperd.backends.edt.controller import ns_per_byte_q16
from shaperd.backends.edt.objects import DEFAULT_KEY, Stats
from shaperd.backends.edt.loop import EdtLoop
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.core.tenancy import tenancy

G = 1_000_000_000


class FakeMaps:
    def __init__(self):
        self.bytes: dict[int, int] = {}
        self.clocks: dict[int, int] = {}
        self.rates: dict[int, int] = {}
        self.calls = 0
        self.closed = False
        self.fail = False

    def read_stats(self):
        if self.fail:
            raise OSError("map gone")
        return {k: Stats(b, 0, 0) for k, b in self.bytes.items()}

    def read_clocks(self, keys):
        return {k: self.clocks.get(k, 0) for k in keys}

    def write_rates(self, q16):
        self.rates.update(q16)
        self.calls += 1
        return 1

    def close(self):
        self.closed = True


def device_plan():
    c = config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt", "capacity": "10Gbps"},
                          "tenants": [{"name": "a", "bandwidthGuarantee": "6Gbps", "priority": 100},
                                      {"name": "b", "bandwidthGuarantee": "2Gbps", "priority": 50}]})
    inv = Inventory(links=(Link("eth0", 2, tx_queues=2),), capabilities=Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True))
    (dp,) = edt_plan.plan(c, inv, tenancy(c, inv)).devices
    return dp


def test_steps_write_changed_rates_only_and_follow_demand():
    dp = device_plan()
    a, b = dp.tenant_keys["a"], dp.tenant_keys["b"]
    now = [0.0]
    made = []

    def open_maps(_dp):
        made.append(FakeMaps())
        return made[-1]

    loop = EdtLoop(open_maps, clock=lambda: now[0])
    loop.set_targets([dp])
    loop.sample_once()
    maps = made[0]
    assert set(maps.rates) == {DEFAULT_KEY, a, b} and maps.calls == 1
    # b alone sends at its full rate for 20 steps of 20 ms: it borrows the spare, a keeps its guarantee open.
    for _ in range(20):
        now[0] += 0.02
        maps.bytes[b] = maps.bytes.get(b, 0) + loop.rates("eth0")[b] * 0.02 / 8
        loop.sample_once()
    r = loop.rates("eth0")
    assert r[a] >= 6 * G and r[b] >= 10 * G * 0.98 - 6 * G - r[DEFAULT_KEY]
    assert maps.rates[b] == ns_per_byte_q16(r[b])
    # In sync: a step with the same measured rates writes nothing.
    calls = maps.calls
    now[0] += 0.02
    maps.bytes[b] += r[b] * 0.02 / 8
    loop.sample_once()
    assert loop.rates("eth0") == r and maps.calls == calls


def test_a_failing_device_is_reported_and_reopened():
    dp = device_plan()
    made = []

    def open_maps(_dp):
        made.append(FakeMaps())
        return made[-1]

    loop = EdtLoop(open_maps, clock=lambda: 1.0)
    loop.set_targets([dp])
    loop.sample_once()
    made[0].fail = True
    loop.sample_once()
    assert "map gone" in loop.errors["eth0"] and made[0].closed
    loop.sample_once()
    assert len(made) == 2 and "eth0" not in loop.errors


def test_metrics_show_each_tenants_rate_and_measurement_and_a_failing_device():
    from prometheus_client import CollectorRegistry, generate_latest

    from shaperd.backends.edt.metrics import EdtCollector

    dp = device_plan()
    maps = FakeMaps()
    loop = EdtLoop(lambda _dp: maps, clock=lambda: 1.0)
    reg = CollectorRegistry()
    holder = {"loop": None}
    reg.register(EdtCollector(lambda: holder["loop"]))
    assert b"shaperd_tenant_edt_rate_bytes_per_second{" not in generate_latest(reg)  # no loop: no series
    holder["loop"] = loop
    loop.set_targets([dp])
    loop.sample_once()
    text = generate_latest(reg).decode()
    assert 'shaperd_tenant_edt_rate_bytes_per_second{device="eth0",tenant="a"}' in text
    assert 'shaperd_tenant_edt_rate_bytes_per_second{device="eth0",tenant="(none)"}' in text
    assert 'shaperd_edt_device_controlled{device="eth0"} 1.0' in text
    maps.fail = True
    loop.sample_once()
    assert 'shaperd_edt_device_controlled{device="eth0"} 0.0' in generate_latest(reg).decode()


def pod_device_plan(cap="1G", uid="p1"):
    from shaperd.core.inventory import Pod

    c = config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt", "capacity": "10Gbps"},
                          "tenants": [{"name": "a", "bandwidthGuarantee": "6Gbps", "priority": 100,
                                       "match": {"namespaces": ["a"]}},
                                      {"name": "b", "bandwidthGuarantee": "2Gbps", "priority": 50}]})
    pods = (Pod(uid, "a", "capped", ips=("198.18.3.1",), egress_bandwidth=cap),) if cap else ()
    inv = Inventory(links=(Link("eth0", 2, tx_queues=2),), pods=pods,
                    capabilities=Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True))
    (dp,) = edt_plan.plan(c, inv, tenancy(c, inv)).devices
    return dp


def test_a_capped_pods_key_is_measured_never_written_and_pod_changes_keep_the_controllers_state():
    dp = pod_device_plan()
    (pod,) = dp.pods
    a = dp.tenant_keys["a"]
    now = [0.0]
    made = []
    loop = EdtLoop(lambda _dp: made.append(FakeMaps()) or made[-1], clock=lambda: now[0])
    loop.set_targets([dp])
    loop.sample_once()
    maps = made[0]
    # The stamper counts a pod packet under its key and its parent's: the pod sends 1 Gbit/s for 300 ms.
    for _ in range(15):
        now[0] += 0.02
        for k in (pod.key, a):
            maps.bytes[k] = maps.bytes.get(k, 0) + 1e9 * 0.02 / 8
        loop.sample_once()
    assert pod.key not in maps.rates and set(maps.rates) == {DEFAULT_KEY, a, dp.tenant_keys["b"]}
    (row,) = loop.pod_snapshot()
    assert row[:5] == ("eth0", "a/capped", "a", pod.key, 10**9) and abs(row[5] - 1e9) < 1e6
    # The tenant's measurement includes the pod's bytes (what the controller sees for a).
    assert abs(loop._state["eth0"].measured_bps[a] - 1e9) < 1e6
    # The cap changes (a new plan, same shares): the controller keeps its state and its maps.
    state = loop._state["eth0"]
    loop.set_targets([pod_device_plan("500M")])
    assert loop._state["eth0"] is state and not maps.closed
    assert loop.pod_snapshot()[0][4] == 500_000_000
    # The pod goes: no pod row; still the same controller state.
    loop.set_targets([pod_device_plan(None)])
    assert loop.pod_snapshot() == [] and loop._state["eth0"] is state
    # A changed share restarts it.
    import dataclasses

    fewer = dataclasses.replace(pod_device_plan(None), shares=pod_device_plan(None).shares[:2])
    loop.set_targets([fewer])
    assert "eth0" not in loop._state and maps.closed


def test_per_pod_metrics_exist_only_for_capped_pods_with_an_empty_tenant_for_a_pod_of_none():
    from prometheus_client import CollectorRegistry, generate_latest

    from shaperd.backends.edt.metrics import EdtCollector
    from shaperd.core.inventory import Pod

    c = config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt", "capacity": "10Gbps"},
                          "tenants": [{"name": "a", "bandwidthGuarantee": "6Gbps", "match": {"namespaces": ["a"]}}]})
    pods = (Pod("u1", "a", "capped", ips=("198.18.3.1",), egress_bandwidth="100M"),
            Pod("u2", "a", "free", ips=("198.18.3.2",)),
            Pod("u3", "other", "lone", ips=("198.18.3.3",), egress_bandwidth="20M"))
    inv = Inventory(links=(Link("eth0", 2, tx_queues=2),), pods=pods,
                    capabilities=Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True))
    (dp,) = edt_plan.plan(c, inv, tenancy(c, inv)).devices
    keys = {p.uid: p.key for p in dp.pods}
    maps, now = FakeMaps(), [1.0]
    loop = EdtLoop(lambda _dp: maps, clock=lambda: now[0])
    reg = CollectorRegistry()
    reg.register(EdtCollector(lambda: loop))
    loop.set_targets([dp])
    loop.sample_once()
    text = generate_latest(reg).decode()
    assert 'shaperd_pod_edt_rate_bytes_per_second{device="eth0",namespace="a",pod="capped",tenant="a"} 1.25e+07' in text
    assert 'shaperd_pod_edt_rate_bytes_per_second{device="eth0",namespace="other",pod="lone",tenant=""} 2.5e+06' in text
    assert 'pod="free"' not in text  # no cap, no series
    assert "shaperd_pod_edt_measured_bytes_per_second{" not in text  # no window yet: missing, never a fake 0
    now[0] += 0.2
    maps.bytes[keys["u1"]] = 1_000_000  # 1 MB in 200 ms: 5 MB/s
    loop.sample_once()
    text = generate_latest(reg).decode()
    assert 'shaperd_pod_edt_measured_bytes_per_second{device="eth0",namespace="a",pod="capped",tenant="a"} 5e+06' in text
    assert text.count("shaperd_pod_edt_measured_bytes_per_second{") == 2
