"""A failure inside a kernel is never silent: an exception that is none of the
kernel's declines is counted per hot spot (``status()``, the metrics), the
first of each hot spot logged with what reproduces it, and upstream's
statement answers, as after a decline.  A decline stays a plain fallback.

On stand-in modules built from the newest release at hand, through
``patch()``, with kvest's kernel swapped for one that fails.
"""

from __future__ import annotations

import logging

import pytest
from sglang_releases import check_required, releases
from sglang_standins import request_class

import kvest
import kvest.sglang
from kvest.sglang import glue, metrics, monitor
from kvest.sglang.readout import render
from kvest.sglang.upstream import Config, standin_tree

check_required(releases())
if not releases():
    pytest.skip("no sglang release available", allow_module_level=True)
NEWEST = releases()[-1]
ESTIMATE = "new_tokens_required_next_decode"


class KernelBug(RuntimeError):
    pass


def _failing(error):
    def kernel(*args, **kwargs):
        raise error
    return kernel


def _answers(error, monkeypatch, caplog, calls=3):
    """The estimate's answers, upstream's and kvest's (its no-spec kernel
    raising ``error``), the hot spot's status entry before and after ``calls``
    calls, and the status table then."""
    monkeypatch.setattr(kvest, "decode_new_tokens_from_reqs", _failing(error))
    with standin_tree(NEWEST) as tree:
        tree.config = Config(None, 3, 1, 4, 16)
        make = request_class(tree.layout())
        batch = tree.batch([make(c, c + 3) for c in (5, 16, 31, 32, 128)], 16, None)
        original = vars(tree.batch_class)[ESTIMATE]
        expected = original(batch)
        before = dict(kvest.sglang.status()["hotspots"][ESTIMATE])
        with kvest.sglang.patch(), \
                caplog.at_level(logging.WARNING, logger="kvest.sglang"):
            hooked = vars(tree.batch_class)[ESTIMATE]
            assert hooked is not original
            got = [hooked(batch) for _ in range(calls)]
            report = kvest.sglang.status()
    return expected, got, before, report["hotspots"][ESTIMATE], render(report)


def test_a_kernel_failure_is_counted_logged_once_and_upstream_answers(monkeypatch, caplog):
    expected, got, before, after, table = _answers(KernelBug("injected"), monkeypatch,
                                                  caplog)
    assert got == [expected] * 3
    assert after["failures"] - before["failures"] == 3
    assert after["fallbacks"] - before["fallbacks"] == 3  # each also a fallback
    assert after["kernel"] == before["kernel"]
    logged = [r for r in caplog.records if "a kernel failed" in r.getMessage()]
    assert len(logged) == (0 if before["first_failure"] else 1)  # the first only
    report = after["first_failure"]
    assert "KernelBug: injected" in report and "(5, 8)" in report  # what reproduces it
    if logged:
        assert logged[0].exc_info[0] is KernelBug  # with its traceback
        assert ESTIMATE in logged[0].getMessage()
    assert "kernel failures: " in table
    assert metrics._counters(after)["failures"] == after["failures"]


@pytest.mark.parametrize("error", [kvest.ImpureRequest("reqs[0]"), AttributeError("kv"),
                                   ValueError("negative"), OverflowError("int64"),
                                   TypeError("float"), IndexError("indices")])
def test_a_decline_is_a_fallback_not_a_failure(error, monkeypatch, caplog):
    expected, got, before, after, table = _answers(error, monkeypatch, caplog)
    assert got == [expected] * 3
    assert after["fallbacks"] - before["fallbacks"] == 3
    assert after["failures"] == before["failures"]
    assert not [r for r in caplog.records if "a kernel failed" in r.getMessage()]
    assert ("kernel failures: " in table) is bool(after["failures"])


def test_the_compiled_glue_tells_every_exception_to_its_hook():
    """The compiled glue (where the build has it) hands each exception its
    walk raised to the hook glue.py gives it, which counts those no decline."""
    if not glue._COMPILED:
        pytest.skip("the pure-Python build has no compiled glue")
    seen = []
    compiled = glue._COMPILED[kvest.decode_new_tokens_from_reqs](
        glue.DECLINED, monitor.STATE, lambda: None, sum, "nested")
    compiled.failed = lambda error, args: seen.append((type(error), args))
    reqs = [object()]  # no .kv: the kernel's AttributeError, a decline
    assert compiled.run(reqs, 16, sum) is glue.DECLINED
    assert seen == [(AttributeError, (reqs,))]


def test_kernel_failed_never_raises_on_arguments_that_cannot_be_shown():
    class Unreadable:
        def __getattr__(self, name):
            raise KernelBug("reading me fails")

    entry = monitor.spot(ESTIMATE)
    before = entry.failures
    monitor.kernel_failed(ESTIMATE, len, KernelBug("x"), ([Unreadable()],))
    assert entry.failures == before + 1
