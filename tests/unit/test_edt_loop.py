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
