"""``python -m kvest``: the demo, ``bench`` and the ``sglang`` doctor."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import kvest
from kvest import reference
from kvest._args import INT64_MAX, int_at_least
from kvest._bench.tables import fmt_time


def _best_of(fn: Callable[[], Any], repeat: int) -> tuple[Any, float]:
    """The result of fn() and its fastest time in seconds over `repeat` calls."""
    best = float("inf")
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


# The demo runs the pure-Python reference on every request of its batch, three
# times per estimator: seconds at a million requests, minutes beyond.  Above
# PROGRESS_FROM requests it says on stderr which estimator it is timing.
MAX_REQUESTS = 1_000_000
PROGRESS_FROM = 100_000


# The demo's committed lengths are drawn below this (allocated ones run up to
# one reserve beyond): the largest page size and config fit int64 beside it.
MAX_COMMITTED = 32_768


class Demo(NamedTuple):
    """The demo's batch and the calls it times, each estimator with its arguments."""

    reserve: int
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]]


def demo_batch(num_requests: int, page_size: int, config: tuple[int, int, int],
               seed: int) -> Demo:
    """The demo's random batch and its calls, each run once on kvest here: a
    value the kernels cannot take (a page size or config whose reserve, lengths
    or totals leave int64) raises ValueError with the reason before anything
    is printed, so that the command line can call it a usage error."""
    steps, topk, draft = config
    try:
        reserve = kvest.alloc_reserve_per_decode(steps, topk, draft, page_size)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"alloc_reserve_per_decode: {exc}") from None
    if reserve > INT64_MAX - 2 * MAX_COMMITTED:
        raise ValueError(f"the reserve R = {reserve:,} leaves no room in int64 for the "
                         f"batch's lengths (up to {MAX_COMMITTED:,} + R + 1)")
    rng = np.random.default_rng(seed)
    committed = rng.integers(1, MAX_COMMITTED, num_requests)
    # Allocation runs ahead of the committed length by up to one reserve.
    allocated = committed + rng.integers(0, reserve + 1, num_requests)
    selected = rng.choice(num_requests, num_requests // 2, replace=False)
    cases = [
        ("spec_v2_new_tokens", (committed, allocated, page_size, reserve), {}),
        ("spec_v2_new_tokens[half]", (committed, allocated, page_size, reserve),
         {"indices": selected}),
        ("decode_new_tokens", (committed, page_size), {}),
        ("spec_v1_new_tokens", (num_requests, page_size, steps, topk, draft), {}),
        ("num_new_pages[extend]", (committed + 1, page_size, committed), {}),
        ("num_new_pages[decode]", (committed + 1, page_size), {"decode": True}),
        ("alloc_len_per_decode", (steps, topk, draft, page_size), {}),
        ("decode_alloc_plan", (committed, allocated, page_size, reserve), {}),
    ]
    for label, args, kwargs in cases:  # kvest's kernels: milliseconds at 10**6 requests
        name = label.split("[")[0]
        try:
            getattr(kvest, name)(*args, **kwargs)
        except (OverflowError, ValueError) as exc:  # most messages name their function
            why = str(exc)
            raise ValueError(why if why.startswith(name) else f"{label}: {why}") from None
    return Demo(reserve, cases)


def demo(num_requests: int, page_size: int, config: tuple[int, int, int], seed: int,
         batch: Demo | None = None) -> int:
    batch = batch or demo_batch(num_requests, page_size, config, seed)
    reserve, cases = batch
    print(f"kvest {kvest.__version__} ({kvest.IMPLEMENTATION}"
          + (f", {kvest._kernels.cpu_variant()} loops" if kvest.IMPLEMENTATION == "cython" else "")
          + ")")
    print(f"decode batch: {num_requests} requests, page size {page_size}, "
          f"spec config (steps, topk, draft) = {config}, reserve R = {reserve}\n")
    header = (f"{'estimator':26} {'kvest':>12} {'reference':>12}  agree "
              f"{'kvest':>10} {'reference':>10}")
    print(header)
    print("-" * len(header))
    failures = 0
    for number, (label, args, kwargs) in enumerate(cases, 1):
        name = label.split("[")[0]
        if num_requests >= PROGRESS_FROM:
            print(f"[{number}/{len(cases)}] {label}: kvest, then the reference",
                  file=sys.stderr, flush=True)
        fast, t_fast = _best_of(
            lambda n=name, a=args, k=kwargs: getattr(kvest, n)(*a, **k), 50)
        slow, t_slow = _best_of(
            lambda n=name, a=args, k=kwargs: getattr(reference, n)(*a, **k), 3)
        if isinstance(fast, kvest.AllocPlan):
            agree = (np.array_equal(fast.nxt, slow.nxt)
                     and (fast.num_tokens, fast.num_pages) == (slow.num_tokens, slow.num_pages))
            fast, slow = fast.num_pages, slow.num_pages
            label += " pages"
        else:
            agree = fast == slow
        failures += not agree
        print(f"{label:26} {fast:>12} {slow:>12}  {'yes' if agree else 'NO':>5} "
              f"{fmt_time(t_fast):>10} {fmt_time(t_slow):>10}")
    print("\ntimes: fastest of 50 (kvest) and 3 (reference) calls on this machine; "
          "`python -m kvest bench` compares properly.")
    return 1 if failures else 0


DEFAULT_PLOT = "bench.png"
# What ``bench --plot`` says when matplotlib does not import: matplotlib is on
# the package index, kvest is not (its ``plot`` extra installs from a clone).
MATPLOTLIB_HINT = ('pip install matplotlib (or, in a clone of kvest, pip install ".[plot]")')


def unwritable(path: str) -> str | None:
    """Why a file cannot be written at ``path``, or None: checked before a
    benchmark of minutes, not found out after it."""
    folder = os.path.dirname(path) or "."
    if not os.path.exists(folder):
        return f"no such directory: {folder}"
    if not os.path.isdir(folder):
        return f"not a directory: {folder}"
    if os.path.isdir(path):
        return f"{path} is a directory"
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            return f"{path} is not writable"
    elif not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create files in {folder}"
    return None


def plot_problem(path: str) -> str | None:
    """Why ``bench --plot path`` could not draw its figures, or None: the
    folder, the file (and its ``-sglang`` twin), matplotlib, the format."""
    from kvest._bench.run import suffixed

    for target in (path, suffixed(path, "-sglang")):
        why = unwritable(target)
        if why:
            return why
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except Exception as exc:  # missing, or broken: either way no figure
        return (f"needs matplotlib, which does not import here ({type(exc).__name__}: "
                f"{exc}): {MATPLOTLIB_HINT}")
    ext = os.path.splitext(path)[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext and ext not in formats:
        return (f"matplotlib cannot write .{ext} files (it writes "
                f"{', '.join('.' + f for f in sorted(formats))})")
    return None


def parser() -> argparse.ArgumentParser:
    """The command line: the demo's flags, and the ``bench`` subcommand's."""
    top = argparse.ArgumentParser(
        prog="python -m kvest",
        epilog="Documentation: README.md and docs/ in the source distribution.")
    sub = top.add_subparsers(dest="command")
    # Parsed by kvest.sglang.doctor itself (main() hands it the rest of argv):
    # listed here so that --help shows it.
    sub.add_parser("sglang", help="check kvest against the installed SGLang (the doctor; "
                                  "python -m kvest sglang --help lists its options)")
    sub.add_parser("audit", help="run the installed SGLang's scheduler classes on the CPU and "
                                 "audit its decode estimate against what the KV pools hand "
                                 "out (python -m kvest audit --help lists its options)")
    top.add_argument("--requests", default=1024,
                     type=int_at_least(1, MAX_REQUESTS, ": the pure-Python reference runs on "
                                       "every request (python -m kvest bench times kvest)"),
                     help=f"requests in the demo's decode batch (1 to {MAX_REQUESTS:,}, "
                          f"default 1024; from {PROGRESS_FROM:,}, a progress line per "
                          "estimator on stderr)")
    top.add_argument("--page-size", type=int_at_least(1), default=16,
                     help="KV-cache page size in tokens (default 16)")
    top.add_argument("--config", type=int_at_least(0), nargs=3, default=(3, 2, 6),
                     metavar=("STEPS", "TOPK", "DRAFT"),
                     help="speculative config: steps, topk, draft tokens (default 3 2 6)")
    top.add_argument("--seed", type=int_at_least(0), default=0,
                     help="seed of the random batch (default 0)")
    bench = sub.add_parser(
        "bench", help="benchmark kvest against the alternatives",
        description="Time kvest beside a per-request Python loop, NumPy, Numba (when "
                    "installed) and the cost of reading the inputs once; on request objects "
                    "shaped like each SGLang release's; and, where SGLang's scheduler "
                    "imports, against SGLang's own code. Prints the tables and whether "
                    "each target is met.")
    bench.add_argument("--quick", action="store_true",
                       help="a shorter run, seconds rather than minutes: spec_v2 only "
                            "on arrays, page sizes 16 and 100, fewer batch sizes and "
                            "samples in every section; real SGLang on one pair of worker "
                            "processes at batch sizes 1 and 1,024")
    bench.add_argument("--plot", metavar="FILE.png", nargs="?", const=DEFAULT_PLOT,
                       help="also draw time per request (needs matplotlib); FILE.png "
                            f"defaults to {DEFAULT_PLOT}")
    bench.add_argument("--markdown", metavar="FILE.md",
                       help="also write the table as Markdown to FILE.md")
    bench.add_argument("--check", action="store_true",
                       help="exit status 1 when a measured target is MISSED (0 otherwise; "
                            "a target the run does not measure decides nothing)")
    bench.add_argument("--sglang", action="store_true",
                       help="only the real-SGLang section: the decode step's bookkeeping "
                            "against SGLang's own code (runs where sglang imports)")
    # From the registry of subcommands, so that a new one cannot be left out.
    top.description = (
        "Run kvest's estimators on a random decode batch, each beside its pure-Python "
        "twin: the answers must agree, and the times show what the compiled kernels save. "
        "Subcommands: " + "; ".join(f"{choice.dest} ({choice.help.split(' (')[0]})"
                                    for choice in sub._choices_actions) + ".")
    return top


def audit_numbers() -> argparse.ArgumentParser:
    """The audit's numeric flags, checked against int64 before its own parser
    (kvest.sglang.audit_run, which takes any Python int) sees them: a usage
    error, exit 2, like every other command's."""
    check = argparse.ArgumentParser(prog="python -m kvest audit", add_help=False)
    check.add_argument("--steps", type=int_at_least(1))
    check.add_argument("--seed", type=int_at_least(-INT64_MAX - 1))
    check.add_argument("--max-running", type=int_at_least(1))
    return check


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["sglang"]:  # the doctor has its own options
        from kvest.sglang.doctor import main as sglang_doctor

        return sglang_doctor(argv[1:])
    if argv[:1] == ["audit"]:  # the KV audit's driver has its own options
        from kvest.sglang.audit_run import main as audit_main

        audit_numbers().parse_known_args(argv[1:])
        return audit_main(argv[1:])
    top = parser()
    args = top.parse_args(argv)
    if args.command == "bench":
        # Before the run, not after it: a benchmark takes minutes.
        bench = next(a for a in top._actions if a.dest == "command").choices["bench"]
        if args.plot:
            if importlib.util.find_spec("matplotlib") is None:
                bench.error(f"--plot {args.plot}: needs matplotlib: {MATPLOTLIB_HINT}")
            why = plot_problem(args.plot)
            if why:
                bench.error(f"--plot {args.plot}: {why}")
        if args.markdown:
            why = unwritable(args.markdown)
            if why:
                bench.error(f"--markdown {args.markdown}: {why}")
        from kvest._bench.run import run

        return run(quick=args.quick, plot_path=args.plot, markdown=args.markdown,
                   sglang_only=args.sglang, check=args.check)
    config = tuple(args.config)
    try:
        batch = demo_batch(args.requests, args.page_size, config, args.seed)
    except ValueError as exc:
        top.error(f"--requests {args.requests} --page-size {args.page_size} --config "
                  f"{' '.join(map(str, config))}: {exc}")
    return demo(args.requests, args.page_size, config, args.seed, batch)
