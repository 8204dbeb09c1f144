"""CLI conventions made uniform: check-config's -c/--config, the root's options after the subcommand,
-o on apply and rdma opensm-config, and a failure under -o json|yaml as one object on stdout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import structlog
import yaml

from shaperd.backends.htb.ops import DeleteRoot
from shaperd.cli import errout
from shaperd.cli import main as cli
from shaperd.cli import reconcile as cli_reconcile
from shaperd.core import log
from shaperd.core.errors import ConfigProblem, KernelError
from shaperd.engine.reconciler import BackendOutcome, PlanResult, Report, TargetOutcome
from shaperd.rdma import opensm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "full.yaml"
INVALID = ("tenants:\n  - {name: a, bandwidthGuarantee: 1Gbps, rdma: {serviceLevel: 15}}\n"
           "  - {name: b}\n")
INVALID_PATHS = ["tenants[0].rdma.serviceLevel", "tenants[1].bandwidthGuarantee"]
TENANTS = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50}
"""
OP = DeleteRoot(device="eth0", ifindex=2)


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """cli.main configures structlog onto this test's captured stderr; later tests must not log into it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def invalid(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(INVALID)
    return p


@pytest.fixture
def tenants(tmp_path):
    p = tmp_path / "tenants.yaml"
    p.write_text(TENANTS)
    return p


# check-config -c FILE


@pytest.mark.parametrize("how", [["-c"], ["--config"], [], ["--config", "SAME"]], ids=["-c", "--config",
                                                                                       "positional", "both same"])
def test_check_config_takes_the_file_as_every_command_does(how, capsys):
    argv = ["check-config", *[str(EXAMPLE) if a == "SAME" else a for a in how], str(EXAMPLE), "-o", "json"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is True and doc["file"] == str(EXAMPLE) and doc["tenants"]


def test_check_config_without_a_file_checks_the_agents_default(monkeypatch):
    seen = []
    monkeypatch.setattr("shaperd.cli.config.load_file", lambda path: seen.append(path) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["check-config"])
    assert seen == ["/etc/shaperd/traffic-shaping.yaml"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_check_config_with_two_different_files_is_a_usage_error_naming_both(fmt, invalid, capsys):
    assert cli.main(["check-config", str(EXAMPLE), "-c", str(invalid), "-o", fmt]) == 2
    cap = capsys.readouterr()
    assert str(EXAMPLE) in cap.err and str(invalid) in cap.err and "usage: shaperd check-config" in cap.err
    if fmt == "json":
        doc = json.loads(cap.out)
        assert doc["ok"] is False and doc["error"]["exit_code"] == 2
        assert str(EXAMPLE) in doc["error"]["message"] and str(invalid) in doc["error"]["message"]
    else:
        assert cap.out == ""


# -o json|yaml: a failure as an object on stdout, and on stderr as before


def test_check_config_json_on_an_invalid_file_prints_the_problems_with_their_paths(invalid, capsys):
    assert cli.main(["check-config", "-c", str(invalid), "-o", "json"]) == 2
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc["valid"] is False and doc["ok"] is False and doc["file"] == str(invalid)
    assert doc["error"]["exit_code"] == 2
    assert [p["path"] for p in doc["error"]["problems"]] == INVALID_PATHS
    assert "expected an InfiniBand service level" in doc["error"]["problems"][0]["message"]
    assert cap.err.startswith("shaperd: invalid tenants file") and all(p in cap.err for p in INVALID_PATHS)
    assert cli.main(["check-config", str(invalid), "-o", "yaml"]) == 2
    assert yaml.safe_load(capsys.readouterr().out) == doc
    assert cli.main(["check-config", str(invalid)]) == 2  # text: stderr only, as before
    assert capsys.readouterr().out == ""


def test_a_bad_tenants_file_under_json_is_an_object_for_every_command(invalid, capsys):
    """main's handler: a ConfigError raised inside any command (here plan, before it reads the node)."""
    assert cli.main(["plan", "-c", str(invalid), "-o", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["exit_code"] == 2 and [p["path"] for p in doc["error"]["problems"]] == INVALID_PATHS


def test_a_kernel_failure_under_json_is_an_object_with_exit_1(monkeypatch, capsys):
    def boom(args, **kw):
        raise KernelError("open", "rtnetlink", "netns x", "no such namespace")

    monkeypatch.setattr(cli_reconcile, "_reconciler", boom)
    assert cli.main(["apply", "-c", str(EXAMPLE), "-o", "json"]) == 1
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc == {"ok": False, "error": {"message": str(KernelError("open", "rtnetlink", "netns x",
                                                                     "no such namespace")),
                                          "exit_code": 1, "problems": []}}
    assert "no such namespace" in cap.err
    assert cli.main(["diff", "-c", str(EXAMPLE), "-o", "json"]) == 3  # diff keeps its own code for it
    assert json.loads(capsys.readouterr().out)["error"]["exit_code"] == 3
    assert cli.main(["apply", "-c", str(EXAMPLE)]) == 1
    assert capsys.readouterr().out == ""


def test_error_result_takes_plain_problems_too():
    doc = errout.error_result("m", 2, [ConfigProblem("a.b", "x"), "loose"])
    assert doc["error"]["problems"] == [{"path": "a.b", "message": "x"}, {"path": "", "message": "loose"}]


# apply -o


def _apply_with(monkeypatch, rep):
    class Rec:
        capabilities = None

        def apply(self, cfg):
            return rep

    monkeypatch.setattr(cli_reconcile, "_reconciler", lambda args, **kw: Rec())


@pytest.mark.parametrize("target,code", [
    (TargetOutcome("htb", "eth0", ops=[OP]), 0),
    (TargetOutcome("htb", "eth0", ops=[OP], failed=[(OP, KernelError("delete", "root qdisc", "eth0", "EBUSY"))]), 1),
], ids=["done", "a write failed"])
def test_apply_takes_output_and_prints_what_it_did_as_one_object(monkeypatch, capsys, target, code):
    _apply_with(monkeypatch, Report(PlanResult(), [BackendOutcome("htb", targets=[target])]))
    assert cli.main(["apply", "-c", str(EXAMPLE), "-o", "json"]) == code
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc["exit_code"] == code and doc["ok"] is (code == 0) and doc["changes"] == 1
    assert doc["targets"][0]["ops"] == [OP.describe()] and "in_sync" not in doc
    assert ("EBUSY" in cap.err) is (code == 1) and ("EBUSY" in doc["targets"][0]["failed"][0] if code else True)
    assert cli.main(["apply", "-c", str(EXAMPLE), "-o", "yaml"]) == code
    assert yaml.safe_load(capsys.readouterr().out) == doc
    assert cli.main(["apply", "-c", str(EXAMPLE)]) == code
    assert "1 changed" in capsys.readouterr().out
    assert cli.build_parser().parse_args(["apply", "--json"]).output == "json"


# rdma opensm-config -o


def test_opensm_config_takes_output(tenants, capsys):
    assert cli.main(["rdma", "opensm-config", "-c", str(tenants)]) == 0
    text = capsys.readouterr().out
    assert cli.main(["rdma", "opensm-config", "-c", str(tenants), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["options"]["qos"] == "TRUE"
    for key, value in doc["options"].items():  # the object says what the text says
        assert f"{key} {value}\n" in text
    assert set(doc["tenant_sls"]) == {"tenant-a", "tenant-b"}
    assert cli.main(["rdma", "opensm-config", "-c", str(tenants), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == doc


def test_opensm_config_write_under_json_says_what_it_did(tenants, tmp_path, capsys):
    conf = tmp_path / "opensm.conf"
    conf.write_text("# site\nlog_flags 0x03\n")
    argv = ["rdma", "opensm-config", "-c", str(tenants), "--write", str(conf), "--no-signal", "-o", "json"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["write"]["written"] is True and doc["write"]["signalled"] == []
    assert any(m.startswith("wrote ") for m in doc["write"]["messages"])
    assert opensm.BEGIN_MARK in conf.read_text() and "log_flags 0x03\n" in conf.read_text()
    assert cli.main(argv) == 0  # unchanged the second time
    assert json.loads(capsys.readouterr().out)["write"]["written"] is False


def test_opensm_config_refusal_under_json_is_an_object(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - {name: a, bandwidthGuarantee: 1Gbps, rdma: {serviceLevel: 15}}\n")
    assert cli.main(["rdma", "opensm-config", "-c", str(bad), "-o", "json"]) == 2
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc["error"]["problems"][0]["path"] == "tenants[0].rdma.serviceLevel" and "serviceLevel" in cap.err


# the root's options after the subcommand


def _leaves(p: argparse.ArgumentParser, argv=()):
    """argv of every runnable subcommand (the parsers with no subcommands of their own)."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield list(argv)
    for a in subs:
        for name, child in a.choices.items():
            yield from _leaves(child, [*argv, name])


LEAVES = list(_leaves(cli.build_parser()))


def test_the_leaves_are_every_command():
    names = {" ".join(a) for a in LEAVES}
    assert {"plan", "apply", "check-config", "run", "rdma opensm-config", "rdma status", "completion"} <= names


@pytest.mark.parametrize("argv", LEAVES, ids=" ".join)
def test_every_subcommand_accepts_the_root_options_after_it(argv):
    sub = _parser_of(cli.build_parser(), argv)
    dests = {a.dest for a in sub._actions}
    assert {"log_level", "log_json"} <= dests and any("--version" in a.option_strings for a in sub._actions)
    assert [s for a in sub._actions for s in a.option_strings].count("--log-level") == 1


def _parser_of(p, argv):
    for name in argv:
        p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return p


@pytest.mark.parametrize("argv,level,as_json", [
    (["plan", "--log-level", "error"], "error", None),
    (["--log-level", "debug", "plan", "--log-level", "error"], "error", None),  # after the subcommand wins
    (["--log-level", "debug", "plan"], "debug", None),  # absent after it: the one before stays
    (["plan"], None, None),
    (["rdma", "opensm-config", "--log-json"], None, True),
    (["rdma", "--log-level", "warning", "opensm-config"], "warning", None),
    (["--log-json", "check-config", "x", "--log-level", "info"], "info", True),
])
def test_root_options_after_the_subcommand_and_which_wins(argv, level, as_json):
    args = cli.build_parser().parse_args(argv)
    assert args.log_level == level and args.log_json is as_json


def test_log_level_after_the_subcommand_reaches_the_logging_set_up(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(log, "configure", lambda **kw: seen.append(kw))
    assert cli.main(["check-config", str(EXAMPLE), "--log-level", "error"]) == 0
    assert seen == [{"json": None, "level": "error", "enabled": True}]


def test_version_after_the_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("shaperd ")


def test_help_lists_the_root_options_once_and_apart(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "global options (also accepted before the subcommand):" in out
    assert out.count("--log-level {") == 2  # usage line and the group, nowhere else
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    root = capsys.readouterr().out
    assert "global options" not in root and "--log-level" in root


@pytest.mark.parametrize("fmt", ["shell", "configmap", "json"])
def test_a_format_of_a_commands_own_gets_no_error_object(invalid, tmp_path, capsys, fmt):
    """rdma env's ``-o shell|configmap`` are not JSON or YAML: there a failure stays on stderr alone."""
    assert cli.main(["rdma", "env", "a", "-c", str(invalid), "--sysfs-root", str(tmp_path), "-o", fmt]) == 2
    cap = capsys.readouterr()
    assert "serviceLevel" in cap.err
    if fmt == "json":
        assert json.loads(cap.out)["error"]["exit_code"] == 2
    else:
        assert cap.out == ""
