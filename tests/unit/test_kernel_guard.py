"""The unit tier's guard (tests/unit/conftest.py) stops every way into the host's kernel, and says where."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import bpf, bpf_maps, netns, probe, rtnl

from .conftest import GUARD, KernelTouched


def _caught(what: str) -> None:
    (attempt,) = GUARD.take()  # taken: this test's own attempts must not fail it
    assert attempt.startswith(what), attempt


def test_a_netlink_socket_is_refused_and_recorded():
    with pytest.raises(KernelTouched, match="AF_NETLINK"):
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    _caught("socket(AF_NETLINK")
    with pytest.raises(KernelTouched):
        rtnl.RtnlReader()  # shaperd's own path to it, through nlexchange.open_netlink
    _caught("socket(AF_NETLINK")


def test_other_sockets_still_work():
    a, b = socket.socketpair()
    with a, b, socket.socket(socket.AF_INET, socket.SOCK_DGRAM):
        a.send(b"x")
        assert b.recv(1) == b"x"
    assert GUARD.take() == []


def test_an_except_exception_does_not_hide_it_and_a_thread_is_seen_too():
    """shaperd's 'one backend never stops the others' catches Exception: the attempt is recorded all the same."""
    seen = []

    def backend():
        try:
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16)
        except Exception as e:  # noqa: BLE001 - what the engine does
            seen.append(e)
        except BaseException as e:  # noqa: BLE001 - KernelTouched lands here, not above
            seen.append(("base", type(e).__name__))

    t = threading.Thread(target=backend, name="a-backend")
    t.start()
    t.join(timeout=10)
    assert seen == [("base", "KernelTouched")]
    (attempt,) = GUARD.take()
    assert "thread a-backend" in attempt and "test_kernel_guard.py" in attempt  # the stack names the caller


def test_the_bpf_syscall_is_refused():
    with pytest.raises(KernelTouched, match="bpf"):
        bpf_maps._bpf(0, ctypes.c_uint32(0))
    _caught("bpf(2) syscall, command 0")
    nr, syscall = bpf._syscall()
    with pytest.raises(KernelTouched):
        syscall(ctypes.c_long(nr), ctypes.c_int(5))
    _caught("bpf(2) syscall, command 5")


def test_entering_or_unsharing_a_namespace_is_refused(tmp_path):
    (tmp_path / "netns").mkdir()
    (tmp_path / "netns" / "x").write_text("")
    with pytest.raises(KernelTouched):
        with netns.entered("x", str(tmp_path)):
            pass
    _caught("setns(2)")
    with pytest.raises(KernelTouched):
        probe.unshare_netns()
    _caught("unshare(2)")
    with pytest.raises(KernelError):  # no such namespace file: os.open fails before any setns
        with netns.entered("absent", str(tmp_path)):
            pass
    assert GUARD.take() == []


@pytest.mark.skipif(not os.path.exists("/usr/sbin/tc") and not os.path.exists("/sbin/tc"), reason="no tc")
def test_starting_the_installed_tc_is_refused_a_stand_in_is_not(tmp_path):
    with pytest.raises(KernelTouched, match="tc"):
        subprocess.run(["tc", "qdisc", "show"], capture_output=True, timeout=10)
    _caught("started /")
    stand_in = tmp_path / "tc"
    stand_in.write_text("#!/bin/sh\necho stand-in\n")
    stand_in.chmod(0o755)
    r = subprocess.run([str(stand_in)], capture_output=True, text=True, timeout=10)
    assert r.stdout == "stand-in\n" and GUARD.take() == []
