"""`shaperd demo` argument handling and prerequisite failures (no root needed)."""
import argparse

import pytest

from shaperd_bed import demo, shaping


def parse(*argv):
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    return p.parse_args(list(argv))


def test_defaults_are_short_and_complete():
    a = parse()
    assert a.duration == 3.0 and a.json is False
    assert a.scenarios.split(",") == ["alone", "together", "pressure", "udp", "converge", "latency"]
    assert a.modes.split(",") == ["none", "shaperd", "hand-tc"]


@pytest.mark.parametrize("text,mbit", [("1Gbps", 1000), ("950Mbps", 950), ("1000", 1000), ("500000Kbps", 500)])
def test_rates(text, mbit):
    assert demo._rate_mbit(text) == pytest.approx(mbit)


def test_missing_prerequisites_fail_clearly(monkeypatch, capsys):
    monkeypatch.setattr(shaping, "prerequisites", lambda: ["'iperf3' not found: install it (apt-get install -y iperf3)"])
    assert demo.run(parse()) == demo.EXIT_PREREQ
    err = capsys.readouterr().err
    assert "iperf3" in err and "apt-get install" in err


def test_bad_selection_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(shaping, "prerequisites", lambda: [])
    assert demo.run(parse("--scenarios", "alone,bogus")) == 2
    assert "bogus" in capsys.readouterr().err


def test_prerequisites_name_root_and_tools(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("shutil.which", lambda prog: None)
    problems = shaping.prerequisites()
    assert any("root" in p for p in problems)
    assert any("iperf3" in p for p in problems) and any("ping" in p for p in problems)
