"""``python -m kvest bench``: run the sections, print the tables and verdicts,
write the Markdown and the figures asked for."""

from __future__ import annotations

import functools
import os
import sys
import time

from kvest._bench import arrays, objects, sglang_step
from kvest._bench.targets import FLOOR, Verdict, summary, tally, verdicts
from kvest._bench.timing import machine

# (samples per cell, seconds per sample) for a full and a --quick run
FULL, QUICK = (9, 0.01), (5, 0.002)


def suffixed(path: str, suffix: str) -> str:
    """``out.png`` -> ``out-sglang.png``: the suffix before the file's extension."""
    stem, ext = os.path.splitext(path)
    return f"{stem}{suffix}{ext}"


def run(quick: bool = False, plot_path: str | None = None, markdown: str | None = None,
        sglang_only: bool = False, check: bool = False) -> int:
    """Arrays, request objects, and real SGLang where it imports; 0 when done
    (with ``check``: 1 when a measured target is missed)."""
    samples, target = QUICK if quick else FULL
    say = functools.partial(print, file=sys.stderr, flush=True)
    say(f"kvest bench{' --quick' if quick else ''}: {machine()}")
    start = time.perf_counter()
    rows = [] if sglang_only else arrays.run_matrix(
        arrays.QUICK_SIZES if quick else arrays.SIZES,
        arrays.QUICK_PAGE_SIZES if quick else arrays.PAGE_SIZES,
        arrays.FUNCTIONS[:1] if quick else arrays.FUNCTIONS, samples, target, progress=say)
    object_rows = [] if sglang_only else objects.run_objects(
        objects.QUICK_SIZES if quick else objects.SIZES, samples, target, progress=say)
    section = sglang_step.plan(quick)
    why_not: str | None = None
    try:
        steps = sglang_step.run_section(section, samples, target, progress=say)
    except sglang_step.Unavailable as exc:
        why_not, steps = str(exc), sglang_step.StepRows()
        if sglang_only:  # nothing else to run: say so, not a run of nothing
            say(f"bench --sglang: nothing to measure: {why_not}")
            return 2
    elapsed = time.perf_counter() - start
    print(f"\nmedian time per call, {samples} samples each, implementations interleaved; "
          f"{elapsed:.0f} s\n")
    parts: list[tuple[str, str]] = []  # (title, Markdown) for --markdown
    every: list[Verdict] = []  # every section's verdicts, for the summary and --check
    if rows:
        judged = arrays.targets(rows)
        every += judged
        print(arrays.table(rows), FLOOR, "", verdicts(judged, False), sep="\n", end="\n\n")
        parts += [("", arrays.table(rows, markdown=True)),
                  ("Targets:", verdicts(judged, True))]
    if object_rows:
        title = (f"Request objects (page size {objects.PAGE_SIZE}, R = {arrays.RESERVE}), "
                 "on stand-ins shaped like each release's own:")
        judged = objects.targets(object_rows)
        every += judged
        print(title, objects.table(object_rows), "", verdicts(judged, False),
              sep="\n", end="\n\n")
        # docs/benchmarks.md: the verdicts only (each release's ratios at 256,
        # 1,024 and 4,096 requests); the terminal has the table.
        parts += [("Targets on the release-shaped stand-ins (page size "
                   f"{objects.PAGE_SIZE}, R = {arrays.RESERVE}; kvest with the release's "
                   "layout against the release's loop):", verdicts(judged, True))]
    if steps:
        version = steps.version
        title = (f"The decode step in real sglang {version}, {section.pairs} "
                 f"{'pair' if section.pairs == 1 else 'pairs'} of processes, both sides "
                 f"timed in kvest's (see Method); page size {sglang_step.PAGE_SIZE}, "
                 "EAGLE (3, 1, 4): upstream → kvest (speedup):")
        head = sglang_step.headline(steps) or ""
        judged = sglang_step.targets(steps)
        every += judged
        print(title, sglang_step.table(steps), "", head, "", verdicts(judged, False), "",
              workers(steps.status), sep="\n")
        parts += [(title, sglang_step.table(steps, markdown=True)),
                  ("", f"**Headline: {head}.**"),
                  ("Targets on real requests:", verdicts(judged, True))]
    else:
        print(f"sglang section skipped: {why_not}")
    print("", summary(every, quick), sep="\n")
    if plot_path:
        from kvest._bench import plots

        if rows:
            plots.plot_arrays(rows, plot_path)
            print(f"\nplot written to {plot_path}")
        if steps:
            step_path = suffixed(plot_path, "-sglang")
            plots.plot_sglang(steps, step_path, steps.version or "?")
            print(f"plot written to {step_path}")
    if markdown:
        cmd = "python -m kvest bench" + (" --quick" if quick else "") + (
            " --sglang" if sglang_only else "")
        sections = "\n\n".join(f"{title}\n\n{text}" if title else text for title, text in parts)
        with open(markdown, "w", encoding="utf-8") as fh:
            fh.write(f"Measured with `{cmd}` on {machine()}; median time per call, "
                     f"{samples} samples per cell, implementations interleaved.\n\n"
                     f"{sections}\n")
        print(f"markdown written to {markdown}")
    return 1 if check and tally(every).missed else 0


def workers(status: dict | None) -> str:
    """What kvest's SGLang workers ran, checked before any cell was timed: a
    kvest that did not load stops the section, so a MISSED here is kvest's
    own time, not a plugin that failed."""
    kv = (status or {}).get("kvest") or {}
    spots = kv.get("hotspots") or {}
    replaced = sum(state == "replaced" for state in spots.values())
    return (f"kvest's workers: mode {kv.get('mode', '?')}, {replaced} of {len(spots)} hot "
            "spots replaced (checked before timing; upstream's workers run with kvest off)")
