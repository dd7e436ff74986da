"""What SGLang's /metrics serves of kvest's series, read back in a test (the
``multiproc`` fixture, tests/conftest.py, sets prometheus_client up)."""

from __future__ import annotations


def read_back(directory):
    """What SGLang's /metrics serves: every process's files, collected."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect() for s in family.samples
            if s.name.startswith("kvest_")}


def calls(hotspot, answer):
    return ("kvest_calls_total", (("answer", answer), ("hotspot", hotspot)))
