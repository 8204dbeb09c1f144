"""bench/class_sampler.py: the summary of a recorded sample file gives, per bed and class, the counters'
deltas over that bed's samples (counters restart with each bed), the largest backlog and the lowest tokens."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "class_sampler", Path(__file__).resolve().parents[2] / "bench" / "class_sampler.py")
sampler = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sampler)


def _row(ns, t, nbytes, drops, backlog, tokens):
    return {"ns": ns, "t": t, "qdiscs": [], "classes": [
        {"handle": "7368:10", "bytes": nbytes, "drops": drops, "overlimits": 0, "backlog": backlog, "qlen": 1,
         "tokens": tokens, "ctokens": tokens}]}


def test_summary_is_per_bed_deltas_max_backlog_and_min_tokens(tmp_path, capsys):
    rows = [_row("shb-a-node", 0.0, 1000, 0, 10, 500), _row("shb-a-node", 1.0, 5000, 2, 4000, -300),
            _row("shb-b-node", 5.0, 10, 0, 0, 100), _row("shb-b-node", 6.0, 70, 1, 64, 50),
            {"ns": "shb-c-node", "t": 7.0, "classes": [], "qdiscs": []}]
    out = tmp_path / "s.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sampler.summary(str(out))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| shb-")]
    assert lines == ["| shb-a-node (2 samples, 1 s) | 7368:10 | 4,000 | 2 | 0 | 4,000 | 1 | -300 | -300 |",
                     "| shb-b-node (2 samples, 1 s) | 7368:10 | 60 | 1 | 0 | 64 | 1 | 50 | 50 |"]


def test_handles_print_as_tc_does():
    assert sampler._handle(0x73680001) == "7368:1" and sampler._handle(0x7368A2B0) == "7368:a2b0"


def test_per_scenario_cuts_samples_at_each_scenario_and_restarts_with_each_tree(tmp_path, capsys):
    a = "7368:9dc9"  # tenant-a's class minor (shaperd.core.ids.assign_minors)

    def row(t, nbytes, backlog, drops=0):
        return {"ns": "shb-x-node", "t": t, "qdiscs": [], "classes": [
            {"handle": a, "bytes": nbytes, "drops": drops, "overlimits": 0, "backlog": backlog, "qlen": 0,
             "tokens": 0, "ctokens": 0}]}

    # scenario 1 (t 10..12): 1 Gbit/s for 2 s, one sample with a backlog. Between the two a new tree
    # (counters restart); scenario 2 (t 20..22.5): 0.5 Gbit/s for 2 s, 4 drops, never a backlog.
    rows = [row(10.0, 0, 0), row(11.0, 125_000_000, 4000), row(12.0, 250_000_000, 0),
            row(20.0, 400_000_000, 0), row(20.5, 0, 0), row(21.5, 62_500_000, 0, 1), row(22.5, 125_000_000, 0, 4)]
    out = tmp_path / "s.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"1e10": [[
        {"scenario": "together", "mode": "shaperd", "started_monotonic": 10.0, "elapsed_s": 2.0,
         "tenants": {"a": {"limit_bps": 800e6}}},  # 1 Gbit/s through it: 25 % over its limit
        {"scenario": "pressure", "mode": "shaperd", "started_monotonic": 20.0, "elapsed_s": 2.5},
        {"scenario": "old", "mode": "shaperd", "elapsed_s": 1.0}]]}))  # no start recorded: left out
    sampler.per_scenario(str(res), str(out))
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.startswith("| 1 ")]
    assert lines == ["| 1 | together | shaperd | tenant-a | 1,000 | 1,000 | 25.0 | 0 | 0 | 4,000 | 1,333 | 1/3 |",
                     "| 1 | pressure | shaperd | tenant-a | 500 | 500 | - | 4 | 0 | 0 | 0 | 0/3 |"]
    assert "as the class counted it: 25.0 % (round 1, together, tenant-a)" in text
