"""Which failures the daemon retries with backoff: transient kernel answers yes, permanent refusals no."""

from __future__ import annotations

import errno

from shaperd.backends.htb import ops as htb
from shaperd.daemon.service import _worth_retrying
from shaperd.engine.reconciler import BackendOutcome, PlanResult, Report, TargetOutcome

OP = htb.DeleteClass(device="up0", ifindex=3, classid=0x73680010)


def report(*targets: TargetOutcome) -> Report:
    return Report(PlanResult(), [BackendOutcome("htb", targets=list(targets))])


def failed(code: int) -> TargetOutcome:
    return TargetOutcome("htb", "up0", failed=[(OP, OP.error("x", code))])


def test_permanent_refusals_are_not_retried_with_backoff():
    assert not _worth_retrying(report(failed(errno.EPERM), failed(errno.EINVAL)))


def test_a_transient_failure_anywhere_is_retried():
    for code in (errno.EBUSY, errno.ENOBUFS, errno.ETIMEDOUT, errno.EINTR):
        assert _worth_retrying(report(failed(errno.EPERM), failed(code))), code


def test_a_device_that_could_not_be_read_is_retried():
    assert _worth_retrying(report(TargetOutcome("htb", "up0", error="dump classes on up0: interrupted 4 times")))
