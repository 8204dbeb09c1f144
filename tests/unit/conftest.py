"""Unit tests never speak to the kernel.

Two layers:

* The probe's question to the kernel (kernel/kind_ask.py) gets no answer here,
  unless a test injects one. tests/unit/test_kind_ask.py tests the real
  function on fake sockets.
* A guard (``_no_kernel``, on for every unit test) makes any way into the host's
  kernel fail the test loudly: a netlink socket (``socket(AF_NETLINK, ...)``,
  seen by a Python audit hook, so pyroute2's sockets and ones opened in other
  threads count too), the bpf(2) syscall through ``kernel/bpf.py``'s ctypes
  handle, setns(2) through ``kernel/netns.py``, unshare(2) through
  ``kernel/probe.py``, and starting an installed tool that talks to the
  kernel (``ip``, ``tc``, ``devlink``, ...; a test's stand-in script of the
  same name in its tmp_path is fine). The call raises
  ``KernelTouched`` (a BaseException, so shaperd's ``except Exception`` that
  keeps one backend from stopping the others cannot swallow it), and the test
  fails at teardown with every attempt it made, even when something caught the
  exception or it happened in a thread.

A test that really needs the kernel belongs in tests/integration/ (root,
its own network namespaces). Decoders are tested on recorded bytes instead
(tests/unit/fixtures/*, each with the command that re-records it).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import traceback

import pytest

from shaperd.kernel import bpf, kind_ask, netns, probe

# Tools whose only job is to ask or change the kernel's network state: a unit test starting one touches the host.
KERNEL_TOOLS = frozenset({"ip", "tc", "devlink", "dcb", "rdma", "bridge", "ethtool", "bpftool", "modprobe", "insmod",
                          "rmmod", "sysctl", "nsenter", "unshare", "iperf3", "ping", "smpquery", "opensm", "ibsim"})
SYSTEM_BIN = frozenset(os.path.realpath(d) for d in ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin",
                                                      "/usr/local/sbin"))


class KernelTouched(BaseException):
    """A unit test reached the host's kernel (see this module's docstring)."""


class _Guard:
    def __init__(self):
        self.active = False
        self.lock = threading.Lock()
        self.attempts: list[str] = []

    def take(self) -> list[str]:
        """The attempts recorded since the last take (and forget them)."""
        with self.lock:
            out, self.attempts[:] = list(self.attempts), []
        return out

    def touched(self, what: str) -> None:
        where = "".join(traceback.format_stack(limit=12)[:-2])
        with self.lock:
            self.attempts.append(f"{what} (thread {threading.current_thread().name})\n{where}")
        raise KernelTouched(f"unit test reached the host's kernel: {what}; use recorded bytes or a fake, "
                            "or move the test to tests/integration/")


GUARD = _Guard()


def _audit(event: str, args) -> None:
    # Called for every audited event in the process: return at once unless a unit test runs and it is ours.
    if not GUARD.active:
        return
    if event == "socket.__new__":
        family = args[1]
        if family == socket.AF_NETLINK:
            GUARD.touched(f"socket(AF_NETLINK, {args[2]}, {args[3]})")
    elif event == "subprocess.Popen":
        argv = args[1]
        argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or [])
        if argv and os.path.basename(os.fsdecode(argv[0])) in KERNEL_TOOLS:
            env = args[3]
            path = env["PATH"] if isinstance(env, dict) and "PATH" in env else os.environ.get("PATH")
            exe = shutil.which(os.fsdecode(args[0] or argv[0]), path=path)
            # The installed tool, not a test's stand-in script of the same name in its tmp_path.
            if exe and os.path.dirname(os.path.realpath(exe)) in SYSTEM_BIN:
                GUARD.touched(f"started {exe}: {' '.join(map(os.fsdecode, argv))}")


sys.addaudithook(_audit)  # audit hooks cannot be removed; GUARD.active keeps it to unit tests


def _refuse_bpf():
    def syscall(*args):
        GUARD.touched(f"bpf(2) syscall, command {args[1].value if len(args) > 1 else '?'}")
    return 0, syscall


def _refuse_setns(fd: int) -> None:
    GUARD.touched("setns(2) into another network namespace")


def _refuse_unshare() -> None:
    GUARD.touched("unshare(2) of a new network namespace")


@pytest.fixture(autouse=True)
def _no_kernel(monkeypatch):
    orig_syscall, orig_setns, orig_unshare = bpf._syscall, netns._setns, probe.unshare_netns
    # Every module holding the ctypes entry points by name (kernel/bpf_maps.py imports bpf._syscall).
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("shaperd."):
            if getattr(mod, "_syscall", None) is orig_syscall:
                monkeypatch.setattr(mod, "_syscall", _refuse_bpf)
            if getattr(mod, "_setns", None) is orig_setns:
                monkeypatch.setattr(mod, "_setns", _refuse_setns)
            if getattr(mod, "unshare_netns", None) is orig_unshare:
                monkeypatch.setattr(mod, "unshare_netns", _refuse_unshare)
    GUARD.take()
    GUARD.active = True
    try:
        yield
    finally:
        GUARD.active = False
    attempts = GUARD.take()
    if attempts:
        pytest.fail(f"{len(attempts)} attempt(s) to reach the host's kernel from a unit test:\n\n"
                    + "\n".join(attempts), pytrace=False)


@pytest.fixture(autouse=True)
def _kernel_gives_no_answer(monkeypatch):
    monkeypatch.setattr(kind_ask, "ask", lambda kind, *a, **kw: kind_ask.KindAnswer(
        kind, kind_ask.NO_ANSWER, "not asked in unit tests"))
