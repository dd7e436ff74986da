"""``python -m kvest sglang`` (or ``python -m kvest.sglang``): is kvest right for this SGLang?

Finds the installed sglang (or the one ``--sglang-root`` names: a directory
holding ``sglang/``, or a release's wheel, to check a release before
upgrading), says what a scheduler process would do -- reading the same
switches as the plugin: ``KVEST_SGLANG``, ``SGLANG_PLUGINS`` and kvest's entry
point -- and reports every hot spot with the state and reason
:func:`kvest.sglang.status` and the log would give there (the same plan makes
all three), then runs the parity self-test (:mod:`kvest.sglang.parity`) on
every hot spot kvest replaces, the writers included.  sglang is never imported
(its functions are loaded from its files, see :mod:`kvest.sglang.upstream`), so
this works with ``pip install --no-deps sglang==X`` as well as in a full SGLang
environment; ``get_num_new_pages`` is checked where torch is installed.

Exit status: 0 kvest agrees with SGLang's code; 1 a mismatch; 2 a usage error
or no SGLang to check.  A closed pipe (``| head``) changes nothing but what is
printed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

from kvest.sglang import monitor, parity, registry, upstream
from kvest.sglang.monitor import Mode


def _say(text: str = "") -> None:
    """Print, or nothing once the reader has gone (``| head``): the run goes on
    to its verdict, which is the exit status."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail
        os.close(devnull)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process


def _progress(text: str) -> None:
    """A progress line on stderr: the parity run takes seconds to a minute, and
    stdout keeps only the report (its lines are what tests and scripts read)."""
    with contextlib.suppress(BrokenPipeError, ValueError):  # stderr gone: the run goes on
        print(f"kvest sglang: {text}", file=sys.stderr, flush=True)


def plain(text: str) -> str:
    """reStructuredText as a terminal shows it: ``:func:`~a.b``` is ``a.b()``,
    ````x```` is ``x`` (for ``--help``, which a user reads)."""
    text = re.sub(r":func:`~?([^`]+)`", r"\1()", text)
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvest sglang", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Documentation: docs/sglang.md in kvest's source "
                                            "distribution and repository.")
    # Checked as the other commands' flags are: a usage message and exit 2.
    from kvest._args import int_at_least

    parser.add_argument("--batches", type=int_at_least(1), default=2000,
                        help="random batches (default 2000)")
    parser.add_argument("--seed", type=int_at_least(0), default=0,
                        help="seed of the random batches (default 0)")
    parser.add_argument("--sglang-root", metavar="DIR_OR_WHEEL",
                        help="check this SGLang instead of the installed one: a directory "
                             "holding sglang/, or an sglang wheel")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        try:
            source = _source(args.sglang_root, stack)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        if source is None:
            _say("sglang is not installed here (pip install --no-deps sglang==X is enough "
                 "for this check, or name one with --sglang-root)")
            return 2
        return _check(source, args)
    return 2  # pragma: no cover - the block above always returns


def _check(source: upstream.SourceTree, args: argparse.Namespace) -> int:
    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch  # type: ignore[no-redef]
    import kvest
    from kvest.sglang.hotspots import plan
    from kvest.sglang.patch import Patch, apply

    _say(f"kvest {kvest.__version__} ({kvest.IMPLEMENTATION})")
    _say(f"sglang {source.version} at {source.root}")
    mode, reason = _switches(args.sglang_root is None)
    _say(f"a scheduler process here: mode {mode} ({reason})")
    _known_findings(source.version)
    with upstream.standin_tree(source, torch=torch) as tree:
        cls = tree.batch_class
        originals = {name: cls.__dict__[name] for name in
                     ("new_tokens_required_next_decode",
                      "_new_tokens_required_next_decode_spec_v2")}
        originals["page_aligned_decode_alloc_lens"] = tree.alloc_function(
            "page_aligned_decode_alloc_lens")
        originals["get_num_new_pages"] = tree.modules[registry.COMMON].get_num_new_pages
        if mode is not Mode.ON:
            # What status() and the log say in that mode, from the same plan.
            plan(import_modules=False, mode=mode, reason=reason, complete=True)
            _report("the hot spots, as status() and the log give them in that process:",
                    source.version)
            _say("with kvest on, it would replace:")
        # The stand-ins are every module the release has: nothing else is imported.
        # Kernels at every batch size: a small batch is checked on kvest's kernel,
        # not handed to upstream's statement as a scheduler would hand it.
        found = plan(import_modules=False, mode=Mode.ON, reason=reason, complete=True,
                     small_to_upstream=False)
        handle = Patch(found, apply(found.targets))
        try:
            if mode is Mode.ON:
                _report("the hot spots, as status() and the log give them in that process:",
                    source.version)
            else:
                _report(None, source.version)
            before = _fallbacks()
            _progress(f"parity run on sglang {source.version}: each statement kvest swaps, "
                      "then the whole functions (the verdict follows on stdout)")
            compared, mismatched = parity.self_test(tree, handle.plan, originals,
                                                    args.batches, args.seed, torch, _progress)
            declined = _fallbacks() - before
        finally:
            handle.undo()
    _say("parity with this installation's own code:")
    for name in compared:
        _say(f"  {name}: {compared[name]} compared, {mismatched[name]} mismatches")
    if declined:
        _say(f"  ({declined} calls met a corrupt (negative) length, put there on purpose: "
             "kvest declined them and SGLang's own code answered)")
    total = sum(mismatched.values())
    _say(f"{args.batches} batches, {total} mismatches")
    return 1 if total else 0


def _known_findings(version: str) -> None:
    """What the KV audit knows of this release (registry.KNOWN_FINDINGS), as its
    first WARNING and ``python -m kvest audit`` mark it."""
    from kvest.sglang.audit import known_for

    known = known_for(version)
    _say(f"known findings of the KV audit in sglang {version}: {len(known) or 'none'}")
    for k in known:
        fixed = f"fixed in {k.fixed_in}" if k.fixed_in else "not fixed in a release"
        _say(f"  {k.name}: {k.text} ({', '.join(k.allocators)}; {fixed}; {k.reference})")


def _fallbacks() -> int:
    return sum(s.fallbacks for s in monitor.STATE.spots.values())


# The release whose loops the registry's instruction counts (registry.Cost, in
# the reasons a kind is left to upstream) were measured on: the wheel
# tools/cachegrind_hotspots.py read (the comment above registry._COSTS names it;
# tests/test_sglang_doctor.py checks the two agree).
COSTS_MEASURED_ON = "0.5.23"
_FIGURES = re.compile(r"\d[\d,]* instructions")


def measured_on(reason: str, version: str) -> str:
    """``reason`` with each clause that quotes instruction counts marked
    "measured on 0.5.23" where the release shown is another: its own loop may
    touch other attributes (0.5.11's batch-index loop adds to three where 0.5.23's
    adds to one), and the counts are not its own."""
    if version == COSTS_MEASURED_ON:
        return reason
    return "; ".join(f"{part} (measured on {COSTS_MEASURED_ON})" if _FIGURES.search(part)
                     else part for part in reason.split("; "))


def _report(title: str | None, version: str) -> None:
    report = monitor.status()["hotspots"]
    if title is not None:
        _say(title)
    for name, spot in report.items():
        _say(f"  {name}: {spot['state']}" + (
            f" ({', '.join(spot['patterns'])})" if spot["patterns"] else ""))
        if spot["reason"] is not None:
            reason = spot["reason"]
            if reason == "torch is not loaded":
                reason = "needs torch to be checked here (not installed)"
            _say(f"    {measured_on(reason, version)}")


def _source(root: str | None, stack: contextlib.ExitStack) -> upstream.SourceTree | None:
    if root is None:
        return upstream.installed()
    path = Path(root)
    if not path.exists():
        raise ValueError(f"{root}: no such file or directory")
    if path.is_file():
        cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvest-doctor-"))
        return upstream.wheel(path, cache=cache)
    batch = registry.module_file(registry.BATCH)
    if not (path / batch).is_file():
        raise ValueError(f"{root}: no {batch} below it (not an SGLang tree)")
    # The version is only for the report (a wheel's sglang/_version.py has it).
    version = "unknown"
    for rel in ("sglang/_version.py", "sglang/version.py"):
        text = (path / rel).read_text() if (path / rel).is_file() else ""
        match = re.search(r"^__version__\s*=[^'\"\n]*['\"]([^'\"]+)['\"]", text, re.M)
        if match:
            version = match.group(1)
            break
    return upstream.SourceTree(path, version)


def _switches(installed: bool) -> tuple[Mode, str]:
    """The mode a scheduler process here would run in, and why, from the same
    switches the plugin reads."""
    import importlib.metadata

    choice = monitor.switch()
    suffix = "" if installed else "; for the SGLang named by --sglang-root"
    if choice.mode is Mode.OFF:
        return Mode.OFF, choice.reason + suffix
    plugins = monitor.plugins_reason()
    if plugins is not None:
        return Mode.OFF, plugins + ": kvest is not loaded" + suffix
    points = [ep for ep in importlib.metadata.entry_points(group=registry.PLUGINS)
              if ep.name == "kvest"]
    if not points:
        return Mode.OFF, ("kvest's entry point is not installed in this environment: kvest "
                          f"is not loaded (in a clone of kvest, {sys.executable} -m pip "
                          "install .)" + suffix)
    return choice.mode, choice.reason + suffix


def run() -> None:
    """``python -m kvest.sglang``."""
    sys.exit(main())

