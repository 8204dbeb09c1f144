"""The apply benchmark's generated inputs: the issue's scenario, valid, in documentation ranges."""

from __future__ import annotations

import importlib.util
import ipaddress
from pathlib import Path

from shaperd.core.config import from_dict

_PATH = Path(__file__).resolve().parents[2] / "bench" / "apply_perf.py"
_spec = importlib.util.spec_from_file_location("apply_perf", _PATH)
apply_perf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(apply_perf)


def test_prefixes_are_distinct_and_in_documentation_ranges():
    pfx = [ipaddress.ip_network(p) for p in apply_perf.make_prefixes(500)]
    assert len(set(pfx)) == 500
    v4 = ipaddress.ip_network("198.18.0.0/15")
    v6 = ipaddress.ip_network("2001:db8::/32")
    assert all(p.subnet_of(v4) if p.version == 4 else p.subnet_of(v6) for p in pfx)
    lens = sorted({(p.version, p.prefixlen) for p in pfx})
    assert lens == [(4, 24), (4, 32), (6, 64)]


def test_config_is_the_issue_scenario_and_validates():
    doc = apply_perf.make_config_dict(64, 500)
    cfg = from_dict(doc)
    assert len(cfg.tenants) == 64
    assert sum(len(t.match.cidrs) for t in cfg.tenants) == 500
    assert cfg.node.interfaces == (apply_perf.DEVICE,)
    assert cfg.node.capacity_bps == 100 * 10**9
    assert len({t.priority for t in cfg.tenants}) > 7  # more than HTB's tenant levels
    assert any(t.limit_bps is None for t in cfg.tenants)
    assert any(t.limit_bps and t.limit_bps > 34_400_000_000 for t in cfg.tenants)  # 64-bit rate attributes


def test_summary():
    s = apply_perf.summary([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["spread"]) == (2.0, 1.0, 3.0, 2.0)
