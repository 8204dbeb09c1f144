"""The shipped deployment files parse and agree with the CLI."""

from pathlib import Path

import yaml

from shaperd import config
from shaperd.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_daemonset_manifests_parse_and_carry_a_valid_tenants_file():
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "daemonset" / "shaperd.yaml").read_text())}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} <= set(docs)
    cfg = config.load_text(yaml.safe_dump(docs["ConfigMap"]), "daemonset ConfigMap")
    assert [t.name for t in cfg.tenants] == ["tenant-a", "tenant-b"]
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    args = pod["containers"][0]["args"]
    parsed = build_parser().parse_args(args)  # the container's arguments are valid for this CLI
    assert parsed.cmd == "run" and parsed.config == "/etc/shaperd/traffic-shaping.yaml"


def test_systemd_unit_runs_a_valid_command():
    unit = (ROOT / "systemd" / "shaperd.service").read_text()
    line = next(l for l in unit.splitlines() if l.startswith("ExecStart="))
    argv = line.split("=", 1)[1].split()
    assert argv[0].endswith("/shaperd")
    assert build_parser().parse_args(argv[1:]).cmd == "run"
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
