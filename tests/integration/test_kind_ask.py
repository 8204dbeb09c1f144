"""The probe's question to the kernel (kernel/kind_ask.py) on this host's real kernel, in a fresh namespace:
it tells a known kind from an unknown one, and changes nothing on lo, whatever lo carries."""

from __future__ import annotations

import json

from .conftest import PY, needs_root

pytestmark = needs_root

ASK = "from shaperd.kernel import kind_ask; import sys; a = kind_ask.ask(sys.argv[1]); print(a.state); print(a.detail)"


def _lo(bed) -> list:
    return json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", "lo").stdout)


def _ask(bed, kind: str) -> tuple[str, str]:
    out = bed.exec(PY, "-c", ASK, kind).stdout.splitlines()
    return out[0], out[1]


def test_htb_is_known_fq_is_not_on_this_host_and_lo_is_left_as_it_was(bed):
    from shaperd.kernel.qdisc_kinds import ABSENT, evidence_all
    from shaperd.core.roots import Roots

    before = _lo(bed)
    assert [q["kind"] for q in before] == ["noqueue"], before
    state, detail = _ask(bed, "htb")
    assert state == "present" and "EINVAL" in detail, detail
    fq_here = evidence_all(Roots())["sch_fq"].state != ABSENT
    state, detail = _ask(bed, "fq")
    assert state == ("present" if fq_here else "absent"), detail
    if not fq_here:
        assert "ENOENT: Specified qdisc kind is unknown" in detail
    assert _lo(bed) == before  # nothing grafted, nothing replaced


def test_a_lo_carrying_someones_root_gets_no_answer_and_keeps_it(bed):
    bed.exec("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1")
    before = _lo(bed)
    state, detail = _ask(bed, "htb")
    assert state == "no answer" and "EEXIST" in detail, detail
    assert _lo(bed) == before and before[0]["kind"] == "htb" and before[0]["handle"] == "1:"


def test_with_net_admin_only_the_question_is_answered(bed):
    r = bed.exec("setpriv", "--bounding-set=-all,+net_admin", "--inh-caps=-all", PY, "-c", ASK, "htb", check=False)
    assert r.stdout.splitlines()[0] == "present", r.stdout + r.stderr
