"""VF rates in /metrics (configured and read back, no fake zeros) and in ``shaperd rdma vf-rates``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from shaperd.core import config
from shaperd.backends.vfrate.cli import rows
from shaperd.backends.vfrate import metrics as vfrate_metrics
from shaperd.report.metrics import Metrics

from .test_vfrate_backend import CFG, rig  # noqa: F401 - the fixture


def samples(m: Metrics, name: str) -> dict[tuple, float]:
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    if name not in fams:
        return {}
    return {tuple(sorted(s.labels.items())): s.value for s in fams[name].samples}


def key(**kw):
    return tuple(sorted(kw.items()))


def test_configured_and_observed_vf_rates_per_tenant_and_the_min_support_gauge(rig):  # noqa: F811
    nic, backend, rec = rig("i40e")
    m = Metrics(None)
    vfrate_metrics.install(m, [backend])
    assert samples(m, "shaperd_tenant_vf_configured_rate_bytes_per_second") == {}  # nothing planned yet: no series
    rec.apply(config.load_text(CFG))
    rec.apply(config.load_text(CFG))  # the second reconcile plans the degrade and reads the result back
    conf = samples(m, "shaperd_tenant_vf_configured_rate_bytes_per_second")
    seen = samples(m, "shaperd_tenant_vf_observed_rate_bytes_per_second")
    k0 = dict(tenant="tenant-a", pf="ens1f0", vf="0")
    assert conf[key(**k0, bound="min")] == 0 and conf[key(**k0, bound="max")] == 12500e6 / 8
    assert seen[key(**k0, bound="max")] == 12500e6 / 8 and seen[key(**k0, bound="min")] == 0
    assert samples(m, "shaperd_vf_min_rate_supported") == {key(pf="ens1f0", driver="mlx5_core"): 0}


def test_no_cap_has_no_max_series_and_an_unreported_pf_no_observed_series(rig):  # noqa: F811
    nic, backend, rec = rig("veth")
    m = Metrics(None)
    vfrate_metrics.install(m, [backend])
    rec.apply(config.load_text(CFG.replace("bandwidthLimit: 25Gbps", "")))
    conf = samples(m, "shaperd_tenant_vf_configured_rate_bytes_per_second")
    assert sorted(dict(k)["bound"] for k in conf) == ["min", "min"]
    assert samples(m, "shaperd_tenant_vf_observed_rate_bytes_per_second") == {}


def test_the_vf_rates_table_says_wanted_reported_and_state(rig):  # noqa: F811
    nic, backend, rec = rig("i40e")
    nic.rates[0] = (0, 12500)
    rep = rec.diff(config.load_text(CFG))
    got = {r["vf"]: (r["min_mbps"], r["max_mbps"], r["reported_min_mbps"], r["reported_max_mbps"], r["state"],
                     r["note"]) for r in rows(backend, rep)}
    assert got[0][:5] == (5000, 12500, 0, 12500, "out of sync") and "minimum not applied" in got[0][5]
    assert got[1] == (5000, 12500, 0, 0, "out of sync", "minimum not applied (drivers such as i40e, ixgbe, ice "
                      "with DCB refuse one)")
    assert nic.writes == []  # diff writes nothing


def test_the_agents_recorded_refusal_is_shown_by_the_read_only_table(rig, tmp_path):  # noqa: F811
    from shaperd.backends.vfrate.backend import VfRateBackend, read_refusals
    from shaperd.engine.reconciler import Reconciler
    from shaperd.core.inventory import Capabilities

    record = tmp_path / "rec" / "vfrate-owned.json"
    nic, backend, rec = rig("i40e", state_file=record)
    cfg = config.load_text(CFG)
    rec.apply(cfg)
    refusals = read_refusals(record)
    assert refusals == {("0000:3b:00.0", "mlx5_core"): {"min": "Invalid argument"}}
    cli = VfRateBackend(writer=None, kernel=nic)
    cli.adopt_refusals(cfg, refusals)
    rep = Reconciler(rec.reader, [cli], Capabilities(), roots=rec.roots).diff(cfg)
    table = rows(cli, rep, refusals)
    assert [(r["min_mbps"], r["reported_min_mbps"], r["state"], r["min_rate_supported"], r["reason"], r["note"])
            for r in table] == [(0, 0, "in sync", False, "Invalid argument", None)] * 2
    before = record.read_text()
    rec.apply(cfg)
    assert record.read_text() == before  # an in-sync reconcile writes no record either
    a = VfRateBackend(writer=None, kernel=nic, state_file=record)
    assert a.refused_min == {} and a.ours  # a restarted agent keeps what it set, and tries the minimum again
