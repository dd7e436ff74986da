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
    assert "shape:" in out and "replaced: ScheduleBatch.new_tokens_required_next_decode" in out
    assert out.rstrip().endswith("300 batches, 0 mismatches")


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
