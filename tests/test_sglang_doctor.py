"""``python -m kvest sglang``: the doctor finds the installed SGLang and checks kvest against it."""

from __future__ import annotations

import os

import pytest

import kvest
from kvest.cli import main as cli_main
from kvest.sglang import upstream

INSTALLED = upstream.installed()
if INSTALLED is None:
    if os.environ.get("KVEST_REQUIRE_SGLANG", "0") not in ("", "0"):
        raise RuntimeError("KVEST_REQUIRE_SGLANG is set but sglang is not installed")
    pytest.skip("sglang is not installed (pip install --no-deps sglang==X)",
                allow_module_level=True)


def test_doctor_reports_and_passes(capsys):
    assert cli_main(["sglang", "--batches", "300"]) == 0
    out = capsys.readouterr().out
    assert f"sglang {INSTALLED.version} at" in out
    assert "a scheduler process here: mode on (KVEST_SGLANG is not set" in out
    # flat or nested, as the installed release reads
    assert "new_tokens_required_next_decode: replaced (decode_count/" in out
    assert out.rstrip().endswith("300 batches, 0 mismatches")
    # what the KV audit knows of this release, from the registry
    from kvest.sglang import audit

    known = audit.known_for(INSTALLED.version)
    assert (f"known findings of the KV audit in sglang {INSTALLED.version}: "
            f"{len(known) or 'none'}") in out
    for k in known:
        assert f"  {k.name}: {k.text} (" in out and k.reference in out


@pytest.mark.parametrize(("env", "says", "state"), [
    ({"KVEST_SGLANG": "0"}, "mode off (KVEST_SGLANG='0' turns kvest off)", "off"),
    ({"KVEST_SGLANG": "nope"}, "mode off (KVEST_SGLANG='nope' is not one of", "off"),
    ({"KVEST_SGLANG": "shadow"}, "mode shadow (KVEST_SGLANG='shadow')", "shadow"),
    ({"SGLANG_PLUGINS": "someone_else"},
     "mode off (SGLANG_PLUGINS='someone_else' does not list kvest", "off"),
    ({"SGLANG_PLUGINS": "someone_else,kvest"}, "mode on (KVEST_SGLANG is not set", "replaced"),
])
def test_doctor_reads_the_plugins_switches(env, says, state, capsys, monkeypatch):
    """The mode and its reason as the plugin would read them, and the hot spots'
    states as status() gives them in that mode; the parity run, whatever the
    mode, covers what kvest would replace when on."""
    monkeypatch.delenv("KVEST_SGLANG", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli_main(["sglang", "--batches", "20"]) == 0
    out = capsys.readouterr().out
    assert f"a scheduler process here: {says}" in out
    assert f"  new_tokens_required_next_decode: {state}" in out
    assert ("with kvest on, it would replace:" in out) == (state != "replaced")
    assert "new_tokens_required_next_decode: decode_count/" in out  # parity
    assert "not used" not in out


def test_doctor_checks_an_sglang_that_is_not_installed(capsys, tmp_path):
    """--sglang-root DIR: a copy of the installed release, edited inside a loop
    kvest compiles: the doctor says it is left alone, where, and stays exact."""
    import shutil

    for rel in ("sglang/_version.py", "sglang/srt/managers/schedule_batch.py",
                "sglang/srt/utils/common.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(INSTALLED.path(rel), tmp_path / rel)
    batch = tmp_path / "sglang/srt/managers/schedule_batch.py"
    text = batch.read_text()
    assert text.count("% page_size == 0") == 1
    batch.write_text(text.replace("% page_size == 0", "% page_size == 1"))
    assert cli_main(["sglang", "--batches", "100", "--sglang-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"sglang {INSTALLED.version} at {tmp_path}" in out
    # The edited loop is left alone (the function's selection is upstream's anyway:
    # its comprehension is faster than kvest's list).
    assert "new_tokens_required_next_decode: left alone" in out
    assert "decode_count/nested at line" not in out
    assert "differs from kvest's pattern decode_count/" in out and "== 1" in out
    assert "_new_tokens_required_next_decode_spec_v2: replaced" in out
    assert out.rstrip().endswith("100 batches, 0 mismatches")


def test_doctor_on_a_bad_root(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        cli_main(["sglang", "--sglang-root", str(tmp_path)])
    assert stop.value.code == 2
    assert "no sglang/srt/managers/schedule_batch.py" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli_main(["sglang", "--sglang-root", str(tmp_path / "nonexistent")])
    assert stop.value.code == 2
    assert "nonexistent: no such file or directory" in capsys.readouterr().err


def test_doctor_checks_every_replaced_hot_spot(capsys):
    """Every statement kvest swaps is compared, the writers included, and the
    report names the same hot spots, states and patterns as status()."""
    from kvest.sglang import monitor
    from kvest.sglang.registry import HOTSPOTS

    assert cli_main(["sglang", "--batches", "40"]) == 0
    out = capsys.readouterr().out
    for name in HOTSPOTS:
        assert f"\n  {name}: " in out, name
    import kvest.sglang

    with upstream.standin_tree(INSTALLED):
        handle = kvest.sglang.patch()
        try:
            report = monitor.status()["hotspots"]
            for target in handle.plan.targets:
                for swap in target.swaps:
                    line = (f"  {target.spot}: {swap.found.pattern.id} at line "
                            f"{swap.found.stmt.lineno}: ")
                    assert line in out, line
            for name, spot in report.items():
                if spot["state"] == "replaced":
                    assert f"  {name}: replaced ({', '.join(spot['patterns'])})" in out
        finally:
            handle.undo()


def test_doctor_leaves_no_temporary_folder(capsys, tmp_path, monkeypatch):
    """A wheel is read from a temporary folder that is gone afterwards."""
    import glob
    import tempfile
    import zipfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    wheel = tmp_path / f"sglang-{INSTALLED.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        from kvest.sglang.registry import files

        for rel in files():
            if INSTALLED.exists(rel):
                zf.write(INSTALLED.path(rel), rel)
    assert cli_main(["sglang", "--batches", "10", "--sglang-root", str(wheel)]) == 0
    assert "10 batches, 0 mismatches" in capsys.readouterr().out
    assert not glob.glob(str(tmp_path / "kvest-doctor-*"))


def test_doctor_survives_a_closed_pipe():
    """``| head -2``: the reader goes away; the exit status is still the verdict."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "kvest.sglang", "--batches", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""


def test_doctor_fails_on_a_mismatch(capsys, monkeypatch):
    monkeypatch.setattr(kvest, "decode_new_tokens_from_reqs", lambda *a, **k: -1)
    assert cli_main(["sglang", "--batches", "50"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH new_tokens_required_next_decode" in out
    assert "50 batches, 0 mismatches" not in out


def test_doctor_without_sglang(capsys, monkeypatch):
    monkeypatch.setattr(upstream, "installed", lambda: None)
    assert cli_main(["sglang"]) == 2
    assert "sglang is not installed" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--batches", "-3"], ["--batches", "x"], ["--seed", "-1"]])
def test_bad_doctor_flags_print_usage_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(["sglang", *argv])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("usage: python -m kvest sglang")


# (release, hot spot, what the doctor says): code the release lacks is absent;
# the release's own older statement, which kvest has no pattern for, is not recognised.
STATES = [
    ("0.5.11", "check_decode_mem", "absent",
     "check_decode_mem has no select_requests statement in this release"),
    ("0.5.16", "alloc_for_decode", "not recognised in this release",
     "is the shape of releases 0.5.16-0.5.18, which kvest has no kernel for"),
    ("0.5.23", "alloc_for_decode", "absent",
     "alloc_for_decode has no add_lengths_loop statement in this release"),
]


@pytest.mark.parametrize(("version", "spot", "state", "reason"), STATES,
                         ids=[f"{v}:{s}" for v, s, _, _ in STATES])
def test_doctor_says_absent_where_the_release_lacks_the_code(version, spot, state, reason,
                                                              capsys):
    """On the release's own files (the installed one, or its wheel in
    KVEST_SGLANG_WHEELS): a function without the statement -- 0.5.11's
    check_decode_mem, 0.5.23's alloc_for_decode, a dispatcher whose loop moved
    to alloc_for_decode_default -- is absent, not "not recognised"."""
    from sglang_releases import check_required, releases

    check_required(releases())  # a release CI asked for fails here, never skips
    tree = next((t for t in releases() if t.version == version), None)
    if tree is None:
        pytest.skip(f"sglang {version} is not at hand (KVEST_SGLANG_WHEELS)")
    assert cli_main(["sglang", "--batches", "5", "--sglang-root", str(tree.root)]) == 0
    out = capsys.readouterr().out
    assert f"\n  {spot}: {state}\n" in out
    block = out.split(f"\n  {spot}: {state}\n")[1].split("\n  ")[0]
    assert reason in block


# ------------------------------------------- progress on stderr, figures labelled

def test_doctor_shows_progress_on_stderr_and_keeps_stdout(capsys):
    """The parity run says what it runs, on stderr (a line per statement, the
    functions' batches in parts); stdout is the report alone."""
    from kvest.sglang import parity

    assert cli_main(["sglang", "--batches", "40"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0].startswith(f"kvest sglang: parity run on sglang {INSTALLED.version}")
    steps = [line for line in err if line.startswith("kvest sglang: [")]
    total = len(steps)
    assert total >= 2 and steps[-1] == (f"kvest sglang: [{total}/{total}] the replaced "
                                        "functions end to end, 40 batches")
    # one line per swapped statement, each named as the report names it
    for line in steps[:-1]:
        label = line.split("] ", 1)[1].rsplit(", ", 1)[0]
        assert f"  {label}: " in captured.out, label
    parts = [line for line in err if line.endswith(" of 40 batches")]
    assert len(parts) == parity.PROGRESS_PARTS - 1
    assert "kvest sglang:" not in captured.out
    assert captured.out.rstrip().endswith("40 batches, 0 mismatches")


def test_figures_are_labelled_where_not_measured_on_the_release_shown():
    from kvest.sglang.doctor import COSTS_MEASURED_ON, measured_on

    reason = ("line 2304 (batch_idx_loop/flat3): upstream's code is faster on this build "
              "(default): kvest's writer takes 754 instructions a request against the "
              "loop's 422; left to upstream")
    labelled = measured_on(reason, "0.5.11")
    assert labelled == reason.replace(
        "the loop's 422;", f"the loop's 422 (measured on {COSTS_MEASURED_ON});")
    assert measured_on(reason, COSTS_MEASURED_ON) == reason  # its own release: as is
    assert measured_on("not in this release", "0.5.11") == "not in this release"


def test_the_label_names_the_release_the_registry_was_measured_on():
    """doctor.COSTS_MEASURED_ON against the registry's own record of the wheel
    its Cost entries were measured on."""
    import inspect
    import re

    from kvest.sglang import doctor, registry

    wheels = set(re.findall(r"--wheel sglang-([0-9.]+)-", inspect.getsource(registry)))
    assert wheels == {doctor.COSTS_MEASURED_ON}


def test_the_doctors_figures_say_where_they_were_measured(capsys):
    """Every instruction count the doctor prints for the installed release is
    marked when that release is not the one measured, and only then."""
    from kvest.sglang.doctor import COSTS_MEASURED_ON

    assert cli_main(["sglang", "--batches", "5"]) == 0
    out = capsys.readouterr().out
    figures = [line for line in out.splitlines() if " instructions " in line]
    if not figures:
        pytest.skip(f"sglang {INSTALLED.version}: no hot spot left to upstream on figures")
    label = f"(measured on {COSTS_MEASURED_ON})"
    for line in figures:
        assert (label in line) == (INSTALLED.version != COSTS_MEASURED_ON), line
