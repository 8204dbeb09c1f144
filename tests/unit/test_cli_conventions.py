"""CLI conventions (issue 13): -o text|json|yaml on every read command, diff's kubectl-like exit codes,
completion scripts, NO_COLOR, --version's build details, teardown --dry-run sending nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import yaml

from shaperd.core import buildinfo
from shaperd.cli import main as cli
from shaperd.cli import meta as cli_meta
from shaperd.cli import reconcile as cli_reconcile
from shaperd.core import format as cli_output
from shaperd.core import config
from shaperd.backends.htb.ops import DeleteRoot
from shaperd.engine.reconciler import PlanResult, Report, BackendOutcome, TargetOutcome
from shaperd.report import top
from shaperd.report.sampler import TenantSeries, Target

from ..fake_netlink import FakeKernel
from .test_plan_golden import NODE as GOLDEN_NODE, node_tree, plan_argv
from .test_vfrate_backend import CFG as VF_CFG, ops as vf_ops, rig  # noqa: F401 - the fixture

@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """cli.main configures structlog onto this test's captured stderr; later tests must not log into it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "full.yaml"
DEADLINE_S = 30

# Every read command, as argv before the output option (the tenants file where one is needed).
READ_COMMANDS = [["check-config", str(EXAMPLE)], ["plan"], ["diff"], ["status"], ["top", "--once"], ["teardown"],
                 ["rdma", "status"], ["rdma", "dcb"], ["rdma", "devlink"], ["rdma", "vf-rates"]]


@pytest.mark.parametrize("argv", READ_COMMANDS, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("fmt", ["json", "yaml", "text"])
def test_every_read_command_takes_output_and_keeps_json_as_an_alias(argv, fmt):
    p = cli.build_parser()
    assert p.parse_args(argv + ["-o", fmt]).output == fmt
    assert p.parse_args(argv + ["--output", fmt]).output == fmt
    assert p.parse_args(argv + ["--json"]).output == "json"
    assert p.parse_args(argv).output == "text"
    with pytest.raises(SystemExit):
        p.parse_args(argv + ["-o", "xml"])


def test_check_config_json_and_yaml_are_the_same_object(capsys):
    assert cli.main(["check-config", str(EXAMPLE), "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert cli.main(["check-config", str(EXAMPLE), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json
    assert cli.main(["check-config", str(EXAMPLE), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == as_json
    cfg = config.load_file(str(EXAMPLE))
    assert [t["name"] for t in as_json["tenants"]] == [t.name for t in cfg.tenants]
    assert as_json["tenants"][0]["guarantee_bps"] == cfg.tenants[0].guarantee_bps


def test_plan_json_holds_the_planned_objects(capsys, tmp_path, monkeypatch):
    FakeKernel(**GOLDEN_NODE).install(monkeypatch)  # the golden test's node (eth0 at 100 Gbit/s), not this host's
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    assert cli.main(plan_argv(EXAMPLE, node_tree(tmp_path)) + ["-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    dev = out["desired"]["htb"]["devices"][0]
    assert dev["classes"] and all("rate_bps" in c for c in dev["classes"])


def _report(*targets: TargetOutcome, problems=False) -> Report:
    rep = Report(PlanResult(), [BackendOutcome("htb", targets=list(targets))])
    if problems:
        from shaperd.core.errors import ConfigProblem

        class D:
            warnings = ()
            problems = (ConfigProblem("tenants[0]", "bad"),)

        rep.plan = PlanResult(desired={"htb": D()})
    return rep


OP = DeleteRoot(device="eth0", ifindex=2)


@pytest.mark.parametrize("rep,code", [
    (_report(TargetOutcome("htb", "eth0")), 0),
    (_report(TargetOutcome("htb", "eth0", ops=[OP])), 1),
    (_report(TargetOutcome("htb", "eth0", ops=[OP]), problems=True), 2),
    (_report(TargetOutcome("htb", "eth0", error="read qdiscs on eth0: timed out")), 3),
    (_report(TargetOutcome("htb", "eth0", blocked="root qdisc tbf is not shaperd's")), 3),
], ids=["in sync", "pending", "bad input", "unreadable", "left alone"])
def test_diff_exits_like_kubectl_diff(monkeypatch, capsys, tmp_path, rep, code):
    class Rec:
        capabilities = None

        def diff(self, cfg):
            return rep

    monkeypatch.setattr(cli_reconcile, "_reconciler", lambda args: Rec())
    assert cli.main(["diff", "-c", str(EXAMPLE)]) == code
    text = capsys.readouterr().out
    assert f"{len(rep.devices[0].ops)} would change" in text and ("would delete" in text) is bool(rep.devices[0].ops)
    assert cli.main(["diff", "-c", str(EXAMPLE), "-o", "json"]) == code
    doc = json.loads(capsys.readouterr().out)
    assert doc["in_sync"] is (code == 0) and doc["changes"] == len(rep.devices[0].ops)


def test_diff_of_an_unreadable_node_is_3_and_a_bad_file_2(monkeypatch, tmp_path):
    from shaperd.core.errors import KernelError

    def boom(args):
        raise KernelError("open", "rtnetlink", "netns x", "no such namespace")

    monkeypatch.setattr(cli_reconcile, "_reconciler", boom)
    assert cli.main(["diff", "-c", str(EXAMPLE)]) == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [{name: a}]\n")
    assert cli.main(["diff", "-c", str(bad)]) == 2


def test_teardown_dry_run_lists_the_removals_and_sends_nothing(rig, tmp_path, capsys):  # noqa: F811
    record = tmp_path / "run" / "shaperd" / "vfrate-owned.json"
    nic, backend, rec = rig(state_file=record)
    rec.apply(config.load_text(VF_CFG))
    writes, rates, recorded = list(nic.writes), dict(nic.rates), record.read_text()
    rep = rec.teardown(dry_run=True)
    assert sorted(vf_ops(rep)) == [(0, 0, 0), (1, 0, 0)]  # what a real teardown would reset
    assert nic.writes == writes and nic.rates == rates and record.read_text() == recorded  # nothing sent or forgotten
    real = rec.teardown()
    assert sorted(vf_ops(real)) == sorted(vf_ops(rep)) and nic.writes != writes  # the real one does it


def test_teardown_dry_run_through_the_cli_prints_would(monkeypatch, capsys):
    calls = []

    class Rec:
        def teardown(self, dry_run=False):
            calls.append(dry_run)
            return _report(TargetOutcome("htb", "eth0", ops=[OP]))

    monkeypatch.setattr(cli_reconcile, "_reconciler", lambda args, **kw: Rec())
    assert cli.main(["teardown", "--dry-run"]) == 0
    assert calls == [True] and "would delete" in capsys.readouterr().out.lower()
    assert cli.main(["teardown", "--dry-run", "-o", "yaml"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["dry_run"] is True and doc["targets"][0]["ops"] == [OP.describe()]


def test_version_has_the_build_details(tmp_path, capsys):
    stamp = tmp_path / "_build.json"
    stamp.write_text(json.dumps({"commit": "0123456789ab", "built": "2026-12-01T12:00:00Z"}))
    info = buildinfo.build_info(stamp)
    text = cli_meta.version_text(info)
    assert text.startswith(f"shaperd {info['version']} (commit 0123456789ab, built 2026-12-01T12:00:00Z; ")
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in text and "pyroute2 0.9" in text
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("shaperd ")
    # no stamp and not a checkout: the commit is said to be unknown, never made up
    assert "commit unknown" in cli_meta.version_text({**info, "commit": None})


class _Tty:
    def isatty(self):
        return True


class _Pipe:
    def isatty(self):
        return False


def test_colour_only_on_a_terminal_and_never_with_no_color():
    assert cli_output.use_color(_Tty(), {}) is True
    assert cli_output.use_color(_Tty(), {"NO_COLOR": "1"}) is False
    assert cli_output.use_color(_Tty(), {"NO_COLOR": ""}) is True  # the convention: set AND non-empty
    assert cli_output.use_color(_Pipe(), {}) is False


def test_top_colours_its_bar_only_when_allowed():
    s = TenantSeries(Target("a", "eth0", 0x73680010), guarantee_bps=100, limit_bps=200, rate_bps=150.0)
    coloured = top.render([top.PlaneView("htb", (s,))], {}, 2.0, color=True)
    plain = top.render([top.PlaneView("htb", (s,))], {}, 2.0, color=False)
    assert "\x1b[32m#" in coloured and "\x1b[33m+" in coloured
    assert "\x1b" not in plain
    strip = coloured
    for code in ("\x1b[32m", "\x1b[33m", "\x1b[0m"):
        strip = strip.replace(code, "")
    assert strip == plain  # colour changes nothing else (columns stay aligned)


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S, start_new_session=True, **kw)


def test_bash_completion_completes_subcommands_and_choices(tmp_path):
    script = tmp_path / "shaperd.bash"
    script.write_text(cli_meta.completion_script(cli.build_parser(), "bash"))
    probe = f"""source {script}
COMP_WORDS=(shaperd di); COMP_CWORD=1; _shtab_shaperd; echo "1:${{COMPREPLY[*]}}"
COMP_WORDS=(shaperd diff -o ''); COMP_CWORD=3; _shtab_shaperd; echo "2:${{COMPREPLY[*]}}"
COMP_WORDS=(shaperd rdma v); COMP_CWORD=2; _shtab_shaperd; echo "3:${{COMPREPLY[*]}}"
COMP_WORDS=(shaperd completion ''); COMP_CWORD=2; _shtab_shaperd; echo "4:${{COMPREPLY[*]}}"
"""
    r = _run(["bash", "--norc", "--noprofile", "-c", probe])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1:diff", "2:text json yaml", "3:vf-rates", "4:bash zsh"]


def test_zsh_completion_is_valid_zsh(tmp_path):
    text = cli_meta.completion_script(cli.build_parser(), "zsh")
    assert text.startswith("#compdef shaperd") and "teardown" in text and "--dry-run" in text
    if shutil.which("zsh") is None:
        if os.geteuid() == 0:
            pytest.fail("zsh missing although running as root: scripts/setup installs it")
        pytest.skip("zsh not installed (scripts/setup installs it as root)")
    script = tmp_path / "_shaperd"
    script.write_text(text)
    r = _run(["zsh", "-n", str(script)])
    assert r.returncode == 0, r.stderr


def test_the_build_info_metric_carries_the_same_commit():
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from shaperd.report.metrics import Metrics

    m = Metrics(None, CollectorRegistry())
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    (sample,) = fams["shaperd_build_info"].samples
    assert sample.labels == {"version": buildinfo.cached()["version"], "commit": buildinfo.cached()["commit"] or "unknown"}
