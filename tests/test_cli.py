"""``python -m kvest``: flags checked as the user types them, usage errors exit 2."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest

from kvest import cli

BAD_FLAGS = [
    (["--requests", "-5"], "--requests"),
    (["--requests", "0"], "--requests"),
    (["--requests", "many"], "--requests"),
    (["--requests", "1000001"], "must be <= 1,000,000, got 1,000,001: the pure-Python reference"),
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
    (["bench", "--quick", "--check"],
     {"quick": True, "plot_path": None, "markdown": None, "check": True}),
])
def test_bench_flags(argv, expected, monkeypatch):
    """`--plot` alone writes bench.png; each flag reaches the benchmark."""
    from kvest._bench import run

    seen = {}
    monkeypatch.setattr(run, "run", lambda **kwargs: seen.update(kwargs) or 0)
    assert cli.main(argv) == 0
    assert seen == {"sglang_only": False, "check": False, **expected}


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


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["sglang", "--help"]])
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


def test_a_large_demo_says_what_it_is_doing(capsys):
    """From PROGRESS_FROM requests the reference takes a while: a line per
    estimator on stderr, numbered, before it runs; below it, nothing."""
    assert cli.main(["--requests", str(cli.PROGRESS_FROM)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 8 and lines[0].startswith("[1/8] spec_v2_new_tokens")
    assert lines[-1].startswith("[8/8] decode_alloc_plan")
    assert f"{cli.PROGRESS_FROM} requests" in captured.out and " NO " not in captured.out
    assert cli.main(["--requests", str(cli.PROGRESS_FROM - 1)]) == 0
    assert capsys.readouterr().err == ""


def test_the_demo_bound_is_documented():
    """The maximum and the progress threshold, as --help and the README's flag
    table give them."""
    from pathlib import Path

    assert cli.MAX_REQUESTS == 1_000_000 and cli.PROGRESS_FROM == 100_000
    help_text = " ".join(cli.parser().format_help().split())
    assert "1 to 1,000,000" in help_text and "from 100,000" in help_text
    readme = Path(__file__).resolve().parent.parent / "README.md"
    if not readme.is_file():
        pytest.skip("README.md is not beside the tests")
    row = next(line for line in readme.read_text(encoding="utf-8").splitlines()
               if line.startswith("| `--requests N`"))
    assert "1 to 1,000,000" in row and "from 100,000, progress on stderr" in row
    assert "above 1,000,000, a usage error" in row


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
    # the README's flag table, or the operator's page (docs/operations.md)
    text = readme.read_text(encoding="utf-8")
    operations = readme.parent / "docs" / "operations.md"
    text += operations.read_text(encoding="utf-8") if operations.is_file() else ""
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


# ------------------------------------------------ bench --sglang --quick: its plan and progress

def test_quick_sglang_plan_is_reduced_and_the_full_one_is_not():
    """--quick: one pair of workers, no bound, batch sizes 1 and 1,024 (what
    the headline and the targets read); the full run measures what it did."""
    from kvest._bench import sglang_step as s

    quick, full = s.plan(quick=True), s.plan(quick=False)
    assert quick.sizes == (1, 1024) and quick.pairs == 1 and not quick.bound
    assert quick.sides() == s.SIDES
    assert len(quick.cells()) == 2 * len(s.HOT_SPOTS)
    assert full.sizes == tuple(s.SIZES) == (1, 16, 64, 256, 1024, 4096)
    assert full.pairs == s.PAIRS == 3 and full.bound
    assert full.sides() == s.SIDES  # (the bound is timed in kvest's worker)
    assert full.timed("step, EAGLE", 4096) == (*s.SIDES, s.FREE)
    assert full.timed("step, EAGLE", 256) == s.SIDES == full.timed("retract k=8", 1024)
    assert quick.timed("step, EAGLE", 1024) == s.SIDES
    assert set(quick.sizes) < set(full.sizes) and quick.names == full.names
    assert 1024 in quick.sizes  # the headline's batch


class _FakePairs:
    """Stands in for the worker processes: answers at once, records the cells."""

    made: ClassVar[list] = []

    def __init__(self, count, sides, progress=None):
        self.count, self.sides, self.cells = count, sides, []
        self.status = {side: {"mode": "off" if side == "upstream" else "on",
                              "sglang": "0.0.test", "hotspots": {}} for side in sides}
        _FakePairs.made.append(self)
        if progress:
            progress(f"starting {count * len(sides)} worker processes")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def check(self, cell, n):
        return "digest"

    def measure(self, cell, n, samples, target, sides):
        self.cells.append((cell, n, samples, target, sides))
        return {side: 1e-6 * n for side in sides}

    def lines(self):
        from kvest._bench import sglang_step as s

        return {(cell, side, n): n for cell in s.LINE_STEPS for side in s.SIDES
                for n in s.LINE_SIZES}


@pytest.fixture
def fake_workers(monkeypatch):
    from kvest._bench import sglang_step as s

    _FakePairs.made = []
    monkeypatch.setattr(s, "missing", lambda: None)
    monkeypatch.setattr(s, "Pairs", _FakePairs)
    return _FakePairs.made


def test_quick_sglang_runs_its_plan_with_a_count_per_cell(fake_workers, capsys):
    """`bench --sglang --quick`: a `[k/N] hot spot, n requests` line on stderr
    as each cell is done, from the workers' start to the line events."""
    from kvest._bench import sglang_step as s

    assert cli.main(["bench", "--sglang", "--quick"]) == 0
    (pairs,) = fake_workers
    assert pairs.count == 1 and pairs.sides == s.SIDES
    assert [(cell, n) for cell, n, *_ in pairs.cells] == s.plan(quick=True).cells()
    err = capsys.readouterr().err.splitlines()
    total = len(s.plan(quick=True).cells())
    counted = [line for line in err if line.startswith("[")]
    assert len(counted) == total == 24
    assert counted[0] == "[ 1/24] step, no spec, 1 request"
    assert counted[13] == "[14/24] step, EAGLE, 1024 requests"
    assert counted[-1] == f"[24/24] {s.LOOPS[-1]}, 1024 requests"
    assert err.index(counted[0]) > next(i for i, line in enumerate(err) if "starting" in line)
    assert any(line.startswith("line events") for line in err)


def test_full_sglang_plan_is_unchanged(fake_workers, capsys):
    from kvest._bench import sglang_step as s

    assert cli.main(["bench", "--sglang"]) == 0
    (pairs,) = fake_workers
    assert pairs.count == 3 and pairs.sides == s.SIDES
    assert [(cell, n) for cell, n, *_ in pairs.cells] == s.plan().cells()
    assert len(pairs.cells) == 6 * 12
    out = capsys.readouterr()
    assert f"[72/72] {s.LOOPS[-1]}, 4096 requests" in out.err
    assert "3 pairs of processes" in out.out and "real sglang 0.0.test" in out.out


def test_sglang_only_without_sglang_says_so_at_once(monkeypatch, capsys):
    """Nothing to measure is not a run: exit 2 and the reason, no worker started."""
    from kvest._bench import sglang_step as s

    monkeypatch.setattr(s, "missing", lambda: "no module named 'torch' (test)")
    monkeypatch.setattr(s, "Pairs", lambda *a, **k: pytest.fail("workers started"))
    assert cli.main(["bench", "--sglang", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "bench --sglang: nothing to measure: no module named 'torch' (test)" in err


def test_sglang_that_does_not_import_in_the_workers(monkeypatch, capsys):
    """Installed but broken: the workers say so (the parent never imports SGLang)."""
    from kvest._bench import sglang_step as s

    def broken(*args, **kwargs):
        raise s.Unavailable("sglang's scheduler modules do not import here (test)")

    monkeypatch.setattr(s, "missing", lambda: None)
    monkeypatch.setattr(s, "Pairs", broken)
    assert cli.main(["bench", "--sglang", "--quick"]) == 2
    assert "nothing to measure: sglang's scheduler modules do not import" in (
        capsys.readouterr().err)


def test_progress_line_format():
    from kvest._bench.sglang_step import progress_line

    assert progress_line(3, 12, "step, EAGLE", 1024) == "[ 3/12] step, EAGLE, 1024 requests"
    assert progress_line(1, 9, "retract k=8", 1) == "[1/9] retract k=8, 1 request"


def test_a_worker_that_cannot_import_sglang_says_why():
    import io

    from kvest._bench import sglang_step as s

    worker = object.__new__(s.Worker)
    worker.side, worker.asked = "kvest", {}
    worker.proc = type("Proc", (), {"stdout": io.StringIO('{"unavailable": "why"}\n')})()
    with pytest.raises(s.Unavailable, match="why"):
        worker.receive()


def test_bench_sglang_from_the_shell_without_sglang():
    import importlib.util

    if importlib.util.find_spec("torch") or importlib.util.find_spec("sglang"):
        pytest.skip("torch or sglang is installed here")
    done = subprocess.run([sys.executable, "-m", "kvest", "bench", "--sglang", "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "bench --sglang: nothing to measure: sglang's scheduler modules do not import" in (
        done.stderr)
    assert "Traceback" not in done.stderr
