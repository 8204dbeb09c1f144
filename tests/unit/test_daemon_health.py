"""Health tells the truth: a degraded node (plan problems, targets left alone) says so everywhere, stays fed.

The daemon's reconcile, its STATUS= line, the metric and /healthz and /readyz, and ``shaperd status``
are driven here with fake reconcilers returning real engine Reports; ``Daemon.run`` with fake
components whose stop raises. Nothing touches the host's kernel: the event socket is a pipe.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from types import SimpleNamespace

import pytest
import structlog

from shaperd.cli import main as cli
from shaperd.core import config
from shaperd.core.errors import ConfigProblem, DiscoveryError, KernelError
from shaperd.core.inventory import Capabilities
from shaperd.daemon.service import WATCHDOG_MAX_FAILURES, Daemon
from shaperd.engine.reconciler import BackendOutcome, PlanResult, Report, TargetOutcome
from shaperd.kernel import events as events_mod
from shaperd.report.degraded import Degraded, of_report
from shaperd.report.metrics import Metrics
from shaperd.report.sdnotify import Notifier

CFG = config.load_text("""
node: {interfaces: [v0, v1], capacity: 1Gbps}
tenants:
  - {name: a, bandwidthGuarantee: 100Mbps, priority: 1, match: {cidrs: [198.18.1.0/24]}}
""")
FOREIGN = "root qdisc tbf 1: is not shaperd's; left alone (set node.takeOver or pass --take-over to replace it)"
LINE = f"degraded: 1 target not enforced (htb v0: {FOREIGN})"


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()  # cli.main() pointed structlog at a captured stream


def report(blocked=(), problems=(), failed=False) -> Report:
    """A Report as the engine makes it: htb targets v0 (blocked if named) and v1, optional plan problems."""
    targets = [TargetOutcome("htb", dev, blocked=FOREIGN if dev in blocked else None) for dev in ("v0", "v1")]
    if failed:
        targets[1].failed = [(None, KernelError("create", "class 7368:10", "v1", "Invalid argument", 22))]
    desired = {"htb": SimpleNamespace(problems=tuple(problems), warnings=())}
    return Report(PlanResult(desired=desired), [BackendOutcome("htb", targets=targets)])


class FakeRec:
    capabilities = Capabilities(notes=("fake",))

    def __init__(self, *reports):
        self.reports = list(reports)

    def apply(self, cfg):
        r = self.reports.pop(0) if len(self.reports) > 1 else self.reports[0]
        if isinstance(r, Exception):
            raise r
        return r

    diff = apply


# -- the summary ---------------------------------------------------------------------------------

def test_the_summary_counts_and_names_the_first_reason():
    assert not of_report(report()) and of_report(report()).line() == "" and of_report(report()).render() == ""
    d = of_report(report(blocked=("v0",)))
    assert d.line() == LINE and d.by_kind() == {"blocked": 1, "problem": 0}
    both = of_report(report(blocked=("v0", "v1"), problems=[ConfigProblem("node.capacity", "unknown (device v2)")]))
    assert both.count == 3 and both.by_kind() == {"blocked": 2, "problem": 1}
    assert both.line() == f"degraded: 2 targets not enforced, 1 plan problem (htb v0: {FOREIGN})"
    assert both.render().splitlines()[1:] == [f"  htb v1: {FOREIGN}", "  node.capacity: unknown (device v2)"]
    only = Degraded(problems=("tenants[0].name: shared",))
    assert only.line() == "degraded: 1 plan problem (tenants[0].name: shared)"
    assert json.loads(json.dumps(both.doc()))["blocked"][1] == {"backend": "htb", "target": "v1", "reason": FOREIGN}


# -- the daemon's reconcile: STATUS, watchdog, metric, health --------------------------------------

def _daemon(metrics=False) -> Daemon:
    d = Daemon("/nonexistent", None)
    d.config = CFG
    if metrics:
        d.metrics = Metrics(None, wall=lambda: 1.7e9, monotonic=lambda: 100.0)
        d.metrics.config_loaded(True, CFG)
    return d


def test_a_degraded_node_is_reconciled_ready_says_degraded_and_keeps_the_watchdog_fed():
    d = _daemon(metrics=True)
    rec = FakeRec(report(blocked=("v0",)))
    for _ in range(WATCHDOG_MAX_FAILURES + 2):
        assert d.reconcile(rec) is None  # not retried sooner: asking again changes nothing
    assert d.reconciled_once and d.failures == 0 and d.healthy  # the watchdog stays fed
    assert d._status() == f"1 tenants, {WATCHDOG_MAX_FAILURES + 2} reconciles, {LINE}"
    text = d.metrics.exposition().decode()
    assert 'shaperd_degraded_targets{kind="blocked"} 1.0' in text
    assert 'shaperd_degraded_targets{kind="problem"} 0.0' in text
    assert "# HELP shaperd_degraded_targets What the last reconcile could not enforce, by kind" in text
    assert "shaperd_last_reconcile_success_timestamp_seconds 1.7e+09" in text  # degraded is not failed
    ok, why = d.metrics.healthy()
    assert ok and why == f"loop last ticked 0.0s ago; {LINE}"
    assert d.metrics.ready() == (True, LINE)
    # the foreign qdisc goes: the next reconcile is in sync, and everything says so
    d.reconcile(FakeRec(report()))
    assert d._status().endswith("reconciles, in sync")
    assert 'shaperd_degraded_targets{kind="blocked"} 0.0' in d.metrics.exposition().decode()
    assert d.metrics.ready() == (True, "ok") and d.metrics.healthy()[1] == "loop last ticked 0.0s ago"


def test_failing_writes_stop_the_watchdog_and_a_plan_problem_is_degraded_not_failing():
    d = _daemon()
    rec = FakeRec(report(failed=True))
    for _ in range(WATCHDOG_MAX_FAILURES):
        d.reconcile(rec)
    assert not d.healthy and d._status().endswith("failing")  # the check above can fail
    d = _daemon()
    d.reconcile(FakeRec(report(problems=[ConfigProblem("node.capacity", "unknown (device v0)")])))
    assert d.healthy and d._status().endswith("degraded: 1 plan problem (node.capacity: unknown (device v0))")


def test_before_the_first_reconcile_status_says_what_it_waits_for_and_ready_waits(tmp_path):
    path = str(tmp_path / "notify")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.setblocking(False)
    try:
        d = Daemon(str(tmp_path / "t.yaml"), None)
        d.notify = Notifier({"NOTIFY_SOCKET": path}, pid=1)
        assert d._status() == (f"waiting for the first reconcile: no valid tenants file yet ({tmp_path / 't.yaml'}); "
                               "nothing enforced")
        d.config = CFG
        d.pods = SimpleNamespace(has_synced=False, synced=False, last_error="connection refused")
        d.reconcile(FakeRec(report()))
        assert d._status() == "waiting for the first reconcile: the first pod list from the API server (connection refused)"
        d.pods = None
        d.reconcile(FakeRec(DiscoveryError("read links: the netlink socket timed out")))
        assert not d.reconciled_once
        assert d._status() == ("waiting for the first reconcile: the last attempt failed, retrying in 1 s: "
                               "read links: the netlink socket timed out")
        d.notify.loop_pass(healthy=d.healthy, status=d._status(), ready=d.reconciled_once)
        d.reconcile(FakeRec(report(blocked=("v0",))))
        d.notify.loop_pass(healthy=d.healthy, status=d._status(), ready=d.reconciled_once)
        msgs = []
        while True:
            try:
                msgs.append(dict(ln.split("=", 1) for ln in rx.recv(4096).decode().splitlines()))
            except BlockingIOError:
                break
        statuses = [m["STATUS"] for m in msgs]
        assert statuses[:3] == ["waiting for the first reconcile: the first pod list from the API server "
                                "(connection refused)", "waiting for the first reconcile: reading the node",
                                "waiting for the first reconcile: the last attempt failed, retrying in 1 s: "
                                "read links: the netlink socket timed out"]
        assert [i for i, m in enumerate(msgs) if m.get("READY") == "1"] == [len(msgs) - 1]  # once, at the end
        assert msgs[-1]["STATUS"] == f"1 tenants, 2 reconciles, {LINE}"  # a reconcile that ran resets the failures
    finally:
        rx.close()


# -- Daemon.run: start-up, loop, shutdown on an ExitStack ------------------------------------------

class FakeEvents:
    """The kernel event socket, as a pipe nothing writes to."""

    def __init__(self, netns=None, **kw):
        self.r, self.w = os.pipe()
        self.closed = False

    def fileno(self):
        return self.r

    def drain(self):
        return events_mod.Drained()

    def close(self):
        os.close(self.r)
        os.close(self.w)
        self.closed = True


class Component:
    """A watcher whose stop (or close) raises: it records the call first."""

    def __init__(self, name, calls, synced=True):
        self.name, self.calls = name, calls
        self.has_synced = self.synced = synced
        self.last_error = None

    def start(self, on_change=None):
        self.calls.append(f"start {self.name}")
        if on_change is not None:
            on_change()  # the ConfigMap's first list

    def stop(self):
        self.calls.append(f"stop {self.name}")
        raise RuntimeError(f"{self.name} would not stop")

    close = stop

    def snapshot(self):
        return {}

    def effective(self, cfg):
        return cfg

    def poll(self):
        return False

    def load(self):
        return CFG

    describe = "configmap shaperd-system/tenants"


@pytest.fixture
def fake_events(monkeypatch):
    made = []

    def make(netns=None, **kw):
        made.append(FakeEvents())
        return made[-1]

    monkeypatch.setattr(events_mod, "KernelEvents", make)
    return made


def test_a_stop_that_raises_does_not_keep_the_others_from_stopping(fake_events, tmp_path):
    calls: list[str] = []
    parts = {n: Component(n, calls) for n in ("pods", "configmap", "cilium", "pod-resources")}
    d = Daemon(str(tmp_path / "unused.yaml"), None, pod_watcher_factory=lambda on_change: parts["pods"],
               config_source=parts["configmap"], cilium_factory=lambda on_change: parts["cilium"],
               pod_resources=parts["pod-resources"])
    rx_path = str(tmp_path / "notify")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(rx_path)
    rx.setblocking(False)
    d.notify = Notifier({"NOTIFY_SOCKET": rx_path}, pid=1)
    rec = FakeRec(report(blocked=("v0",)))

    def apply(cfg):
        d.stop = True  # one reconcile, then the loop ends as on SIGTERM
        return report(blocked=("v0",))

    rec.apply = apply
    d.make_reconciler = lambda pods: rec
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert d.run() == 1  # a stop failed: said in the exit code
        msgs = []
        while True:
            try:
                msgs.append(rx.recv(4096).decode())
            except BlockingIOError:
                break
    finally:
        rx.close()
    stops = [c for c in calls if c.startswith("stop")]
    assert stops == ["stop pod-resources", "stop cilium", "stop configmap", "stop pods"]  # all, in reverse of start
    assert d._stop_failed == ["pod-resources client", "CiliumNetworkPolicy view", "ConfigMap watcher", "pod watcher"]
    assert fake_events[0].closed  # what was registered first still ran
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are given back
    assert any(f"READY=1\nSTATUS=1 tenants, 1 reconciles, {LINE}" in m for m in msgs), msgs
    assert msgs[-1].startswith("STOPPING=1")  # said first at shutdown, the datagrams after it did not fail it
    assert d.notify._sock is None  # and the notify socket closed last


def test_a_start_up_that_fails_half_way_stops_what_had_started(fake_events, tmp_path):
    calls: list[str] = []
    pods = Component("pods", calls)
    pods.stop = lambda: calls.append("stop pods")

    def no_reconciler(_pods):
        raise KernelError("open", "netlink socket", "node", "Permission denied", 1)

    d = Daemon(str(tmp_path / "t.yaml"), no_reconciler, pod_watcher_factory=lambda on_change: pods)
    with pytest.raises(KernelError):
        d.run()
    assert calls == ["start pods", "stop pods"] and fake_events[0].closed


# -- shaperd status ------------------------------------------------------------------------------

class Reader:
    def links(self):
        return []

    def routes(self, family):
        return []


def test_status_prints_the_degraded_line_puts_it_in_json_and_exits_by_the_cli_convention(monkeypatch, tmp_path,
                                                                                         capsys):
    from shaperd.backends.dcb import status as dcb_status
    from shaperd.backends.devlink import status as devlink_status
    from shaperd.backends.edt import status as edt_status
    from shaperd.backends.htb import classifier_status
    from shaperd.backends.htb import status as htb_status
    from shaperd.backends.vfrate import status as vf_status
    from shaperd.kernel import rtnl

    monkeypatch.setattr(rtnl, "RtnlReader", lambda netns=None, **kw: Reader())
    monkeypatch.setattr(htb_status, "sample", lambda reader: {})
    monkeypatch.setattr(classifier_status, "collect", lambda reader: {})
    from shaperd.backends.podingress import status as podingress_status

    # no NIC or pod ingress section: their kernel sides (VF info, devlink, DCB, qdisc dumps) are not faked here
    for nic in (vf_status, devlink_status, dcb_status, podingress_status):
        monkeypatch.setattr(nic, "sections", lambda inp: [])
    monkeypatch.setattr(edt_status, "devices", lambda reader: [])
    opened = []
    got = {"rep": report(blocked=("v0",))}

    def reconciler(args, **kw):
        opened.append(args)
        return SimpleNamespace(diff=lambda cfg: got["rep"])

    from shaperd.cli import node as cli_node

    monkeypatch.setattr(cli_node, "reconciler", reconciler)
    cfg = tmp_path / "t.yaml"
    cfg.write_text("node: {interfaces: [v0, v1], capacity: 1Gbps}\n"
                   "tenants: [{name: a, bandwidthGuarantee: 100Mbps, priority: 1}]\n")
    argv = ["status", "--config", str(cfg), "--sysfs-root", str(tmp_path), "--run-root", str(tmp_path),
            "--interval", "0"]
    assert cli.main(argv) == 1  # a target left alone: as apply, 1
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == LINE
    assert cli.main(argv + ["-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["degraded"] == {"count": 1, "summary": LINE, "problems": [],
                               "blocked": [{"backend": "htb", "target": "v0", "reason": FOREIGN}]}
    got["rep"] = report(problems=[ConfigProblem("node.capacity", "unknown (device v1)")])
    assert cli.main(argv + ["-o", "json"]) == 2  # a plan problem: as plan and apply, 2
    assert json.loads(capsys.readouterr().out)["degraded"]["problems"] == ["node.capacity: unknown (device v1)"]
    got["rep"] = report()
    assert cli.main(argv) == 0
    assert "degraded" not in capsys.readouterr().out
    assert cli.main(argv + ["-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["degraded"]["count"] == 0
    cfg.write_text("tenants: [{name: a}]\n")  # no valid tenants file: no plan, no key, exit as before
    assert cli.main(argv + ["-o", "json"]) == 0
    assert "degraded" not in json.loads(capsys.readouterr().out)
    assert len(opened) == 5  # one reconciler per run (one per process), never without a tenants file
