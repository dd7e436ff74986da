"""Shared fixtures: which implementation is live, CPU variants, Hypothesis profiles,
prometheus_client in multiprocess mode."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import kvest

_QUIET = [
    HealthCheck.too_slow, HealthCheck.data_too_large,
    # cpu_variant is set once per test and never mutated by the test body.
    HealthCheck.function_scoped_fixture,
]
# "ci" runs in .ci/run; "dev" (the default) is quicker for local edits.
settings.register_profile(
    "ci", max_examples=400, deadline=None, print_blob=True, suppress_health_check=_QUIET
)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=_QUIET)
# A few examples per test reach every code path: for runs that look for
# something other than wrong values (memory errors under valgrind, which runs
# everything ~50x slower; another Python version), since the value space is
# the "ci" profile's job.
settings.register_profile("quick", max_examples=25, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# kvest's kernels at every batch size, here and in the scheduler processes the
# tests start: the tests' batches are small, and a batch handed to upstream's
# statement would compare upstream with itself.  tests/test_sglang_handoff.py
# checks the handoff itself.
os.environ.setdefault("KVEST_SGLANG_HANDOFF", "0")
# kvest's code installed as the default build installs it, on every build (the
# public-API build leaves more to upstream, which would then be compared with
# itself): what each build itself installs is tests/test_sglang_builds.py's.
os.environ.setdefault("KVEST_SGLANG_DECIDE_AS", "default")


def _variants() -> list[str]:
    if kvest.IMPLEMENTATION != "cython":
        return ["python"]
    from kvest import _kernels

    return _kernels.cpu_variants()


CPU_VARIANTS = _variants()

if os.environ.get("KVEST_REQUIRE_COMPILED") and kvest.IMPLEMENTATION != "cython":
    raise pytest.UsageError(
        "KVEST_REQUIRE_COMPILED is set but the compiled kernels did not import "
        f"(kvest from {kvest.__file__})"
    )


def _optional(name: str) -> str:
    """The installed version of an optional test dependency, or "absent"."""
    from importlib import metadata

    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return f"{name} absent (its tests skip)"


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"kvest implementation: {kvest.IMPLEMENTATION} "
        f"(KVEST_PURE_PYTHON={os.environ.get('KVEST_PURE_PYTHON', '')!r})",
        f"kvest CPU variants under test: {', '.join(CPU_VARIANTS)}",
        f"hypothesis profile: {settings._current_profile}",
        "optional: " + ", ".join(_optional(name) for name in ("torch", "pandas", "sglang")),
    ]


@pytest.fixture(params=CPU_VARIANTS)
def cpu_variant(request: pytest.FixtureRequest):
    """Run a test once per CPU loop variant this machine supports."""
    if kvest.IMPLEMENTATION != "cython":
        yield request.param
        return
    from kvest import _kernels

    before = _kernels.cpu_variant()
    _kernels.set_cpu_variant(request.param)
    try:
        yield request.param
    finally:
        _kernels.set_cpu_variant(before)


@pytest.fixture
def multiproc(tmp_path, monkeypatch):
    """prometheus_client in multiprocess mode over a fresh directory (it picks
    its value class when imported: picked again here, as a freshly spawned
    scheduler process would); tests/metrics_readback.py reads it back."""
    from kvest._env import flag
    from kvest.sglang import metrics

    try:
        from prometheus_client import values
    except ImportError as exc:
        if flag("KVEST_REQUIRE_REAL_SGLANG"):
            raise RuntimeError("KVEST_REQUIRE_REAL_SGLANG is set but prometheus_client "
                               "does not import") from exc
        pytest.skip("prometheus_client is not installed")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("KVEST_METRICS_INTERVAL", "3600")  # tests sync by hand
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    metrics._forget()
    yield tmp_path
    metrics._forget()


@pytest.fixture(autouse=True)
def _no_first_report_kept():
    """Each test starts with no first shadow mismatch or kernel failure kept:
    the monitor logs and keeps only the first of each hot spot in a process,
    so what a test breaks on purpose is its own first, whatever ran before."""
    from kvest.sglang import monitor

    for spot in monitor.STATE.spots.values():
        spot.first_mismatch = spot.first_failure = None
    yield
