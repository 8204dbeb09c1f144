"""What ``shaperd status`` loads: none of the packages only other commands need.

In the QEMU tier's guest every module imported costs several file lookups over 9p and its own
bytecode exec under TCG: ``shaperd status`` took most of a minute there, most of it imports
(BENCHMARKS.md "status cost"). These tests keep out, by module name in a fresh interpreter (never
by timing), what status has no use for: structlog (and asyncio, which it pulls in) while logging is
off, prometheus_client (the daemon's metrics), importlib.metadata (``--version``), tempfile (writes).
The child imports what the status command imports (its parser, report/status.py, the degraded line's
reconciler and prober, every backend's status sections and backend) without touching the kernel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import procs

PKG = Path(__file__).resolve().parents[2] / "shaperd"
# Loaded by status before this change, never used by it (a module name, or a package and its submodules).
UNUSED_BY_STATUS = ("structlog", "asyncio", "prometheus_client", "importlib.metadata", "email", "tempfile",
                    "http.server", "wsgiref")

STATUS_IMPORTS = r"""
import importlib, json, sys
from pathlib import Path
from shaperd.cli import main as cli

args = cli.build_parser(["status", "-o", "json"]).parse_args(["status", "-o", "json"])
cli.log.configure(json=args.log_json, level="info", enabled=False)  # what main() does for status
cli.log.get("shaperd.reconcile").warning("never shown", device="eth0")
import shaperd.cli.node, shaperd.engine.probe, shaperd.engine.reconciler, shaperd.report.degraded
import shaperd.report.rdma_view, shaperd.report.status
from shaperd.engine.annotations import AnnotationLedger
from shaperd.engine.registry import REGISTRY

AnnotationLedger()  # the reconciler's, made by open_node
for spec in REGISTRY.specs:
    for part in ("status", "backend"):
        if (Path(sys.argv[1]) / "backends" / spec.name / f"{part}.py").exists():
            importlib.import_module(f"shaperd.backends.{spec.name}.{part}")
print(json.dumps(sorted(sys.modules)))
"""


def _modules(code: str, *argv: str) -> set[str]:
    out = procs.run([sys.executable, "-c", code, *argv], timeout_s=120).stdout
    return set(json.loads(out.splitlines()[-1]))


def _loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_status_loads_none_of_what_only_other_commands_use():
    modules = _modules(STATUS_IMPORTS, str(PKG))
    assert "shaperd.report.status" in modules and "shaperd.engine.reconciler" in modules  # the child did its part
    assert [n for n in UNUSED_BY_STATUS if _loaded(modules, n)] == []


def test_logging_off_loads_no_structlog_and_a_logger_handed_out_then_logs_once_configured_on():
    code = ("import sys\nfrom shaperd.core import log\n"
            "log.configure(json=True, enabled=False)\n"
            "lg = log.get('shaperd.test')\nlg.bind(a=1).info('dropped')\nlg.warning('dropped too')\n"
            "print('structlog' in sys.modules, file=sys.stderr)\n"
            "log.configure(json=True, level='info', enabled=True)\n"
            "lg.warning('said', n=2)\nlog.get('shaperd.test').debug('below the level')\n")
    r = procs.run([sys.executable, "-c", code], timeout_s=120)
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "False"
    assert len(lines) == 2, lines
    said = json.loads(lines[1])
    assert (said["event"], said["n"], said["level"]) == ("said", 2, "warning")


def test_the_ledger_collector_still_exports_every_reason_from_zero():
    from prometheus_client import CollectorRegistry, generate_latest

    from shaperd.core.podcaps import REASONS
    from shaperd.engine.annotations import FAMILY, AnnotationLedger

    reg = CollectorRegistry()
    reg.register(AnnotationLedger().collector())
    text = generate_latest(reg).decode()
    assert all(f'{FAMILY}_total{{reason="{r}"}} 0.0' in text for r in REASONS), text
