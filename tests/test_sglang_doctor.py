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
    assert "a scheduler process here: kvest's kernels answer" in out
    assert "new_tokens_required_next_decode: replaced (select_requests at line" in out
    assert "decode_count/" in out  # flat or nested, as the installed release reads
    assert out.rstrip().endswith("300 batches, 0 mismatches")


@pytest.mark.parametrize(("env", "says"), [
    ({"KVEST_SGLANG": "0"}, "kvest OFF (KVEST_SGLANG turns it off)"),
    ({"KVEST_SGLANG": "nope"}, "kvest OFF: KVEST_SGLANG='nope' is not one of"),
    ({"KVEST_SGLANG": "shadow"}, "kvest runs beside upstream, upstream answers (shadow)"),
    ({"SGLANG_PLUGINS": "someone_else"}, "kvest not loaded (SGLANG_PLUGINS='someone_else'"),
    ({"SGLANG_PLUGINS": "someone_else,kvest"}, "kvest's kernels answer"),
])
def test_doctor_reads_the_plugins_switches(env, says, capsys, monkeypatch):
    monkeypatch.delenv("KVEST_SGLANG", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli_main(["sglang", "--batches", "20"]) == 0
    out = capsys.readouterr().out
    assert f"a scheduler process here: {says}" in out
    assert ("(not used: " in out) == ("kvest's kernels answer" not in says)


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
    # The edited loop is left alone; the function's other loop stays compiled.
    assert "new_tokens_required_next_decode: replaced (select_requests at line" in out
    assert "decode_count/nested at line" not in out
    assert "differs from kvest's pattern decode_count/" in out and "== 1" in out
    assert "_new_tokens_required_next_decode_spec_v2: replaced" in out
    assert out.rstrip().endswith("100 batches, 0 mismatches")


def test_doctor_on_a_wheel_and_on_a_bad_root(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        cli_main(["sglang", "--sglang-root", str(tmp_path)])
    assert stop.value.code == 2
    assert "no sglang/srt/managers/schedule_batch.py" in capsys.readouterr().err


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
