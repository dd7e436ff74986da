"""pytest-benchmark suite: `pytest bench --benchmark-only` (CI: --benchmark-disable)."""

from __future__ import annotations

import pytest

import kvest


def pytest_report_header(config: pytest.Config) -> list[str]:
    from kvest._bench.timing import machine

    return [f"kvest benchmarks on {machine()}"]


@pytest.fixture(autouse=True, scope="session")
def _announce_implementation():
    assert kvest.IMPLEMENTATION in ("cython", "python")
