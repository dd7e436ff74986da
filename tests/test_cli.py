"""``python -m kvest``: flags checked as the user types them, usage errors exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvest import cli

BAD_FLAGS = [
    (["--requests", "-5"], "--requests"),
    (["--requests", "0"], "--requests"),
    (["--requests", "many"], "--requests"),
    (["--page-size", "0"], "--page-size"),
    (["--page-size", "-16"], "--page-size"),
    (["--page-size", "1.5"], "--page-size"),
    (["--config", "3", "-1", "6"], "--config"),
    (["--config", "3", "2"], "--config"),
    (["--seed", "-1"], "--seed"),
    (["--no-such-flag"], "unrecognized"),
    (["bench", "--quick=yes"], "--quick"),
    (["bench", "--markdown"], "--markdown"),
    (["nonsense"], "invalid choice"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flags_are_usage_errors(argv, fragment, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m kvest")
    assert fragment in err
    assert "Traceback" not in err


def test_bad_flag_from_the_shell_prints_usage_not_a_traceback():
    done = subprocess.run([sys.executable, "-m", "kvest", "--requests", "-5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "usage:" in done.stderr and "must be >= 1, got -5" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("argv", "expected"), [
    (["bench"], {"quick": False, "plot_path": None, "markdown": None}),
    (["bench", "--quick"], {"quick": True, "plot_path": None, "markdown": None}),
    (["bench", "--plot"], {"quick": False, "plot_path": cli.DEFAULT_PLOT, "markdown": None}),
    (["bench", "--plot", "--quick"],
     {"quick": True, "plot_path": cli.DEFAULT_PLOT, "markdown": None}),
    (["bench", "--plot", "out.png", "--markdown", "t.md"],
     {"quick": False, "plot_path": "out.png", "markdown": "t.md"}),
    (["bench", "--sglang"],
     {"quick": False, "plot_path": None, "markdown": None, "sglang_only": True}),
])
def test_bench_flags(argv, expected, monkeypatch):
    """`--plot` alone writes bench.png; each flag reaches the benchmark."""
    from kvest._bench import run

    seen = {}
    monkeypatch.setattr(run, "run", lambda **kwargs: seen.update(kwargs) or 0)
    assert cli.main(argv) == 0
    assert seen == {"sglang_only": False, **expected}


@pytest.mark.parametrize("argv", [["bench", "--plot"], ["bench", "--quick", "--plot", "x.png"]])
def test_plot_without_matplotlib_stops_before_the_run(argv, monkeypatch, capsys):
    """Not minutes of benchmark and then a traceback: exit 2 at once, with the hint."""
    import importlib.util

    from kvest._bench import run

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "matplotlib" else real_find_spec(name, *a))
    ran = []
    monkeypatch.setattr(run, "run", lambda **kwargs: ran.append(kwargs) or 0)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    assert ran == []
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pip install" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_help_is_plain_text_for_a_user(argv, capsys):
    """No reStructuredText markup, no private module, and --quick's text as it runs."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert "`" not in text and ":func:" not in text and ":mod:" not in text
    assert "kvest._" not in text
    if "bench" in argv:
        from kvest._bench import arrays

        assert "spec_v2 only" in text and arrays.QUICK_PAGE_SIZES == [16, 100]
        assert "page sizes 16 and 100" in " ".join(text.split())


def test_demo_runs_and_agrees(capsys):
    assert cli.main(["--requests", "8", "--page-size", "100", "--config", "5", "4", "8",
                     "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "8 requests, page size 100" in out
    assert " NO " not in out


def test_help_names_every_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--quick", "--plot", "--markdown"):
        assert flag in text


def test_readme_documents_every_flag():
    from pathlib import Path

    readme = Path(__file__).resolve().parent.parent / "README.md"
    if not readme.is_file():
        pytest.skip("README.md is not beside the tests")
    text = readme.read_text(encoding="utf-8")
    top = cli.parser()
    parsers = [top, *next(a for a in top._actions if a.dest == "command").choices.values()]
    for parser in parsers:
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert f"`{flag}" in text or f"`bench {flag}" in text, flag


def test_reader_that_leaves_early_gets_no_traceback():
    # `python -m kvest | head -3`: the pipe closes while the demo still prints.
    proc = subprocess.Popen([sys.executable, "-m", "kvest", "--requests", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) in (0, 1)
    assert first.startswith(b"kvest ")
    assert "Traceback" not in stderr, stderr
