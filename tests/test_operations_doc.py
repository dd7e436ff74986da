"""docs/operations.md against the code: every KVEST_ variable the package (and
its build) reads is on the page, nothing else is, and KVEST_SGLANG accepts
exactly the values the page, docs/sglang.md and the warning give."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvest.sglang import monitor
from kvest.sglang.monitor import Mode

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "operations.md"
# A variable read is a string literal that is exactly its name (os.environ.get,
# flag(), a NAME_ENV constant); C macros and header guards are not strings.
READ = re.compile(r"""(["'])(KVEST_[A-Z0-9_]+)\1""")
ROW = re.compile(r"^\| `(KVEST_[A-Z0-9_]+)` \|", re.M)


def _sources() -> list[Path]:
    """What a user sets variables for: the installed package and its build
    (setup.py).  tools/, .ci and tests/ read the test suite's own variables,
    documented in docs/development.md."""
    package = ROOT / "src" / "kvest"
    return [*sorted(package.rglob("*.py")), *sorted(package.rglob("*.pyx")), ROOT / "setup.py"]


def _read_by(paths: list[Path]) -> set[str]:
    return {m.group(2) for p in paths for m in READ.finditer(p.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def page() -> str:
    if not PAGE.is_file() or not (ROOT / "src" / "kvest").is_dir():
        pytest.skip("the source tree is not beside the tests")
    return PAGE.read_text(encoding="utf-8")


def test_the_page_lists_every_variable_the_package_reads(page):
    read = _read_by(_sources())
    listed = set(ROW.findall(page))
    # the scan finds what it should: one read in Python, one in Cython, one in setup.py
    assert {"KVEST_SGLANG", "KVEST_CPU", "KVEST_PUBLIC_API_ONLY"} <= read
    assert read - listed == set(), "read but not on docs/operations.md"
    assert listed - read == set(), "on docs/operations.md but read nowhere"
    # and no other KVEST_ name anywhere on the page (prose included)
    assert set(re.findall(r"KVEST_[A-Z0-9_]+", page)) <= read


def test_the_scan_sees_a_new_variable(tmp_path):
    """The other direction: a read the page lacks is caught."""
    new = tmp_path / "new.py"
    new.write_text('import os\nos.environ.get("KVEST_SOMETHING_NEW", "")\n# KVEST_COMMENT\n')
    assert _read_by([new]) == {"KVEST_SOMETHING_NEW"}


def test_sglang_md_links_the_page():
    sglang = ROOT / "docs" / "sglang.md"
    if not sglang.is_file():
        pytest.skip("docs/ is not beside the tests")
    assert "(operations.md)" in sglang.read_text(encoding="utf-8")


def _documented_switch_values(page: str) -> set[str]:
    row = next(line for line in page.splitlines() if line.startswith("| `KVEST_SGLANG` |"))
    values = row.split(" | ")[2]
    return set(re.findall(r"`([^`]+)`", values.split("Any case")[0]))


def test_the_switch_accepts_exactly_the_documented_values(page):
    documented = _documented_switch_values(page)
    assert documented == set(monitor.SWITCH_VALUES) == {"1", "on", "shadow", "audit", "0", "off"}
    warning = monitor.switch({"KVEST_SGLANG": "typo"}).warning
    for value in documented:  # the warning names each accepted value
        assert re.search(rf"(^|[ /]){value}([,/ :]|$)", warning), value
    for value in documented:
        assert monitor.switch({"KVEST_SGLANG": value}).warning is None, value


@pytest.mark.parametrize("value", ["true", "yes", "y", "t", "false", "no", "n", "f", "TRUE",
                                   "enable", "2", "-1", "on off", "of", "1.0", "shadow,audit"])
def test_any_other_value_is_off_and_warns_quoting_it(value):
    got = monitor.switch({"KVEST_SGLANG": value})
    assert got.mode is Mode.OFF
    assert got.warning is not None and repr(value) in got.warning
    assert repr(value) in got.reason


@pytest.mark.parametrize(("value", "mode"), [
    ("ON", Mode.ON), (" on ", Mode.ON), ("1\n", Mode.ON), ("Shadow", Mode.SHADOW),
    ("\tAUDIT", Mode.AUDIT), ("OFF", Mode.OFF), (" 0 ", Mode.OFF),
])
def test_case_and_surrounding_whitespace_are_ignored(value, mode):
    got = monitor.switch({"KVEST_SGLANG": value})
    assert got.mode is mode and got.warning is None
    assert repr(value) in got.reason


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_is_as_unset(value):
    got = monitor.switch({"KVEST_SGLANG": value})
    assert got.mode is Mode.ON and got.warning is None
    assert repr(value) in got.reason and "empty" in got.reason
    assert monitor.switch({}).mode is Mode.ON


def test_the_page_says_how_values_are_read(page):
    text = " ".join(page.split())
    assert "whitespace ignored" in text and "Any case" in text
    assert "Empty counts as unset" in text
