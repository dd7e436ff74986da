"""Every number a user types, in every subcommand: a usage error with the
reason (exit 2) or a run, never a traceback.  The flags are read from each
command's own parser, so a new numeric flag is covered as soon as it exists."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvest import cli

INT64_MAX = 2**63 - 1

# Boundaries of int64 and of products of int64 (page size times reserve,
# steps times topk times draft), words, floats, digits beyond int()'s limit.
HOSTILE = st.one_of(
    st.sampled_from([0, 1, 2, 3, 16, 2**31, 2**32, 10**9, 10**18, 2**62, 2**62 + 1,
                     INT64_MAX - 1, INT64_MAX, 2**63, 2**64, 10**20, -1, -(2**63),
                     -(2**63) - 1, 4611686018427387904]).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", " ", "1e5", "nan", "inf", "0x10", "1.0", "9" * 5000, "-" + "9" * 5000,
                     "\u0661\u0662", "1_0", "+3", " 7 ", "--", "2**63"]),
)


class _Parser(Exception):
    """Raised in place of parse_args: carries the parser a command built."""


def _parser_of(main, monkeypatch) -> argparse.ArgumentParser:
    def capture(self, *args, **kwargs):
        raise _Parser(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(_Parser) as caught:
            main([])
    return caught.value.args[0]


def _numeric(parser: argparse.ArgumentParser) -> list[tuple[str, int, bool]]:
    """(flag, how many values, whether they are integers) of every flag that
    takes a number."""
    return [(a.option_strings[-1], a.nargs if isinstance(a.nargs, int) else 1,
             getattr(a.type, "__name__", "") != "seconds")
            for a in parser._actions
            if a.option_strings and a.type is not None and _takes_numbers(a.type)]


def _takes_numbers(convert) -> bool:
    """Whether a flag's type reads a numeral as a number, or a list of them
    (an enum or a configuration's text is no number)."""
    try:
        value = convert("1")
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False
    items = value if isinstance(value, (list, tuple)) else [value]
    return bool(items) and all(isinstance(v, (int, float)) for v in items)


def _commands(monkeypatch):
    """name -> (its main, the argv before the flags, its numeric flags)."""
    from kvest._bench import sglang_step
    from kvest.sglang import audit_run, doctor

    top = cli.parser()
    subs = next(a for a in top._actions if a.dest == "command").choices
    return {"demo": (cli.main, [], _numeric(top)),
            "bench": (cli.main, ["bench"], _numeric(subs["bench"])),
            "sglang": (cli.main, ["sglang"], _numeric(_parser_of(doctor.main, monkeypatch))),
            "audit": (cli.main, ["audit"], _numeric(_parser_of(audit_run.main, monkeypatch))),
            # bench's real-SGLang section alone (docs/benchmarks.md)
            "sglang_step": (sglang_step.main, [],
                            _numeric(_parser_of(sglang_step.main, monkeypatch)))}


def test_every_command_with_numbers_is_covered(monkeypatch):
    commands = _commands(monkeypatch)
    flags = {name: [f for f, *_ in found] for name, (*_, found) in commands.items()}
    assert {"--requests", "--page-size", "--config", "--seed"} <= set(flags["demo"])
    assert {"--batches", "--seed"} <= set(flags["sglang"])
    assert {"--steps", "--seed"} <= set(flags["audit"])
    assert {"--samples", "--target", "--sizes"} <= set(flags["sglang_step"])
    # audit_run's parser takes any Python int: the CLI checks these first
    assert set(flags["audit"]) == {a.option_strings[-1] for a in cli.audit_numbers()._actions}


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@pytest.fixture
def stubbed(monkeypatch):
    """The demo for real at small batches (it is what overflows), the doctor's
    check and the audit's scheduler stubbed: the numbers are what is tested."""
    from kvest._bench import sglang_step
    from kvest.sglang import audit_run, doctor

    real_demo = cli.demo
    monkeypatch.setattr(sglang_step, "missing", lambda: "stubbed: no SGLang")
    monkeypatch.setattr(cli, "demo", lambda n, *a: real_demo(n, *a) if n <= 64 else 0)
    monkeypatch.setattr(doctor, "_check", lambda source, args: 0)
    monkeypatch.setattr(doctor, "_source", lambda root, stack: object())

    def no_scheduler():
        raise ImportError("stubbed: no scheduler")

    monkeypatch.setattr(audit_run, "sg", no_scheduler)
    from kvest._bench import run

    monkeypatch.setattr(run, "run", lambda **kwargs: 0)
    return _commands(monkeypatch)


@pytest.mark.parametrize("command", ["demo", "bench", "sglang", "audit", "sglang_step"])
@given(data=st.data())
def test_hostile_numbers_are_usage_errors_or_runs(command, stubbed, data, capsys):
    main, prefix, flags = stubbed[command]
    if not flags:
        return
    flag, count, integers = data.draw(st.sampled_from(flags))
    values = [data.draw(HOSTILE) for _ in range(count)]
    argv = [*prefix, flag, *values]
    if command == "demo" and flag != "--requests":
        argv += ["--requests", str(data.draw(st.integers(1, 16)))]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert err.startswith("usage: python -m kvest"), (argv, err)
        assert flag in err and "Traceback" not in err
        assert len(err) < 4000  # a pasted megabyte is not echoed back
        return
    numbers = [_as_int(v) for v in values]
    assert all(n is None or abs(n) <= INT64_MAX + 1 for n in numbers), (argv, code)
    assert not integers or None not in numbers, (argv, code)
    if command == "audit":
        assert code == 2 and "does not import" in capsys.readouterr().err
    else:
        assert code == 0, argv


@pytest.mark.parametrize("argv", [
    ["--page-size", "99999999999999999999"],
    ["--page-size", "1000000000000000000"],
    ["--config", "3", "2", "4611686018427387904"],
    ["--requests", "4", "--page-size", str(INT64_MAX)],
    ["sglang", "--batches", str(2**63)],
    ["sglang", "--seed", "9" * 5000],
    ["audit", "--steps", str(2**64)],
    ["audit", "--seed", str(-(2**63) - 1)],
])
def test_out_of_range_from_the_shell_is_usage_and_exit_2(argv):
    done = subprocess.run([sys.executable, "-m", "kvest", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "usage: python -m kvest" in done.stderr and "Traceback" not in done.stderr
    assert "int64" in done.stderr or "must be" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("argv", [["--page-size", str(2**62)],
                                  ["--page-size", "1000000000000000000"],
                                  ["--config", "3", "2", "4611686018427387904"]])
def test_an_overflowing_demo_names_its_flags_and_the_reason(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--page-size" in err and "--config" in err
    assert "int64" in err


def test_the_largest_demo_values_that_fit_still_run(capsys):
    """The other direction: int64 is the limit, not something smaller."""
    assert cli.main(["--requests", "2", "--page-size", str(2**40), "--seed", str(INT64_MAX)]) == 0
    assert "page size 1099511627776" in capsys.readouterr().out


def test_top_level_help_names_every_subcommand(capsys):
    top = cli.parser()
    names = next(a for a in top._actions if a.dest == "command").choices
    assert {"bench", "sglang", "audit"} <= set(names)
    description = " ".join(top.description.split())
    for name in names:
        assert f"{name} (" in description, name
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in names:
        assert f"{name} (" in text, name
