"""The README as a user reads it: the API tour runs and prints what it shows,
the headline table is the recorded run's, and nothing points outside the
repository."""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
needs_readme = pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests")


def _text() -> str:
    return README.read_text(encoding="utf-8")


@needs_readme
def test_api_tour_prints_what_it_shows():
    """Every ```pycon block, in order in one namespace, outputs compared (doctest)."""
    blocks = re.findall(r"```pycon\n(.*?)```", _text(), re.S)
    assert len(blocks) >= 3
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    namespace: dict = {}
    examples = 0
    for number, block in enumerate(blocks):
        test = parser.get_doctest(block, namespace, f"README pycon block {number}", str(README), 0)
        examples += len(test.examples)
        runner.run(test, clear_globs=False)
        namespace = test.globs  # DocTest copies its globals: carry them to the next block
    assert runner.failures == 0, f"{runner.failures} README example(s) print something else"
    assert examples >= 25
    # The difference the tour explains: the plan's token count against the estimate.
    plan = namespace["plan"]
    assert plan.num_tokens == 664 and plan.num_pages * 16 == 656


@needs_readme
def test_python_blocks_run():
    """Any ```python block (a snippet without outputs) runs as written."""
    namespace: dict = {"np": np}
    for block in re.findall(r"```python\n(.*?)```", _text(), re.S):
        exec(compile(block, str(README), "exec"), namespace)


@needs_readme
def test_headline_table_is_the_recorded_runs():
    """The README's short table is cut, by the generator, from docs/benchmarks.md."""
    spec = importlib.util.spec_from_file_location("update_readme",
                                                  ROOT / "tools" / "update_readme.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    results = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    sglang = gen._between(gen._between(results, gen.START, gen.END)[1],
                          gen.SGLANG_START, gen.SGLANG_END)[1]
    readme = _text()
    table = gen._between(readme, gen.TABLE_START, gen.TABLE_END)[1].strip()
    assert table == gen.headline_table(sglang)
    assert len(table.splitlines()) == 2 + len(gen.HEADLINE_ROWS)
    sentence = gen._between(readme, gen.HEADLINE_START, gen.HEADLINE_END)[1]
    assert sentence == gen.headline_sentence(sglang)


@needs_readme
def test_readme_is_for_users():
    """Short (the full tables are in docs/benchmarks.md), the two commands as
    CI runs them, the SGLang adoption section marked, nothing outside the repo."""
    text = _text()
    assert len(text.encode()) < 20_000
    tables = sum(len(line) + 1 for line in text.splitlines() if line.startswith("|"))
    assert tables < 0.25 * len(text)
    assert "pip install . && python -m kvest" in text
    assert 'pip install ".[test]" && pytest' in text
    # The adoption as it works without a package index: a wheel built in the
    # clone, installed with the pip of SGLang's environment.
    adoption = text.split("<!-- sglang-adoption:start -->")[1].split("<!-- sglang-adoption:end")[0]
    assert "pip wheel --no-deps -w dist ." in adoption
    assert "/bin/pip install dist/kvest-*.whl" in adoption
    assert text.count("<!-- sglang-adoption:start -->") == 1
    assert text.count("<!-- sglang-adoption:end -->") == 1
    for path in re.findall(r"\]\(([^)#]+)\)", text):
        assert not path.startswith(("/", "..")) and "://" not in path, path
        assert (ROOT / path).exists(), path


def test_no_path_outside_the_repository():
    """No file CI, the docs or the tools read names a folder beside the repository
    or a path of one machine."""
    if not (ROOT / ".ci" / "run").is_file():
        pytest.skip("not a checkout")
    files = [ROOT / ".ci" / "run", README, *(ROOT / "docs").glob("*.md"),
             *(ROOT / "tools").rglob("*.sh"), *(ROOT / "tools").rglob("*.py"),
             *(ROOT / "tools").rglob("*.md")]
    for path in files:
        text = path.read_text(encoding="utf-8")
        for bad in ("../shared", "shared/sglang-cpu", "/work/", "/root/", "/home/"):
            assert bad not in text, f"{path.relative_to(ROOT)} names {bad}"


# `pip install kvest`, `pip install "kvest[plot]"`, `pip install -U kvest`: an
# install from a package index, where kvest is not (yet).  A wheel's path
# (dist/kvest-*.whl) or the clone (`.`, ".[plot]") is not one.
_FROM_AN_INDEX = re.compile(r"""pip install\s+(?:-\S+\s+)*["']?kvest(?![-\w./])""")


def _install_hint_files() -> list[Path]:
    files = [README, *(ROOT / "docs").glob("*.md")]
    for folder in ("src", "tools"):
        for pattern in ("*.py", "*.pyx", "*.md", "*.sh", "*.txt"):
            files += [p for p in (ROOT / folder).rglob(pattern) if ".egg-info" not in str(p)]
    return [p for p in files if p.is_file()]


def test_index_install_hint_pattern():
    hits = ["pip install kvest", 'pip install "kvest[plot]"', "pip install -U kvest==0.1",
            "pip install kvest[test]", "`pip install kvest`."]
    misses = ["pip install dist/kvest-*.whl", 'pip install ".[plot]"', "pip install .",
              "pip install kvest-0.1.0-cp311-cp311-linux_x86_64.whl", "pip install kvestx",
              "pip install /path/to/kvest", "pip install ./kvest"]
    assert all(_FROM_AN_INDEX.search(s) for s in hits), hits
    assert not any(_FROM_AN_INDEX.search(s) for s in misses), misses


def test_no_install_from_an_index_but_for_a_published_release():
    """kvest is on no package index: every install hint (README, docs/, the
    messages in src/, tools/) builds or installs from a clone, except in a
    paragraph marked as being about a published release."""
    if not (ROOT / "docs").is_dir() or not README.is_file():
        pytest.skip("not a checkout")
    for path in _install_hint_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for paragraph in re.split(r"\n\s*\n", text):
            if _FROM_AN_INDEX.search(paragraph):
                assert "published release" in paragraph, (
                    f"{path.relative_to(ROOT)}: an install from a package index, "
                    f"unmarked:\n{paragraph}")


def _sentences(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("|"))
    return [" ".join(s.split()) for s in re.split(r"(?<=[.;:])\s+", prose)]


@needs_readme
def test_no_paragraph_is_said_twice():
    """Each sentence of the prose once: a paragraph repeated (the contract's
    pointer was) is one a reader reads twice and a maintainer edits once."""
    seen: dict[str, int] = {}
    for sentence in _sentences(_text()):
        if len(sentence) >= 40:
            seen[sentence] = seen.get(sentence, 0) + 1
    assert not [s for s, n in seen.items() if n > 1]
    assert _text().count("](docs/contract.md)") == 2  # the pointer, and the documentation list


def _error_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        match = re.match(r"\| `(\w+)` \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@needs_readme
def test_the_error_table_lists_outs_dtype_type_error():
    """``out=`` with a buffer kvest cannot write its plan into: the exception
    the code raises is the README's row that names it."""
    import kvest

    committed, allocated = np.array([5, 16]), np.array([8, 16])
    rows = _error_rows(_text())
    cases = [
        ("`out=` not a tuple of two native int32 or int64 buffers of one dtype",
         lambda: kvest.decode_alloc_plan(committed, allocated, 16, 8,
                                         out=(np.empty(2), np.empty(2)))),
        ("`out=` not a tuple of two native int32 or int64 buffers of one dtype",
         lambda: kvest.decode_alloc_plan(committed, allocated, 16, 8,
                                         out=(np.empty(2, ">i4"), np.empty(2, ">i4")))),
        ("`out=` not a tuple of two native int32 or int64 buffers of one dtype",
         lambda: kvest.decode_alloc_plan(committed, allocated, 16, 8,
                                         out=(np.empty(2, np.int32), np.empty(2, np.int64)))),
        ("`out=` not a tuple of two native int32 or int64 buffers of one dtype",
         lambda: kvest.decode_alloc_plan(committed, allocated, 16, 8,
                                         out=[np.empty(2, np.int64), np.empty(2, np.int64)])),
        ("a `dtype=` other than int32 or int64",
         lambda: kvest.decode_alloc_plan_from_reqs([], 16, 8, dtype=np.int16)),
    ]
    for words, call in cases:
        with pytest.raises(Exception) as raised:
            call()
        row = rows[type(raised.value).__name__]
        assert words in row, (words, raised.value)


@needs_readme
def test_range_is_said_alike_in_the_readme_and_the_contract():
    """A ``range`` is never iterated (its bounds are arithmetic) but is copied
    into kvest's own array, so the 2^32-row limit of copies holds for it: the
    README and docs/contract.md both say so, as the code does."""
    import kvest

    assert kvest.decode_new_tokens(range(0, 64, 16), 16) == 64
    with pytest.raises(ValueError, match="copies at most 2\\*\\*32 rows"):
        kvest.decode_new_tokens(range(2**32 + 1), 16)
    readme = " ".join(_text().split())
    assert "read by arithmetic, not item by item" not in readme
    assert ("`range` (never iterated: bounds checked by arithmetic, values computed into a "
            "copy, at most 2^32 rows)") in readme
    contract = " ".join((ROOT / "docs" / "contract.md").read_text(encoding="utf-8").split())
    assert "a `range` (never iterated: its bounds are checked by arithmetic, then its " \
           "values are computed into a copy)" in contract
    assert "An argument kvest must copy to read it (a `range`" in contract


def test_the_contract_promises_and_the_development_guide_walks():
    """docs/contract.md says what a call gives (the in-order loop's value,
    exception and position; the caller's collector state); how the compiled
    kernels walk a batch (address order, backward, the sort, the collector
    held off) is docs/development.md's, which the contract points to."""
    docs = ROOT / "docs"
    if not docs.is_dir():
        pytest.skip("docs/ is not beside the tests")
    contract = " ".join((docs / "contract.md").read_text(encoding="utf-8").split())
    guide = " ".join((docs / "development.md").read_text(encoding="utf-8").split())
    for how in ("address order", "last request to its first", "backward", "radix",
                "PyGC_Disable", "prefetch", "2,048", "32 KiB", "borrowed pointers"):
        assert how not in contract, how
        assert how in guide, how
    assert "always those of reading the selected requests in the order given" in contract
    assert "the caller's own collector state" in contract
    assert contract.count("[development.md](development.md)") == 2
