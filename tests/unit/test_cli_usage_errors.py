"""argparse's usage errors under ``-o json|yaml``: argparse's usage and error lines stay on stderr, and the
error object (cli/errout.py) is on stdout with the usage exit code, wherever ``-o`` was given."""

from __future__ import annotations

import json

import pytest
import structlog
import yaml

from shaperd.cli import errout
from shaperd.cli import main as cli
from shaperd.core.exitcodes import EXIT_BAD_INPUT


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def run(capsys, argv):
    with pytest.raises(SystemExit) as ex:
        cli.main(argv)
    out, err = capsys.readouterr()
    return ex.value.code, out, err


@pytest.mark.parametrize("argv, says", [
    (["plan", "-o", "json", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),  # unknown flag
    (["plan", "--no-such-flag", "-o", "json"], "unrecognized arguments: --no-such-flag"),
    (["status", "-o", "json", "--interval"], "argument --interval: expected one argument"),  # missing argument
    (["status", "--interval", "soon", "-ojson"], "argument --interval: invalid float value: 'soon'"),
    (["plan", "--output=json", "--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),  # bad choice
    (["--log-level", "loud", "plan", "--json"], "argument --log-level: invalid choice: 'loud'"),  # before the subcommand
    (["rdma", "-o", "json"], "invalid choice: 'json'"),  # a bad subcommand, in a subparser
])
def test_usage_error_is_an_object_on_stdout_under_json(capsys, argv, says):
    code, out, err = run(capsys, argv)
    assert code == EXIT_BAD_INPUT
    doc = json.loads(out)
    assert doc["ok"] is False and doc["error"]["exit_code"] == EXIT_BAD_INPUT
    assert says in doc["error"]["message"] and doc["error"]["message"].startswith("shaperd")
    # argparse's own text is kept on stderr: the usage, then "PROG: error: MESSAGE".
    assert err.startswith("usage: shaperd") and f"error: {doc['error']['message'].split(': ', 1)[1]}" in err


def test_usage_error_under_yaml(capsys):
    code, out, err = run(capsys, ["plan", "-o", "yaml", "--no-such-flag"])
    doc = yaml.safe_load(out)
    assert code == EXIT_BAD_INPUT and doc["error"]["exit_code"] == EXIT_BAD_INPUT
    assert "--no-such-flag" in doc["error"]["message"] and "usage: shaperd" in err


@pytest.mark.parametrize("argv", [
    ["plan", "--no-such-flag"],  # no format asked for
    ["plan", "-o", "text", "--no-such-flag"],
    ["plan", "-o", "xml"],  # the format itself is the bad choice: nothing to write an object in
])
def test_usage_error_without_a_machine_format_is_argparse_text_only(capsys, argv):
    code, out, err = run(capsys, argv)
    assert code == EXIT_BAD_INPUT and out == "" and "error:" in err


@pytest.mark.parametrize("argv, fmt", [
    (["-o", "json"], "json"), (["-ojson"], "json"), (["-o=yaml"], "yaml"), (["--output", "yaml"], "yaml"),
    (["--output=json"], "json"), (["--json"], "json"), (["-o", "json", "-o", "text"], "text"),
    (["plan", "--", "-o", "json"], None), (["-o"], None), ([], None),
])
def test_asked_format_reads_every_spelling(argv, fmt):
    assert errout.asked_format(argv) == fmt


def test_every_subparser_is_a_shaperd_parser():
    """A subcommand's own usage errors go through errout.Parser too (add_subparsers makes its class)."""
    ap = cli.build_parser()
    assert isinstance(ap, errout.Parser)
    assert all(isinstance(p, errout.Parser) for p in cli._subparsers(ap))
