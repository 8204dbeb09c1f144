"""The map classifier's bytecode is exactly the recorded one (tests/unit/fixtures/classifier/program.json).

The fixture was recorded from classifier_program before it was split into
named steps; any change to an emitted instruction shows here as the first
differing instruction. The kernel loads and runs the program in
tests/integration/test_bpf_classify_run.py and test_map_classifier.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shaperd.backends.common.kernel_classifier import classifier_program
from shaperd.backends.common.mapcls import ROLES

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "classifier" / "program.json").read_text())


def _insns(code: bytes) -> list[str]:
    return [code[i:i + 8].hex() for i in range(0, len(code), 8)]


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_the_program_is_byte_identical_to_the_recorded_one(name):
    rec = FIXTURE[name]
    want = bytes.fromhex(rec["program"])
    got = classifier_program(rec["fds"], rec["mark_mask"])
    if got != want:
        g, w = _insns(got), _insns(want)
        first = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        pytest.fail(f"{name}: {len(g)} instructions, recorded {len(w)}; first difference at insn {first}: "
                    f"{g[first] if first < len(g) else 'end'} != {w[first] if first < len(w) else 'end'}")


def test_the_fixture_covers_every_role_and_differs_where_the_inputs_do():
    assert all(set(r["fds"]) == set(ROLES) for r in FIXTURE.values())
    programs = {r["program"] for r in FIXTURE.values()}
    assert len(programs) == len(FIXTURE)  # each configuration changes the emitted bytes
