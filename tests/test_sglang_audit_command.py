"""``python -m kvest audit``'s answers (kvest.sglang.audit_run.main), on a stand-in world.

SGLang's classes are not needed here: ``World`` (the scheduler loop over
SGLang's classes) is replaced by one whose ticks drive, compare, raise or
stall as a release's classes would, and the audit's counters are the real
ones.  What is checked: the command never gives an answer its run does not
support (exit 0 only when every configuration listed was driven and its steps
compared; 2, naming each configuration and why, when one was not; 2 for a
driver error, never 1; "failed after fits" only for an allocation failure),
and its output (every column documented, a reproducer's command line that
names its configuration, the full run's time).  The real classes:
``tests/test_sglang_audit_real.py``.
"""

from __future__ import annotations

import contextlib
import pathlib
import shlex
from types import SimpleNamespace

import pytest

from kvest.sglang import audit
from kvest.sglang import audit_run as ar

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "audit.md"


class Behaviour:
    """What a stand-in world does, by configuration (its seed)."""

    COMPARED = 0  # every decode step driven and compared
    NO_PREFIX_LEN = 1  # a driver error before any step (a Req without a field it reads)
    UNPAIRED = 2  # steps driven, none paired with a check
    ALLOC_FAILS = 3  # the step's allocation fails after "fits", a pool refusing (a finding)
    OTHER_RAISE = 4  # the step raises something else after "fits": a driver error
    STALLS = 5  # fewer steps than asked, nothing raised
    UNDERCOUNT = 6
    LEAKS = 7  # every step compared, and at the drain a pool short of its size


class StandInWorld:
    def __init__(self, config, max_running=10, server_args=None):
        self.behaviour = config.seed
        self.pool = POOL.get(config.pool, "PagedTokenToKVPoolAllocator")
        self.steps = self.retractions = self.evictions = self.window_frees = 0
        self.prefix_hits = 0
        self.ledger = ar.Ledger()
        self.drained = False

    def drain(self):
        self.drained = True
        if self.behaviour == Behaviour.LEAKS:
            self.ledger._note(audit.Kind.NOT_RETURNED, self.pool, 3,
                              f"3 of 100 slots not back in {self.pool}")

    def tick(self):
        b = self.behaviour
        if b == Behaviour.NO_PREFIX_LEN:
            raise AttributeError("'Req' object has no attribute 'prefix_len'")
        if b == Behaviour.STALLS and self.steps >= 3:
            return
        if b in (Behaviour.ALLOC_FAILS, Behaviour.OTHER_RAISE) and self.steps == 5:
            audit.AUDIT.steps += 1
            if b == Behaviour.ALLOC_FAILS:
                audit.AUDIT.failed_after_fits += 1
                audit.AUDIT.first[audit.Kind.FAILED] = audit.Finding(
                    audit.Kind.FAILED, self.pool, "the check said 16 tokens fit", 6)
                raise RuntimeError("HiSparse _grow_device_buffers failed")
            raise KeyError("not an allocation failure")
        self.steps += 1
        if b == Behaviour.UNPAIRED:
            audit.AUDIT.unpaired += 1
            return
        audit.AUDIT.steps += 1
        if b == Behaviour.UNDERCOUNT and self.steps == 7:
            audit.AUDIT.undercounts += 1
            audit._counts(self.pool).undercounts += 1
            audit.AUDIT.first[audit.Kind.UNDERCOUNT] = audit.Finding(
                audit.Kind.UNDERCOUNT, self.pool, "the estimate was 2 tokens and the pool was "
                "asked for 10", audit.AUDIT.steps + audit.AUDIT.unpaired)


DEVICE_POOL = "HiSparseTokenToKVPoolAllocator.hisparse_attn_allocator"
POOL = {ar.Pool.HISPARSE: DEVICE_POOL}  # where the stand-in's undercount shows


def config(behaviour: int, pool: str = "paged") -> ar.Config:
    return ar.Config(ar.Pool(pool), 16, ar.Spec(), ar.Order.PLAIN, False, behaviour)


@pytest.fixture()
def command(monkeypatch):
    """main() over the given configurations, on the stand-in world."""
    monkeypatch.setattr(ar, "sg", lambda: SimpleNamespace(version="0.5.20"))
    monkeypatch.setattr(ar, "World", StandInWorld)
    monkeypatch.setattr(ar, "context", lambda config: contextlib.nullcontext())
    monkeypatch.setattr(ar, "_standins", lambda: None)
    monkeypatch.setattr(audit, "install", lambda every=None: [])
    monkeypatch.setattr(audit, "installed", lambda: True)

    def run(configs, *argv, version="0.5.20", notes=()):
        monkeypatch.setattr(ar, "sg", lambda: SimpleNamespace(version=version))
        monkeypatch.setattr(ar, "matrix", lambda quick, pools, seed: list(configs))
        monkeypatch.setattr(ar, "not_listed", lambda quick, pools: list(notes))
        audit.reset()
        return ar.main(["--steps", "20", *argv])

    yield run
    audit.reset()


def test_every_configuration_driven_and_compared_is_exit_0(command, capsys):
    assert command([config(Behaviour.COMPARED), config(Behaviour.COMPARED, "token")]) == 0
    out = capsys.readouterr().out
    assert "No undercount and no bookkeeping gap" in out
    assert "configurations not driven" not in out


@pytest.mark.parametrize("behaviour,why", [
    (Behaviour.NO_PREFIX_LEN, "a driver error before its first decode step: AttributeError: "
                              "'Req' object has no attribute 'prefix_len'"),
    (Behaviour.UNPAIRED, "0 of 20 driven decode steps compared (unpaired 20)"),
    (Behaviour.OTHER_RAISE, "a driver error after 5 of 20 decode steps: KeyError"),
    (Behaviour.STALLS, "3 of 20 decode steps, nothing raised"),
])
def test_a_configuration_not_driven_is_named_and_exit_2(command, capsys, behaviour, why):
    """0.5.20/0.5.21 today: every configuration 'not driven', 0 steps, and exit 0."""
    bad = config(behaviour, "swa")
    assert command([config(Behaviour.COMPARED), bad]) == 2
    out = capsys.readouterr().out
    assert "No undercount" not in out
    assert "1 of 2 configurations not driven" in out
    line = next(line for line in out.splitlines() if line.startswith(f"  {bad}: "))
    assert why in line
    # the command that runs it alone follows
    assert f"--config '{bad}'" in out


def test_every_configuration_not_driven_is_exit_2_never_0(command, capsys):
    configs = [config(Behaviour.NO_PREFIX_LEN, pool) for pool in ("token", "paged", "swa")]
    assert command(configs) == 2
    out = capsys.readouterr().out
    assert "3 of 3 configurations not driven" in out and "No undercount" not in out


def test_an_allocation_failure_after_fits_is_a_finding_not_a_driver_error(command, capsys):
    result = ar.run(config(Behaviour.ALLOC_FAILS), 20)
    assert result.outcome is ar.Outcome.FAILED_AFTER_FITS and result.skipped is None
    assert result.bad
    assert command([config(Behaviour.ALLOC_FAILS)]) == 1
    # anything else raised in a step is the driver's: exit 2, never 1
    result = ar.run(config(Behaviour.OTHER_RAISE), 20)
    assert result.outcome is ar.Outcome.DRIVER_ERROR and not result.bad
    assert command([config(Behaviour.OTHER_RAISE)]) == 2
    capsys.readouterr()


def test_a_driver_error_while_listing_the_configurations_is_exit_2(command, monkeypatch,
                                                                    capsys):
    def listing(quick, pools, seed):
        raise AttributeError("type object 'SpeculativeAlgorithm' has no attribute 'is_uno'")

    command([])
    monkeypatch.setattr(ar, "matrix", listing)
    assert ar.main(["--steps", "20"]) == 2
    assert "is_uno" in capsys.readouterr().err


def test_not_driven_wins_over_a_finding(command, capsys):
    assert command([config(Behaviour.UNDERCOUNT), config(Behaviour.NO_PREFIX_LEN)]) == 2
    out = capsys.readouterr().out
    assert "reproducer, first undercount" in out  # the finding is still shown


def test_the_reproducer_is_the_command_line_and_counts_steps_per_configuration(command,
                                                                             capsys):
    finding = config(Behaviour.UNDERCOUNT)
    assert command([config(Behaviour.COMPARED), finding]) == 1
    out = capsys.readouterr().out
    head, line = out.split("reproducer, first undercount: ", 1)[1].splitlines()[:2]
    # found in the 7th step of its configuration, after 20 steps of another one
    assert "decode step 7 of this configuration" in head
    argv = shlex.split(line.strip())
    assert argv[:4] == ["python", "-m", "kvest", "audit"]
    assert ar.Config.parse(argv[argv.index("--config") + 1]) == finding
    assert argv[argv.index("--steps") + 1] == "20"
    # and run as it says, it finds the same thing at the same step
    audit.reset()
    assert ar.main(argv[4:]) == 1
    assert "decode step 7 of this configuration" in capsys.readouterr().out


def test_configurations_parse_back_from_what_the_command_prints():
    specs = [ar.Spec(), ar.Spec("EAGLE", 3, 2, 6), ar.Spec("DFLASH", 1, 1, 4)]
    for pool in ar.Pool:
        for spec in specs:
            for order in ar.Order:
                for sharing in (False, True):
                    c = ar.Config(pool, 7, spec, order, sharing, 12)
                    assert ar.Config.parse(str(c)) == c
    for bad in ("paged p=16", "paged p=x spec=none plain seed=1",
                "paged p=16 spec=EAGLE(3) plain seed=1"):
        with pytest.raises(ValueError):
            ar.Config.parse(bad)
    with pytest.raises(SystemExit):
        ar.main(["--config", "nonsense"])


def test_every_column_is_documented_and_the_time_stated(command, capsys):
    assert command([config(Behaviour.COMPARED), config(Behaviour.OTHER_RAISE)]) == 2
    out = capsys.readouterr().out
    head = out.splitlines()[0].split()
    legend = out.split("columns:\n", 1)[1]
    docs = DOCS.read_text()
    assert head == [name for name, _ in ar.COLUMNS] and "ended" in head
    for name in head:
        assert f"\n  {name} " in f"\n{legend}", name
        assert f"`{name}`" in docs, name
    assert out.splitlines()[-1].startswith("full run: ") and out.rstrip().endswith(" s")


def test_an_error_anywhere_in_the_driver_is_exit_2_never_1(command, monkeypatch, capsys):
    command([])

    def broken(results):
        raise TypeError("a bug in the table")

    monkeypatch.setattr(ar, "matrix", lambda quick, pools, seed: [config(Behaviour.COMPARED)])
    monkeypatch.setattr(ar, "_table", broken)
    assert ar.main(["--steps", "5"]) == 2
    assert "a driver error: TypeError: a bug in the table" in capsys.readouterr().err

    def install(every=None):
        raise AttributeError("no such class")

    monkeypatch.setattr(audit, "install", install)
    monkeypatch.setattr(audit, "installed", lambda: False)
    assert ar.main(["--steps", "5"]) == 2
    assert "cannot attach" in capsys.readouterr().err


# ------------------------------------------------------------------ known findings


def test_a_known_finding_is_marked_and_can_be_ignored(command, capsys):
    """0.5.23 today: HiSparse's undercount always exits 1."""
    hisparse = config(Behaviour.UNDERCOUNT, "hisparse")
    assert command([config(Behaviour.COMPARED), hisparse], version="0.5.23") == 1
    out = capsys.readouterr().out
    assert ("known finding, in 1 configurations: hisparse-device-buffer-padding: HiSparse "
            "device buffer padded past its cap: two pages where the estimate counts one") in out
    assert "known: hisparse-device-buffer-padding" in out and "new findings" not in out
    # gated on what the operator runs: the known finding ignored, the run's answer is 0
    assert command([config(Behaviour.COMPARED), hisparse], "--known-findings", "ignore",
                   version="0.5.23") == 0
    out = capsys.readouterr().out
    assert "No new undercount and no new bookkeeping gap" in out
    assert "known findings ignored (--known-findings=ignore): hisparse" in out


@pytest.mark.parametrize("where", ["another allocator", "an earlier release", "no registry"])
def test_a_finding_kvest_does_not_know_still_exits_1(command, capsys, monkeypatch, where):
    finding = config(Behaviour.UNDERCOUNT, "paged" if where == "another allocator"
                     else "hisparse")
    if where == "no registry":  # the registry is what makes it known
        monkeypatch.setattr(ar.registry, "KNOWN_FINDINGS", ())
    version = "0.5.12" if where == "an earlier release" else "0.5.23"
    assert command([finding], "--known-findings", "ignore", version=version) == 1
    out = capsys.readouterr().out
    assert "new findings (not among kvest's known ones): undercount in" in out
    assert "new: not among kvest's known findings" in out


def test_ignoring_known_findings_never_hides_a_configuration_not_driven(command, capsys):
    configs = [config(Behaviour.UNDERCOUNT, "hisparse"), config(Behaviour.NO_PREFIX_LEN)]
    assert command(configs, "--known-findings", "ignore", version="0.5.23") == 2
    capsys.readouterr()


def test_the_registry_holds_what_kvest_knows_of_a_release():
    from kvest.sglang import registry

    (hisparse,) = [k for k in registry.KNOWN_FINDINGS
                   if k.name == "hisparse-device-buffer-padding"]
    assert hisparse.releases == ("0.5.13", None) and hisparse.fixed_in is None
    assert ("undercount", DEVICE_POOL) in hisparse.shows_as and hisparse.reference
    assert ar.known("undercount", DEVICE_POOL, config(0, "hisparse"), "0.5.23") is hisparse
    assert ar.known("undercount", DEVICE_POOL, config(0, "hisparse"), "0.5.12") is None
    assert ar.known("bookkeeping gap", DEVICE_POOL, config(0, "hisparse"), "0.5.23") is None


def test_no_configuration_listed_is_no_all_clear(command, capsys):
    assert command([]) == 2
    assert "no configuration to drive" in capsys.readouterr().err


@pytest.mark.parametrize("spec, page, version, is_known", [
    ("DFLASH", 16, "0.5.18", True), ("DSPARK", 7, "0.5.15", True),
    ("DFLASH", 16, "0.5.19", False),  # fixed there
    ("EAGLE", 16, "0.5.18", False),  # another algorithm: new
    ("DFLASH", 1, "0.5.18", False),  # a page of one token has no tail to strand
])
def test_a_known_finding_holds_only_in_its_configurations(spec, page, version, is_known):
    from kvest.sglang import registry

    (dflash,) = [k for k in registry.KNOWN_FINDINGS if k.name == "dflash-reserve-unaligned"]
    cfg = ar.Config(ar.Pool.PAGED, page, ar.Spec(spec, 1, 1, 4), ar.Order.PLAIN, False, 0)
    got = ar.known("bookkeeping gap", "PagedTokenToKVPoolAllocator", cfg, version)
    assert got is (dflash if is_known else None)


def test_what_the_release_cannot_drive_is_named_not_dropped(command, capsys):
    assert command([config(Behaviour.COMPARED)], notes=["pure-swa: no such allocator"]) == 0
    assert "  not listed: pure-swa: no such allocator" in capsys.readouterr().err


def test_a_slot_not_returned_at_the_drain_is_a_finding(command, capsys):
    assert command([config(Behaviour.LEAKS)]) == 1
    out = capsys.readouterr().out
    assert "the frees, in 1 configurations: not returned in PagedTokenToKVPoolAllocator" in out
    assert "reproducer, first not returned" in out and "3 of 100 slots not back" in out
    assert "new findings (not among kvest's known ones): not returned in " in out


class _Pool:
    """A pool as the ledger reads it: its free list, and its size."""

    page_size = 1

    def __init__(self, size, free, released=()):
        import torch

        self.size = size
        self.free_pages = torch.tensor(free, dtype=torch.int64)
        self.release_pages = torch.tensor(released, dtype=torch.int64)


@pytest.mark.parametrize("free, released, drained, found", [
    ([1, 2, 3, 4], [], True, {}),  # every slot back
    ([1, 2, 3], [4], True, {}),  # a lazily released one counts
    ([1, 2, 2, 4], [], False, {"freed twice in P": 1}),
    ([1, 2], [2], False, {"freed twice in P": 1}),  # twice across the two lists
    ([1, 2], [], True, {"not returned in P": 2}),
    ([1, 2], [], False, {}),  # held slots are no finding before the drain
])
def test_the_ledger_reads_the_free_lists(monkeypatch, free, released, drained, found):
    pytest.importorskip("torch")
    pool = _Pool(4, free, released)
    monkeypatch.setattr(ar, "sg", lambda: SimpleNamespace(torch=__import__("torch")))
    monkeypatch.setattr(audit, "_pools_of", lambda allocator: SimpleNamespace(
        pools=(("P", pool, True, None),)))
    ledger = ar.Ledger()
    ledger.check(SimpleNamespace(allocator=None, steps=9), drained=drained)
    assert ledger.found == found
    assert set(ledger.first) == {k.split(" in ")[0] for k in found}
