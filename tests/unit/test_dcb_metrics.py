"""The DCB collector: per-tenant TC, share and max rate, configured and read back; missing data is no series."""

from __future__ import annotations


from prometheus_client import CollectorRegistry

from shaperd.backends.dcb.backend import DcbBackend
from shaperd.backends.dcb.metrics import DcbCollector

from .test_dcb_plan import TWO, FakeDcb, _ctx, _reconcile, cfg_text, inventory


def _key(tenant: str, source: str) -> tuple:
    return (("netdev", "ens1f0"), ("source", source), ("tenant", tenant))


def _samples(b: DcbBackend) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DcbCollector(b.status))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in reg.collect() for s in m.samples}


def test_configured_and_read_back_series(tmp_path):
    inv = inventory(tmp_path)
    fake = FakeDcb(["ens1f0"])
    b = DcbBackend(client=fake)
    _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    s = _samples(b)
    a = (("netdev", "ens1f0"), ("tenant", "a"))
    assert s[("shaperd_tenant_dcb_traffic_class", a)] == 1
    assert s[("shaperd_tenant_dcb_share_ratio", _key("a", "configured"))] == 0.4
    assert s[("shaperd_tenant_dcb_share_ratio", _key("a", "read"))] == 0.4
    # configured 60.05 Gbit/s, the driver keeps 100 Mbit/s steps: read back 60 Gbit/s
    rate = "shaperd_tenant_dcb_maxrate_bytes_per_second"
    assert s[(rate, _key("a", "configured"))] == 60_050_000_000 / 8
    assert s[(rate, _key("a", "read"))] == 60_000_000_000 / 8
    # tenant b has no limit: no max-rate series at all (never a fake zero)
    assert not any(k[0] == rate and ("tenant", "b") in k[1] for k in s)
    assert s[("shaperd_dcb_netdev_readable", (("netdev", "ens1f0"),))] == 1


def test_a_write_that_did_not_stick_and_an_unreadable_netdev(tmp_path):
    inv = inventory(tmp_path)
    fake = FakeDcb(["ens1f0"], drops={"ets"})
    b = DcbBackend(client=fake)
    _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    s = _samples(b)
    assert s[("shaperd_dcb_write_not_sticking", (("kind", "ets"), ("netdev", "ens1f0")))] == 1
    # read back: the ETS the driver kept (all zero), not the plan
    assert s[("shaperd_tenant_dcb_share_ratio", _key("a", "read"))] == 0
    gone = DcbBackend(client=FakeDcb([]))
    _reconcile(gone, _ctx(inv, cfg_text(TWO)), inv)
    s = _samples(gone)
    assert s[("shaperd_dcb_netdev_readable", (("netdev", "ens1f0"),))] == 0
    assert not any(("source", "read") in k[1] for k in s)
    assert s[("shaperd_tenant_dcb_share_ratio", _key("a", "configured"))] == 0.4


def test_a_tenant_absent_from_the_node_has_no_dcb_series(tmp_path):
    from shaperd.report.presence import SeriesFilter

    inv = inventory(tmp_path)
    b = DcbBackend(client=FakeDcb(["ens1f0"]))
    _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    flt = SeriesFilter()
    flt.set_present(frozenset({"a"}))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DcbCollector(b.status, flt))
    tenants = {s.labels.get("tenant") for m in reg.collect() for s in m.samples} - {None}
    assert tenants == {"a"}
    assert {k[1] for k in _samples(b)} >= {(("netdev", "ens1f0"), ("tenant", "b"))}  # b has series unfiltered
