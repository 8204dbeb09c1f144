"""Run a command under a real seccomp filter that refuses bpf(2) with EPERM, as a container runtime's profile can.

``python tests/seccomp_deny.py CMD ARGS...`` sets PR_SET_NO_NEW_PRIVS, installs a classic-BPF seccomp
filter (SECCOMP_MODE_FILTER through prctl(PR_SET_SECCOMP)) that answers EPERM to bpf() on this
architecture and allows every other call, then execs CMD: the filter is inherited across the exec,
so CMD's /proc/self/status says ``Seccomp: 2`` and its bpf() fails with EPERM before the kernel's
bpf code sees it, whatever capabilities it holds. Nothing else is changed (ctypes only, no
libseccomp). Tests use it to prove that shaperd names the cause (kernel/probe.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# (AUDIT_ARCH_*, __NR_bpf) per machine: linux/audit.h, asm/unistd_64.h (x86_64) and asm-generic (aarch64).
ARCHES = {"x86_64": (0xC000003E, 321), "aarch64": (0xC00000B7, 280)}
OFF_NR, OFF_ARCH = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...


def program(arch: int, nr: int) -> bytes:
    """struct sock_filter[]: another architecture or another call is allowed; bpf() gets EPERM."""
    ins = [
        (BPF_LD_W_ABS, 0, 0, OFF_ARCH),
        (BPF_JEQ_K, 0, 3, arch),  # not this architecture: allow (jump to the last)
        (BPF_LD_W_ABS, 0, 0, OFF_NR),
        (BPF_JEQ_K, 0, 1, nr),  # not bpf: allow
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    arch, nr = ARCHES[platform.machine()]
    code = program(arch, nr)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = SockFprog(len(code) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    for args in ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0)):
        if libc.prctl(*[a if not isinstance(a, int) else ctypes.c_ulong(a) for a in args]) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl({args[0]}): {os.strerror(e)}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: seccomp_deny.py CMD [ARGS...]")
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
