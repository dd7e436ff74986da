"""Whether kvest installs a hot spot is decided per build, from that build's own
counts (the registry's :class:`~kvest.sglang.registry.Cost` per
:class:`~kvest.sglang.registry.Build`): on no build is a statement or function
installed whose kvest code takes more instructions than upstream's at every
size measured, and one with a crossover only from that crossover on.

The public-API build (``KVEST_PUBLIC_API_ONLY=1``, every Python newer than
3.13) takes several times the default build's instructions in its request
kernels: there ``alloc_for_decode_default``'s adding loop (about 2,000
instructions a request against upstream's 786) is upstream's, and ``status()``
says so, with the registry's figures."""

from __future__ import annotations

import pytest
from sglang_releases import check_required, releases

import kvest
import kvest.sglang
from kvest._names import ARRAY_FUNCTIONS
from kvest.sglang import monitor, patterns, registry
from kvest.sglang.registry import KINDS, Build
from kvest.sglang.upstream import standin_tree

check_required(releases())


def test_every_kind_kvest_installs_has_each_builds_figures():
    """A kind whose kernel reads requests has a Cost for every build (the build
    switch changes how requests are read); only the array kernels' kinds,
    which no build switch changes, and the helpers, never replaced, have none."""
    for kind in KINDS.values():
        if kind.function is None or kind.function.name in ARRAY_FUNCTIONS:
            assert kind.costs is None or set(kind.costs) == set(Build), kind.name
            continue
        assert kind.costs is not None and set(kind.costs) == set(Build), kind.name
        for build, cost in kind.costs.items():
            # left to upstream exactly where kvest is below upstream at no size
            assert bool(kind.slower(build)) == (cost.below is None), (kind.name, build)
            if cost.below is None:  # (else it says why, with its own figures)
                assert cost.kvest > cost.upstream or cost.why, (kind.name, build)


def test_the_installed_build_decides(monkeypatch):
    monkeypatch.setattr(registry, "DECIDING", None)
    monkeypatch.delenv(registry.DECIDE_AS_ENV, raising=False)
    public = kvest.IMPLEMENTATION == "cython" and kvest._reqs._PUBLIC_API_ONLY  # type: ignore[attr-defined]
    assert registry.installed_build() is (Build.PUBLIC_API if public else Build.DEFAULT)
    assert registry.deciding_build() is registry.installed_build()
    for kind in KINDS.values():
        assert kind.upstream_faster == kind.slower(registry.installed_build())
        assert kind.upstream_below == kind.below(registry.installed_build())
    monkeypatch.setenv(registry.DECIDE_AS_ENV, "public API")
    assert registry.deciding_build() is Build.PUBLIC_API
    monkeypatch.setattr(registry, "DECIDING", Build.DEFAULT)
    assert registry.deciding_build() is Build.DEFAULT


def test_the_public_api_figures_leave_the_adding_loop_to_upstream():
    """The issue's own numbers: on the public-API build the adding loop is
    slower than upstream's at every size, on the default build from 16 on it is not."""
    kind = KINDS["add_lengths_loop"]
    assert kind.slower(Build.PUBLIC_API) and not kind.slower(Build.DEFAULT)
    cost = kind.costs[Build.PUBLIC_API]
    assert f"{cost.kvest:,}" in kind.slower(Build.PUBLIC_API)
    assert f"{cost.upstream:,}" in kind.slower(Build.PUBLIC_API)
    assert kind.below(Build.DEFAULT) == 16


def _kinds_of(target) -> list[str]:
    ids = {p.id: p.kind for p in patterns.load()}
    return [ids[entry.split(" ")[0]] for entry in target.new.__kvest_patterns__]


@pytest.fixture(params=list(Build), ids=str)
def build(request, monkeypatch):
    monkeypatch.setattr(registry, "DECIDING", request.param)
    monkeypatch.delenv("KVEST_SGLANG_HANDOFF", raising=False)  # as a scheduler runs
    return request.param


@pytest.mark.parametrize("release", releases(), ids=lambda t: t.version)
def test_no_hot_spot_is_installed_slower_than_upstream(build, release):
    """patch()'s plan against the registry's figures for ``build``: every kind
    installed is below upstream from some size on, and its glue hands smaller
    batches to upstream's statement; every kind left for speed is in its hot
    spot's notes, with the numbers."""
    with standin_tree(release), kvest.sglang.patch() as handle:
        installed = set()
        for target in handle.plan.targets:
            for name in _kinds_of(target):
                installed.add(name)
                cost = KINDS[name].costs
                if cost is None:
                    continue
                assert cost[build].below is not None, (target.spot, name, build)
            for swap in target.swaps:
                below = KINDS[swap.found.pattern.kind].below(build)
                assert getattr(swap.glue, "kvest_below", 0) >= below, (target.spot, build)
        report = kvest.sglang.status()["hotspots"]
        for spot in registry.HOTSPOTS.values():
            for use in spot.uses:
                slower = KINDS[use.kind].slower(build)
                if slower and report[spot.name]["state"] not in ("absent", "not loaded"):
                    assert use.kind not in installed or any(
                        u.kind == use.kind for s in registry.HOTSPOTS.values()
                        for u in s.uses if s.name != spot.name), use.kind
                    found = [n for n in report[spot.name]["notes"] if slower in n]
                    recognised = report[spot.name]["state"] != "not recognised in this release"
                    assert found or not recognised, (spot.name, report[spot.name])


def test_status_says_the_adding_loop_is_upstreams_on_the_public_api_build(monkeypatch):
    """The adding loop of alloc_for_decode_default: kvest's on the default build,
    upstream's on the public-API build, and status() gives the numbers."""
    newest = [t for t in releases()
              if any(p.kind == "add_lengths_loop" and t.version in p.releases
                     for p in patterns.load())]
    if not newest:
        pytest.skip("no release with alloc_for_decode_default's adding loop at hand")
    monkeypatch.delenv("KVEST_SGLANG_HANDOFF", raising=False)
    states = {}
    for build in Build:
        monkeypatch.setattr(registry, "DECIDING", build)
        with standin_tree(newest[-1]), kvest.sglang.patch():
            states[build] = monitor.status()["hotspots"]["alloc_for_decode_default"]
    assert states[Build.DEFAULT]["state"] == "replaced"
    public = states[Build.PUBLIC_API]
    assert public["state"] == "skipped", public
    cost = KINDS["add_lengths_loop"].costs[Build.PUBLIC_API]
    assert "public API" in public["reason"] and f"{cost.kvest:,}" in public["reason"], public
    assert f"{cost.upstream:,}" in public["reason"], public
