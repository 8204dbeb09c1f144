"""Bad input, fixed budget (issue 14): hypothesis over the tenants file loader, pod objects,
pod-resources replies, pod bandwidth annotations and the ingress block (tests/fuzz_inputs.py). Each input is accepted or refused with the typed error,
in bounded time; no other exception. bench/fuzz.py runs the same properties far longer.

The budget: SHAPERD_FUZZ_EXAMPLES (default 200) examples per property, derandomized so CI is repeatable.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from shaperd.core.roots import Roots
from tests import fuzz_inputs as fz

BUDGET = settings(max_examples=int(os.environ.get("SHAPERD_FUZZ_EXAMPLES", "200")), deadline=None,
                  derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@BUDGET
@given(fz.tenants_texts)
def test_tenants_loader_accepts_or_raises_config_error(text):
    fz.check_tenants_text(text)


@BUDGET
@given(fz.pod_objects)
def test_pod_objects_parse_or_raise_pod_parse_error(obj):
    fz.check_pod_object(obj)


@BUDGET
@given(fz.pod_resources_bytes)
def test_pod_resources_replies_are_used_or_refused(data):
    fz.check_pod_resources_bytes(data, Roots.of(sys="/nonexistent-sysfs"))


@BUDGET
@given(fz.pod_resources_messages)
def test_pod_resources_messages_skip_bad_elements_naming_the_pod(msg):
    fz.check_pod_resources_message(msg, Roots.of(sys="/nonexistent-sysfs"))


@BUDGET
@given(fz.annotated_pods)
def test_pod_annotations_are_caps_in_bounds_or_refusals_with_a_reason_and_move_no_pod(pairs):
    fz.check_annotated_pods(pairs)


@BUDGET
@given(fz.ingress_texts)
def test_ingress_blocks_are_refused_or_keep_every_admission_rule(text):
    fz.check_ingress_text(text)


def test_the_annotation_and_ingress_properties_can_fail():
    """Good values are accepted, bad ones refused; and a check that sees a moved pod fails."""
    import pytest

    assert fz.check_annotated_pods([("100M", "50M")]) == "accepted"
    assert fz.check_annotated_pods([("fast", 100), ("9" * 5000, ["x"])]) == "refused"
    good = fz._yaml_dump({"node": {"capacity": "10Gbps"}, "tenants": [
        {"name": "tenant-a", "bandwidthGuarantee": "4Gbps", "ingress": {"bandwidthLimit": "1Gbps"}},
        {"name": "tenant-c", "bandwidthGuarantee": "1Gbps"}]})
    assert fz.check_ingress_text(good) == "accepted"
    assert "bandwidthLimit: 1Gbps" in good
    assert fz.check_ingress_text(good.replace("bandwidthLimit: 1Gbps", "bandwidthLimit: 20Gbps")) == "refused"
    real = fz._tenancy
    try:  # a tenancy that moved a steady pod out of its tenant must be caught
        def moved(wires):
            t = real(wires)
            if any(w.get("metadata", {}).get("annotations") for w in wires if w["metadata"]["name"].startswith("f-")):
                t.pod_tenants.pop(next(iter(t.pod_tenants)))
            return t
        fz._tenancy = moved
        with pytest.raises(AssertionError):
            fz.check_annotated_pods([("fast", fz.ABSENT)])
    finally:
        fz._tenancy = real


def test_the_properties_can_fail():
    """The checks are not vacuous: the good inputs are accepted, and an error of another type escapes."""
    import pytest

    assert fz.check_tenants_text(fz.GOOD_TENANTS) == "accepted"
    assert fz.check_tenants_text("tenants: [") == "refused"
    assert fz.check_pod_object(fz.GOOD_POD) == "accepted"
    assert fz.check_pod_object({"metadata": 3}) == "refused"
    with pytest.raises(AttributeError):
        fz.check_pod_resources_message(object(), Roots.of(sys="/nonexistent-sysfs"))
