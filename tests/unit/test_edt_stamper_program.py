"""The EDT stamper's bytecode is exactly the recorded one (tests/unit/fixtures/stamper/program.json).

Any change to an emitted instruction shows here as the first differing instruction, and a change
recorded without a new program version fails too: a running stamper of the old program would be
adopted as if it were the new one (objects.stamper_name hashes STAMPER_VERSION). The kernel loads
and runs the program in tests/integration/test_edt_stamper.py and, on Debian's 6.1, in the QEMU tier.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from shaperd.backends.edt.objects import STAMPER_VERSION

HERE = Path(__file__).parent / "fixtures" / "stamper"
FIXTURE = json.loads((HERE / "program.json").read_text())
sys.path.insert(0, str(HERE))
from record import CONFIGS, program  # noqa: E402


def _insns(code: bytes) -> list[str]:
    return [code[i:i + 8].hex() for i in range(0, len(code), 8)]


@pytest.mark.parametrize("name", sorted(FIXTURE["programs"]))
def test_the_program_is_byte_identical_to_the_recorded_one(name):
    rec = FIXTURE["programs"][name]
    want = bytes.fromhex(rec["program"])
    got = program(rec["fds"], rec["horizon_ns"])
    if got != want:
        g, w = _insns(got), _insns(want)
        first = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        pytest.fail(f"{name}: {len(g)} instructions, recorded {len(w)}; first difference at insn {first}: "
                    f"{g[first] if first < len(g) else 'end'} != {w[first] if first < len(w) else 'end'}")


# The program each version emits (fds-3-6_horizon-100ms), kept here and not in the recording: re-recording a
# changed program without a new STAMPER_VERSION fails below. A new version adds its line.
VERSIONS = {"shaperd-edt-stamper-v2": "62ebc41d8d5208668d4177b60027df7f72c6382c679f074ecde889bfb5502ef6"}


def test_the_recording_is_of_this_program_version_and_covers_every_configuration():
    assert FIXTURE["version"] == STAMPER_VERSION.decode()
    recorded = bytes.fromhex(FIXTURE["programs"]["fds-3-6_horizon-100ms"]["program"])
    assert hashlib.sha256(recorded).hexdigest() == VERSIONS.get(STAMPER_VERSION.decode()), (
        "the recorded program is not the one this STAMPER_VERSION was released with: bump the version "
        "(objects.py) and add its digest to VERSIONS")
    assert set(FIXTURE["programs"]) == set(CONFIGS)
    programs = {r["program"] for r in FIXTURE["programs"].values()}
    assert len(programs) == len(FIXTURE["programs"])  # each configuration changes the emitted bytes
