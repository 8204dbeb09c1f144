"""Editing OpenSM's options file: only shaperd's qos keys change, every other line stays byte for byte.

fixtures/opensm/opensm-3.3.23.conf is the file OpenSM writes with every
option at its default (recreate: ``opensm -c tests/unit/fixtures/opensm/opensm-3.3.23.conf``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shaperd.rdma import opensm
from shaperd.rdma.opensm_file import OptionsFileError, merge, option_key

GENERATED = (Path(__file__).parent / "fixtures" / "opensm" / "opensm-3.3.23.conf").read_text()
BLOCK = f"{opensm.BEGIN_MARK} (test)\nqos TRUE\nqos_sl2vl 0,1,2,2,2,2,2,2,2,2,2,2,2,2,2,2\n{opensm.END_MARK}\n"
OTHER = f"{opensm.BEGIN_MARK} (test)\nqos TRUE\nqos_sl2vl 1,0,2,2,2,2,2,2,2,2,2,2,2,2,2,2\n{opensm.END_MARK}\n"


def test_option_key_is_read_like_opensm():
    assert option_key("qos_sl2vl 0,1\n") == "qos_sl2vl"
    assert option_key("  \tqos TRUE  # on\n") == "qos"
    assert option_key("# qos TRUE\n") is None and option_key("\n") is None
    assert option_key("qos#TRUE") == "qos"
    assert option_key("qos_sw0_max_vls=2") == "qos_sw0_max_vls=2"  # OpenSM splits on blanks only: not a qos key


def test_a_generated_file_keeps_every_other_line_and_loses_only_owned_keys():
    m = merge(GENERATED, BLOCK)
    old = GENERATED.splitlines(keepends=True)
    owned = [(i + 1, option_key(l)) for i, l in enumerate(old) if option_key(l) in opensm.OWNED_KEYS]
    assert m.replaced == tuple(owned) and len(owned) == 21  # qos + 5 keys x (default, ca, sw0, swe)
    first = owned[0][0] - 1
    expected = [l for l in old if option_key(l) not in opensm.OWNED_KEYS]
    expected.insert(first, BLOCK)
    assert m.text == "".join(expected)
    assert "qos_policy_file /etc/opensm/qos-policy.conf\n" in m.text and "qos_rtr_sl2vl (null)\n" in m.text
    assert m.kept == len(old) - 21 and not m.previous_block


def test_a_second_merge_replaces_the_block_in_place_and_is_idempotent():
    once = merge(GENERATED, BLOCK).text
    assert merge(once, BLOCK).text == once
    m = merge(once, OTHER)
    assert m.previous_block and m.replaced == ()
    assert m.text == once.replace(BLOCK, OTHER)


def test_owned_keys_outside_the_block_are_removed_even_after_it():
    text = "a 1\r\n" + BLOCK + "qos_ca_sl2vl 9\n" + "b 2"
    m = merge(text, OTHER)
    assert m.text == "a 1\r\n" + OTHER + "b 2" and m.replaced == ((6, "qos_ca_sl2vl"),)


def test_no_owned_key_appends_with_a_newline_before():
    assert merge("", BLOCK).text == BLOCK
    assert merge("sweep_interval 10", BLOCK).text == "sweep_interval 10\n" + BLOCK


@pytest.mark.parametrize("text,problem", [
    (f"x 1\n{opensm.BEGIN_MARK}\nqos TRUE\n", "line 2: shaperd's begin marker has no end marker"),
    (f"{opensm.END_MARK}\n", "line 1: a shaperd end marker without its begin marker"),
    (BLOCK + BLOCK, "line 5: a second shaperd block"),
    (f"{opensm.BEGIN_MARK}\n{opensm.BEGIN_MARK}\n{opensm.END_MARK}\n", "line 2: a second shaperd begin marker"),
])
def test_damaged_markers_are_refused_with_the_line(text, problem):
    with pytest.raises(OptionsFileError, match=problem):
        merge(text, BLOCK, name="opensm.conf")
