"""Record what iproute2's ``dcb`` sends, as fixtures for shaperd's DCB encoder (kernel/dcb.py).

Re-record as root (needs gcc, strace, iproute2's dcb):

    .venv/bin/python -m tests.dcb_record tests/unit/fixtures/dcb

In a fresh network namespace with a veth (deleted afterwards, however it
ends), each command of ``COMMANDS`` runs under
``strace -f -e trace=sendmsg,sendto -e write=all -xx``. A veth has no DCB
ops: the kernel answers dcb's first request (an IEEE_GET, read before every
write) with EOPNOTSUPP and dcb would stop there. So ``dcb_fake_answers.c``
(LD_PRELOAD) answers dcb's reads with an all-zero configuration; every
request still reaches the kernel unchanged and strace shows its bytes. The
SET message is the fixture; the GET before it is compared too. ``uapi_layout.json``
is what the C compiler says about the structs' offsets and sizes (``uapi_layout.c``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests import procs

NETNS = "shaperd-dcbrec"
DEV = "dcbva"
# fixture name -> dcb arguments after the device (the settings tests/unit/test_dcb_bytes.py encodes)
COMMANDS = {
    "ets_set": ["ets", "set", "dev", DEV, "tc-tsa", "all:ets", "tc-bw", "0:10", "1:60", "2:30", "3:0", "4:0", "5:0",
                "6:0", "7:0", "prio-tc", "0:0", "1:1", "2:2", "3:3", "4:4", "5:5", "6:6", "7:7"],
    # iproute2 6.1 sends get_rate64()'s bytes/s as they are, where the uapi wants kbit/s (later iproute2
    # divides by 125). So "Nbps" (N bytes/s in tc's units) makes 6.1 send N: the kbit/s shaperd sends.
    "maxrate_set": ["maxrate", "set", "dev", DEV, "tc-maxrate", "0:0", "1:10000000bps", "2:2500000bps", "3:0",
                    "4:0", "5:0", "6:0", "7:1bps"],
    # The same rates written in kbit: what 6.1 then sends is 125 times too large (the test shows it).
    "maxrate_set_kbit": ["maxrate", "set", "dev", DEV, "tc-maxrate", "0:0", "1:10000000kbit", "2:2500000kbit",
                         "3:0", "4:0", "5:0", "6:0", "7:1kbit"],
    "app_add": ["app", "add", "dev", DEV, "dscp-prio", "26:1", "24:2", "18:3"],
}


def record(out: Path) -> None:
    src = Path(__file__).parent / "unit" / "fixtures" / "dcb" / "dcb_fake_answers.c"
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "dcb_fake_answers.so"
        procs.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(src), "-ldl"], timeout_s=60)
        layout = Path(tmp) / "uapi_layout"
        procs.run(["gcc", "-o", str(layout), str(src.with_name("uapi_layout.c"))], timeout_s=60)
        (out / "uapi_layout.json").write_text(procs.run([str(layout)], timeout_s=10).stdout)
        procs.run(["ip", "netns", "add", NETNS], timeout_s=10)
        try:
            procs.run(["ip", "-n", NETNS, "link", "add", DEV, "type", "veth", "peer", "name", DEV + "p"], timeout_s=10)
            for name, args in COMMANDS.items():
                argv = ["ip", "netns", "exec", NETNS, "strace", "-f", "-e", "trace=sendmsg,sendto", "-e", "write=all",
                        "-xx", "-E", f"LD_PRELOAD={so}", "dcb", *args]
                res = procs.run(argv, timeout_s=30)  # strace writes to stderr, as tests/strace_dump.py reads it
                (out / f"{name}.strace").write_text(res.stderr)
                (out / f"{name}.cmd").write_text("dcb " + " ".join(args) + "\n")
        finally:
            procs.run(["ip", "netns", "del", NETNS], timeout_s=10, check=False)


if __name__ == "__main__":
    record(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/unit/fixtures/dcb"))
