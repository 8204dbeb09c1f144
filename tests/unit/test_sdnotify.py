"""report/sdnotify: the sd_notify datagrams as systemd receives them, on a socket the test binds."""

from __future__ import annotations

import socket

import pytest

from shaperd.report.sdnotify import Notifier, socket_address, watchdog_interval_s


@pytest.fixture
def receiver(tmp_path):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2.0)  # a deadline for a message that should already be queued
    yield path, s
    s.close()


def drain(s: socket.socket) -> list[dict[str, str]]:
    """Every datagram queued so far, each as its KEY=value fields."""
    out = []
    s.setblocking(False)
    try:
        while True:
            data = s.recv(4096).decode()
            out.append(dict(line.split("=", 1) for line in data.splitlines()))
    except BlockingIOError:
        pass
    finally:
        s.settimeout(2.0)
    return out


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_first_pass_is_ready_then_the_watchdog_at_half_the_period_only_while_healthy(receiver):
    path, s = receiver
    clock = Clock()
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"}, pid=42, clock=clock)
    assert n.enabled and n.watchdog_s == 2.0
    n.loop_pass(healthy=True, status="2 tenants")
    first = drain(s)
    assert first[0]["READY"] == "1" and first[0]["STATUS"] == "2 tenants"
    assert first[1:] == [{"WATCHDOG": "1"}]
    clock.t += 1.0
    n.loop_pass(healthy=True)
    assert drain(s) == []  # not due yet: half of WatchdogSec has not passed
    clock.t += 1.0
    n.loop_pass(healthy=True)
    assert drain(s) == [{"WATCHDOG": "1"}]
    clock.t += 5.0
    n.loop_pass(healthy=False)  # failing: systemd must see the feed stop
    assert drain(s) == []
    n.loop_pass(healthy=True)  # recovered before the deadline: fed again at once
    assert drain(s) == [{"WATCHDOG": "1"}]


def test_reload_and_stop_messages(receiver):
    path, s = receiver
    n = Notifier({"NOTIFY_SOCKET": path}, pid=42)
    assert n.watchdog_s is None
    n.loop_pass(healthy=True, status="2 tenants")
    assert drain(s)[0]["READY"] == "1"
    n.reloading()
    n.reloaded("3 tenants")
    n.stopping()
    msgs = drain(s)
    assert msgs[0]["RELOADING"] == "1" and int(msgs[0]["MONOTONIC_USEC"]) > 0
    assert msgs[1] == {"READY": "1", "STATUS": "3 tenants"}
    assert msgs[2]["STOPPING"] == "1"


def test_abstract_socket_names_and_unknown_forms():
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@sd-notify-x") == b"\0sd-notify-x"
    assert socket_address("") is None and socket_address("@") is None and socket_address("vsock:2:9") is None


def test_watchdog_meant_for_another_pid_or_off_is_not_fed():
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=8) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "8"}, pid=8) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, pid=8) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "abc"}, pid=8) is None


def test_without_notify_socket_everything_is_a_no_op():
    n = Notifier({"WATCHDOG_USEC": "1000000"}, pid=1)
    assert not n.enabled and n.watchdog_s is None
    n.loop_pass(healthy=True)
    n.reloading()
    n.stopping()
    assert n.send("READY=1") is False


def test_a_vanished_socket_is_logged_once_and_never_raises(tmp_path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}, pid=1)
    assert n.send("READY=1") is False
    n.loop_pass(healthy=True)
    n.stopping()
    n.close()


def test_not_ready_until_the_caller_says_so_and_until_then_status_says_what_it_waits_for(receiver):
    path, s = receiver
    clock = Clock()
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"}, pid=42, clock=clock)
    n.status("waiting for the first reconcile: reading the node")
    n.loop_pass(healthy=True, status="waiting for the first reconcile: reading the node", ready=False)
    # the same status is not sent twice; the watchdog is fed while starting (systemd ignores it until READY=1)
    assert drain(s) == [{"STATUS": "waiting for the first reconcile: reading the node"}, {"WATCHDOG": "1"}]
    assert not n.ready
    n.reloading()  # SIGHUP while starting: no RELOADING=1, and the reload's end is no READY=1
    n.reloaded("waiting for the first reconcile: the first pod list from the API server")
    assert drain(s) == [{"STATUS": "reloading the tenants file"},
                        {"STATUS": "waiting for the first reconcile: the first pod list from the API server"}]
    clock.t += 2.0
    n.loop_pass(healthy=True, status="1 tenants, 1 reconciles, in sync", ready=True)
    msgs = drain(s)
    assert msgs[0]["READY"] == "1" and msgs[0]["STATUS"] == "1 tenants, 1 reconciles, in sync" and n.ready
    assert msgs[1:] == [{"WATCHDOG": "1"}]
    n.loop_pass(healthy=True, status="1 tenants, 2 reconciles, degraded: 1 target not enforced (x)", ready=True)
    assert drain(s) == [{"STATUS": "1 tenants, 2 reconciles, degraded: 1 target not enforced (x)"}]  # no 2nd READY

