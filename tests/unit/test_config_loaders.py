"""Both YAML loaders (libyaml's parser under the Python composer, and pure-Python SafeLoader) give the
same answers on the bad-input corpus: the same accept/refuse, the same Config when accepted, the same
problem paths and messages when refused. Syntax errors are worded by each parser in its own way, so for
those the kind ("not valid YAML") and the line must match (libyaml may name the line after the last
one for an error at the end of the stream). Also: the tenant-count limit refuses while
composing, on the line of the first tenant over, in both."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from shaperd.core.config import limits as config_limits
from shaperd.core.config import load_text, yamlbuild, yamldoc
from shaperd.core.errors import ConfigError
from tests.fuzz_inputs import GOOD_TENANTS, tenants_texts

pytestmark = pytest.mark.skipif(yamldoc.FastLoader is yamldoc.PyLoader, reason="PyYAML built without libyaml")

LAUGHS = "\n".join(['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] +
                   [f"a{i}: &a{i} [{','.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, 10)]) + "\ntenants: *a9\n"

CORPUS = [
    GOOD_TENANTS, "", "tenants: []", "tenants:\n- {name: a, bandwidthGuarantee: 1Mbps}\n- {name: a, bandwidthGuarantee: 1Mbps}",
    "a: 1\na: 2\n", "tenants: {x: 1, x: 2}", "? []\n: 1", "{1: a, 0x1: b}", "[" * 5000 + "]" * 5000,
    "a: " + "[" * 100_000, "{" * 3000 + "}" * 3000, LAUGHS, "a: *nope", "a: &x [*x]", "a: \x01", "tenants: [\x7f]",
    "\ufeffnode: {interfaces: [eth0]}", "a: 'unterminated", "a: [1, 2", "a:\n\tb: 1", "- a\nb: c", "%YAML 1.1\n---\na: 1",
    "--- a\n--- b\n", "!!python/object:os.system ls", "a: !!binary AAA=", "key: @x", "a: b: c", "{a: 1}}",
    "apiVersion: v1\nkind: ConfigMap\ndata:\n  traffic-shaping.yaml: 'tenants: [1, 1'\n", "\x00", "a: \ud7ff\ue000",
]


def _outcome(text: str, loader) -> tuple:
    saved = yamldoc.FastLoader
    yamldoc.FastLoader = loader
    try:
        cfg = load_text(text, "t.yaml")
    except ConfigError as e:
        return ("refused", [(p.path, p.message) for p in e.problems])
    finally:
        yamldoc.FastLoader = saved
    return ("accepted", cfg)


# The one known difference: PyYAML's scanner refuses a tab after a plain scalar ("0\t", "a: b\t"), which
# YAML 1.1 allows and libyaml accepts. The fallback is the stricter one there; test_known_tab_difference.
PY_TAB = "found character '\\t' that cannot start any token"


def _same(text: str) -> None:
    fast, slow = _outcome(text, yamldoc.FastLoader), _outcome(text, yamldoc.PyLoader)
    if slow[0] == "refused" and any(PY_TAB in m for _, m in slow[1]):
        return
    assert fast[0] == slow[0], (text[:200], fast, slow)
    if fast[0] == "accepted" or fast[1] == slow[1]:
        assert fast[1] == slow[1]
        return
    # Only syntax errors may be worded differently, and then each names the same line.
    assert len(fast[1]) == len(slow[1]) == 1, (fast, slow)
    (fpath, fmsg), (spath, smsg) = fast[1][0], slow[1][0]
    assert fmsg.startswith("not valid YAML") and smsg.startswith("not valid YAML"), (text[:200], fast, slow)
    # libyaml marks an error at the end of the stream one line later than PyYAML does ('0:\n0', "a: 'x").
    line = lambda path: int(path.split(",")[0].split()[-1]) if path.split(",")[0].split() else 0  # noqa: E731
    assert abs(line(fpath) - line(spath)) <= 1, (text[:200], fast, slow)


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_both_loaders_same_answer_on_corpus(text):
    _same(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(tenants_texts)
def test_both_loaders_same_answer_on_fuzz(text):
    _same(text)


def test_fast_loader_is_libyaml_and_guarded():
    from yaml.cyaml import CParser
    assert issubclass(yamldoc.FastLoader, CParser) and not issubclass(yamldoc.PyLoader, CParser)
    for loader in (yamldoc.FastLoader, yamldoc.PyLoader):  # both build from events, under every guard
        assert loader.__mro__[1] is yamlbuild.EventBuilder
        assert not issubclass(loader, yaml.composer.Composer)


# Valid YAML on which the event builder must give what PyYAML's own SafeLoader gives (its composer and
# constructor, the reference): scalars of every implicit type, explicit tags, anchors shared and recursive,
# the collection tags SafeConstructor knows, keys that are not strings, several documents.
VALID = [
    GOOD_TENANTS, "", "a: 1", "- 1\n- 0x1f\n- 0o17\n- 1_000\n- 1.5e3\n- .inf\n- -.Inf\n- .nan\n- ~\n- null\n- true\n- no\n- Off",
    "t: 2001-12-14\nts: 2001-12-14t21:59:43.10-05:00\nb: !!binary aGVsbG8=\ns: !!str 12\ni: !!int '7'\nf: !!float '1'",
    "a: &x {b: [1, 2]}\nc: *x\nd: [*x, *x]", "a: &x [1, *x]", "a: &m {k: *m}", "s: !!set {a, b, ? c}",
    "o: !!omap [{a: 1}, {b: 2}]", "p: !!pairs [{a: 1}, {a: 2}]", "{1: a, 2.5: b, null: c, true: d, [1, 2]: e}"[:25] + "}",
    "? !!str 1\n: x\n? 1\n: y", "a: 'x'\nb: \"y\\n\"\nc: |\n  lit\n  eral\nd: >\n  fol\n  ded\n", "- - - - deep",
    "a: !!map {b: 1}\nc: !!seq [1]", "! a: ! b", "%YAML 1.1\n---\na: 1\n...\n", "a: 1 # comment\n# end",
]
# Refused by both, for the reason PyYAML gives (the builder words these as PyYAML does).
INVALID = ["a: !!str {b: 1}", "a: !!map [1]", "a: !!seq {b: 1}", "a: !!omap {b: 1}", "a: !!omap [1]",
           "a: !!omap [{b: 1, c: 2}]", "a: !foo {b: 1}", "a: !foo 1", "a: *nope", "a: &x 1\nb: &x 2",
           "--- a\n--- b\n"]


@pytest.mark.parametrize("text", VALID, ids=range(len(VALID)))
@pytest.mark.parametrize("loader", ["fast", "py"])
def test_same_data_as_pyyaml_safeloader(text, loader):
    mine = yaml.load(text, Loader=yamldoc.FastLoader if loader == "fast" else yamldoc.PyLoader)  # noqa: S506
    ref = yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506
    assert repr(mine) == repr(ref)  # repr: equal also where nan != nan and for recursive structures
    assert list(yaml.load_all(text, Loader=yamldoc.PyLoader)) != [] or text.strip() in ("",)  # noqa: S506


@pytest.mark.parametrize("text", INVALID, ids=range(len(INVALID)))
@pytest.mark.parametrize("loader", ["fast", "py"])
def test_same_refusal_as_pyyaml_safeloader(text, loader):
    with pytest.raises(yaml.YAMLError) as ref:
        yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506
    with pytest.raises(yaml.YAMLError) as mine:
        yaml.load(text, Loader=yamldoc.FastLoader if loader == "fast" else yamldoc.PyLoader)  # noqa: S506
    assert mine.value.problem == ref.value.problem
    assert mine.value.problem_mark.line == ref.value.problem_mark.line


@pytest.mark.parametrize("text", ["a: !!int x", "a: !!float x", "a: !!timestamp x", "a: !!bool x"])
@pytest.mark.parametrize("loader", ["fast", "py"])
def test_a_scalar_its_tag_cannot_read_is_a_yaml_error_with_its_line(text, loader, monkeypatch):
    # PyYAML's own SafeLoader raises ValueError or AttributeError here: a traceback, not a YAML error.
    monkeypatch.setattr(yamldoc, "FastLoader", yamldoc.FastLoader if loader == "fast" else yamldoc.PyLoader)
    with pytest.raises(ConfigError) as ei:
        load_text("tenants: []\n" + text, "t.yaml")
    (p,) = ei.value.problems
    assert p.path == "line 2, column 4" and p.message.startswith("not valid YAML: cannot read 'x' as tag:yaml.org,2002:")


def test_several_documents_as_pyyaml_gives_them():
    text = "a: 1\n---\n- x\n---\n...\n--- &r [*r]\n"
    for loader in (yamldoc.FastLoader, yamldoc.PyLoader):
        assert repr(list(yaml.load_all(text, Loader=loader))) == repr(list(yaml.load_all(text, Loader=yaml.SafeLoader)))  # noqa: S506


def test_no_node_graph_is_kept(monkeypatch):
    """The point of the builder: a mapping or sequence never becomes a Node (scalars of a non-str tag
    are wrapped one at a time, for SafeConstructor, and dropped)."""
    made = []
    for cls in (yaml.MappingNode, yaml.SequenceNode):
        monkeypatch.setattr(cls, "__init__", lambda self, *a, **k: made.append(a))
    data = yaml.load(GOOD_TENANTS, Loader=yamldoc.FastLoader)  # noqa: S506
    assert data["tenants"] and made == []


@pytest.mark.parametrize("loader", ["fast", "py"])
@pytest.mark.parametrize("flow", [True, False])
def test_tenant_count_refused_while_composing_at_the_first_over(monkeypatch, loader, flow):
    monkeypatch.setattr(config_limits, "MAX_TENANTS", 3)
    monkeypatch.setattr(yamldoc, "FastLoader", yamldoc.FastLoader if loader == "fast" else yamldoc.PyLoader)
    item = "- {{name: t{i}, bandwidthGuarantee: 1Mbps}}" if flow else "- name: t{i}\n  bandwidthGuarantee: 1Mbps"
    # After the 4th tenant the file is broken: a refusal while composing never reaches it.
    text = "tenants:\n" + "\n".join(item.format(i=i) for i in range(4)) + "\n- [unclosed\n"
    with pytest.raises(ConfigError) as ei:
        load_text(text, "t.yaml")
    (p,) = ei.value.problems
    assert p.path == "tenants" and "more than 3 tenants" in p.message
    assert f"starts on line {5 if flow else 8}" in p.message
    # Three tenants are accepted, as is a 'tenants' list nested deeper than the root.
    ok = "tenants:\n" + "\n".join(item.format(i=i) for i in range(3)) + "\n"
    assert len(load_text(ok, "t.yaml").tenants) == 3


def test_known_tab_difference():
    text = GOOD_TENANTS.replace("priority: 100\n", "priority: 100\t\n")
    fast, slow = _outcome(text, yamldoc.FastLoader), _outcome(text, yamldoc.PyLoader)
    assert slow[0] == "refused" and PY_TAB in slow[1][0][1]
    assert fast[0] == "accepted"
