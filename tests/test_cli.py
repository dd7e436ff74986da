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
    assert "needs matplotlib" in err and "pip install matplotlib" in err
    assert "kvest[" not in err  # kvest is on no package index: no `pip install "kvest[plot]"`
    assert "Traceback" not in err


def _bad_paths(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    return [
        (str(tmp_path / "no" / "such" / "dir" / "x.png"), "no such directory"),
        (str(a_file / "x.png"), "not a directory"),
        (str(tmp_path), "is a directory"),
        (str(tmp_path / "x.nosuchformat"), "cannot write .nosuchformat"),
    ]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("extra", [[], ["--quick"], ["--sglang", "--quick"]])
def test_plot_path_checked_before_the_run(case, extra, tmp_path, monkeypatch, capsys):
    """`--plot /no/such/dir/x.png`: exit 2 at once, the path named, not a
    traceback after minutes of benchmark."""
    pytest.importorskip("matplotlib")
    from kvest._bench import run

    path, reason = _bad_paths(tmp_path)[case]
    ran = []
    monkeypatch.setattr(run, "run", lambda **kwargs: ran.append(kwargs) or 0)
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", *extra, "--plot", path])
    assert stop.value.code == 2
    assert ran == []
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m kvest bench")
    assert f"--plot {path}: " in err and reason in err
    assert "Traceback" not in err


def test_plot_checks_the_sglang_figure_too(tmp_path, monkeypatch, capsys):
    """The real-SGLang figure goes beside the named one (x-sglang.png)."""
    pytest.importorskip("matplotlib")
    from kvest._bench import run

    (tmp_path / "x-sglang.png").mkdir()
    monkeypatch.setattr(run, "run", lambda **kwargs: 0)
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--plot", str(tmp_path / "x.png")])
    assert stop.value.code == 2
    assert "x-sglang.png is a directory" in capsys.readouterr().err
    assert run.suffixed("a.b/x", "-sglang") == "a.b/x-sglang"
    assert run.suffixed("out.png", "-sglang") == "out-sglang.png"


def test_plot_into_a_folder_that_is_not_writable(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    import os

    from kvest._bench import run

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False
                        if str(p) == str(tmp_path) else real_access(p, mode, *a, **k))
    monkeypatch.setattr(run, "run", lambda **kwargs: 0)
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--plot", str(tmp_path / "x.png")])
    assert stop.value.code == 2
    assert f"cannot create files in {tmp_path}" in capsys.readouterr().err


def test_plot_with_a_broken_matplotlib_stops_before_the_run(monkeypatch, capsys, tmp_path):
    """Found but failing to import is as good as missing."""
    from kvest._bench import run

    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    monkeypatch.setattr(run, "run", lambda **kwargs: pytest.fail("the benchmark ran"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--plot", str(tmp_path / "x.png")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pip install matplotlib" in err


def test_good_plot_and_markdown_paths_reach_the_run(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from kvest._bench import run

    seen = {}
    monkeypatch.setattr(run, "run", lambda **kwargs: seen.update(kwargs) or 0)
    plot, md = str(tmp_path / "x.png"), str(tmp_path / "t.md")
    assert cli.main(["bench", "--quick", "--plot", plot, "--markdown", md]) == 0
    assert seen["plot_path"] == plot and seen["markdown"] == md


def test_markdown_path_checked_before_the_run(tmp_path, monkeypatch, capsys):
    from kvest._bench import run

    path = str(tmp_path / "missing" / "t.md")
    monkeypatch.setattr(run, "run", lambda **kwargs: pytest.fail("the benchmark ran"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--markdown", path])
    assert stop.value.code == 2
    assert f"--markdown {path}: no such directory" in capsys.readouterr().err


def test_plot_from_the_shell_fails_at_once(tmp_path):
    """The command as a user types it: seconds, exit 2, the path named."""
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "no" / "such" / "dir" / "x.png")
    done = subprocess.run([sys.executable, "-m", "kvest", "bench", "--plot", path],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--plot {path}: no such directory" in done.stderr
    assert "Traceback" not in done.stderr
    # Nothing ran: no banner (``kvest bench: <machine>``), no progress line.
    assert not any(line.startswith(("kvest bench", "[")) for line in done.stderr.splitlines())


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
