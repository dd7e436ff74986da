"""``python -m kvest sglang``: is kvest right for the SGLang installed here?

Finds the installed sglang (or the one ``--sglang-root`` names: a directory
holding ``sglang/``, or a release's wheel, to check a release before
upgrading), says what a scheduler process would do -- reading the same
switches as the plugin: ``KVEST_SGLANG``, ``SGLANG_PLUGINS`` and kvest's entry
point -- and what kvest replaces there (or why not), then runs a parity
self-test: random batches through that installation's own functions and
through kvest's replacements, answers and exceptions compared.  sglang is
never imported (its functions are loaded from its files, see
:mod:`kvest.sglang.upstream`), so this works with
``pip install --no-deps sglang==X`` as well as in a full SGLang environment;
``get_num_new_pages`` is checked where torch is installed.  Exit status 1 on
any mismatch.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import random
from collections import Counter
from typing import Any

import numpy as np

from kvest.sglang import monitor, upstream

CONFIGS = [(3, 1, 4), (5, 1, 8), (3, 2, 6), (5, 4, 8), (5, 8, 64), (None, None, 4), (1, 1, 2)]
PAGE_SIZES = [1, 16, 32, 64, 128, 256]


# ------------------------------------------------------------------ the doctor's batches
# Requests and batches shaped like each release's, for the self-test.

@dataclasses.dataclass
class BeamGroup:
    """Stands in for a request's ``beam_group`` (0.5.19+)."""

    num_member_rows: int




@dataclasses.dataclass(slots=True)
class ReqKvInfo:
    """Stands in for ``req.kv`` (a ``slots=True`` dataclass in 0.5.19+)."""

    kv_committed_len: Any = 0
    kv_allocated_len: Any = 0


class Req:
    """A request with its lengths where ``layout`` (``flat``, ``mixed``, ``nested``) puts them."""

    def __init__(self, layout: str, committed: Any, allocated: Any,
                 beam_group: Any = None) -> None:
        if layout == "flat":
            self.kv_committed_len = committed
            self.kv_allocated_len = allocated
        elif layout == "mixed":
            self.kv_committed_len = committed
            self.kv = ReqKvInfo(kv_allocated_len=allocated)
        else:
            self.kv = ReqKvInfo(committed, allocated)
        self.beam_group = beam_group


def layout_name(layout: dict[str, str]) -> str:
    """``StandinTree.layout()`` as kvest's ``layout=`` name."""
    return {("flat", "flat"): "flat", ("flat", "nested"): "mixed",
            ("nested", "nested"): "nested"}.get(
        (layout.get("kv_committed_len", ""), layout.get("kv_allocated_len", "")), "unknown")


class Unpatched:
    """``batch`` as SGLang's original estimate must see it once kvest replaced
    the spec-v2 method on the class: the original method on the instance, every
    other attribute the batch's own.  ``original_estimate(Unpatched(batch,
    original_spec_v2), ...)`` is then SGLang's answer end to end."""

    def __init__(self, batch: Any, spec_v2: Any) -> None:
        self.__dict__["_batch"] = batch
        self.__dict__["_new_tokens_required_next_decode_spec_v2"] = (
            lambda requests, page_size: spec_v2(batch, requests, page_size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return ("raise", type(exc).__name__, str(exc))
    if isinstance(value, tuple):
        value = tuple(v.tolist() if isinstance(v, np.ndarray) else v for v in value)
    return ("ok", value)


def _page_size(rng: random.Random) -> int:
    return rng.choice(PAGE_SIZES) if rng.random() < 0.6 else rng.randint(1, 256)


def _requests(rng: random.Random, layout: str, page_size: int, beams: bool) -> list[Any]:
    reqs = []
    for _ in range(rng.randint(0, 64)):
        committed = rng.randint(0, 2**21) if rng.random() < 0.5 else rng.randint(0, 4 * page_size)
        allocated = committed + rng.randint(0, 3 * page_size + 160)
        if rng.random() < 0.1:
            allocated = rng.randint(0, committed)
        if rng.random() < 0.02:  # a corrupt length: kvest declines, upstream answers
            committed = -rng.randint(1, page_size)
        beam = BeamGroup(rng.randint(0, 8)) if beams and rng.random() < 0.2 else None
        reqs.append(Req(layout, committed, allocated, beam))
    return reqs


def self_test(tree: upstream.StandinTree, originals: dict[str, Any], batches: int,
              seed: int, torch: Any) -> tuple[Counter[str], Counter[str]]:
    """Run ``batches`` random batches; (comparisons, mismatches) per hot spot."""
    rng = random.Random(seed)
    layout = layout_name(tree.layout())
    beams = tree.has("beam_rows")
    eagle = tree.modules.get("sglang.srt.speculative.eagle_utils")
    alloc_lens = getattr(eagle, "page_aligned_decode_alloc_lens", None)
    if getattr(alloc_lens, "__kvest_original__", None) is None:
        alloc_lens = None
    common = tree.modules["sglang.srt.utils.common"]
    pages_fn = common.get_num_new_pages
    if getattr(pages_fn, "__kvest_original__", None) is None or torch is None:
        pages_fn = None
    estimate = vars(tree.batch_class).get("new_tokens_required_next_decode")
    spec_v2_original = originals["_new_tokens_required_next_decode_spec_v2"]
    replaced_estimate = getattr(estimate, "__kvest_original__", None) is not None
    replaced_spec_v2 = getattr(vars(tree.batch_class).get(
        "_new_tokens_required_next_decode_spec_v2"), "__kvest_original__", None) is not None
    compared: Counter[str] = Counter()
    mismatched: Counter[str] = Counter()

    def check(name: str, expected: Any, got: Any) -> None:
        compared[name] += 1
        if expected != got:
            mismatched[name] += 1
            if mismatched[name] <= 3:
                print(f"  MISMATCH {name}: upstream {expected}, kvest {got}")

    for _ in range(batches if replaced_estimate or replaced_spec_v2 or alloc_lens or pages_fn
                   else 0):
        p = _page_size(rng)
        steps, topk, draft = rng.choice(CONFIGS)
        spec = rng.random() < 0.5
        algorithm = "EAGLE" if spec else None
        tree.config = upstream.Config(algorithm, steps, topk, draft, p)
        reqs = _requests(rng, layout, p, beams)
        batch = tree.batch(reqs, p, algorithm, overlap=rng.random() < 0.5)
        n = len(reqs)
        selected = None
        if n and rng.random() < 0.5:
            selected = [rng.randint(-n, n - 1) for _ in range(rng.randint(0, 2 * n))]
        if replaced_estimate:
            check("new_tokens_required_next_decode",
                  _outcome(originals["new_tokens_required_next_decode"],
                           Unpatched(batch, spec_v2_original), selected),
                  _outcome(batch.new_tokens_required_next_decode, selected))
        if spec and replaced_spec_v2:
            check("_new_tokens_required_next_decode_spec_v2",
                  _outcome(originals["_new_tokens_required_next_decode_spec_v2"], batch, reqs, p),
                  _outcome(batch._new_tokens_required_next_decode_spec_v2, reqs, p))
        if alloc_lens is not None:
            reserve = rng.randint(0, 600)
            check("page_aligned_decode_alloc_lens",
                  _outcome(originals["page_aligned_decode_alloc_lens"], reqs, reserve=reserve,
                           page_size=p),
                  _outcome(alloc_lens, reqs, reserve=reserve, page_size=p))
        if pages_fn is not None:
            seq = [rng.randint(0, 2**21) for _ in range(n)]
            pre = [max(0, s - rng.randint(0, 300)) for s in seq]
            seq_t = torch.tensor(seq, dtype=torch.int64)
            pre_t = torch.tensor(pre, dtype=torch.int64)
            decode = rng.random() < 0.5
            check("get_num_new_pages",
                  _outcome(originals["get_num_new_pages"], seq_t, p, pre_t, decode),
                  _outcome(pages_fn, seq_t, p, pre_t, decode))
    return compared, mismatched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvest sglang", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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

    try:
        source = _source(args.sglang_root)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if source is None:
        print("sglang is not installed here (pip install --no-deps sglang==X is enough "
              "for this check, or name one with --sglang-root)")
        return 2
    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch  # type: ignore[no-redef]
    import kvest
    import kvest.sglang

    print(f"kvest {kvest.__version__} ({kvest.IMPLEMENTATION})")
    print(f"sglang {source.version} at {source.root}")
    verdict, mode = _switches(args.sglang_root is None)
    print(f"a scheduler process here: {verdict}")
    with upstream.standin_tree(source, torch=torch) as tree:
        cls = tree.batch_class
        originals = {name: cls.__dict__[name] for name in
                     ("new_tokens_required_next_decode",
                      "_new_tokens_required_next_decode_spec_v2")}
        originals["page_aligned_decode_alloc_lens"] = tree.alloc_function(
            "page_aligned_decode_alloc_lens")
        originals["get_num_new_pages"] = tree.modules["sglang.srt.utils.common"].get_num_new_pages
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the report below says it all
            handle = kvest.sglang.patch()
        try:
            report = monitor.status()
            print("what kvest matches in this release" + (
                "" if mode == "on" else f" (not used: {mode})") + ":")
            for name, spot in report["hotspots"].items():
                print(f"  {name}: {spot['state']}" + (
                    f" ({', '.join(spot['patterns'])})" if spot["patterns"] else ""))
                for note in spot["notes"]:
                    if note == "torch is not loaded":
                        note = "needs torch to be checked here (not installed)"
                    print(f"    {note}")
            compared, mismatched = self_test(tree, originals, args.batches, args.seed, torch)
            declined = sum(s["fallbacks"] for s in monitor.status()["hotspots"].values())
        finally:
            handle.undo()
    print("parity with this installation's own code:")
    for name in compared:
        print(f"  {name}: {compared[name]} compared, {mismatched[name]} mismatches")
    if declined:
        print(f"  ({declined} calls met a corrupt (negative) length, put there on purpose: "
              "kvest declined them and SGLang's own code answered)")
    total = sum(mismatched.values())
    print(f"{args.batches} batches, {total} mismatches")
    return 1 if total else 0


def _source(root: str | None) -> upstream.SourceTree | None:
    if root is None:
        return upstream.installed()
    from pathlib import Path

    path = Path(root)
    if path.is_file():
        return upstream.wheel(path, cache=_cache())
    if not (path / "sglang/srt/managers/schedule_batch.py").is_file():
        raise ValueError(f"{root}: no sglang/srt/managers/schedule_batch.py below it")
    # The version is only for the report (a wheel's sglang/_version.py has it).
    import re

    version = "unknown"
    for rel in ("sglang/_version.py", "sglang/version.py"):
        text = (path / rel).read_text() if (path / rel).is_file() else ""
        match = re.search(r"^__version__\s*=[^'\"\n]*['\"]([^'\"]+)['\"]", text, re.M)
        if match:
            version = match.group(1)
            break
    return upstream.SourceTree(path, version)


def _cache() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="kvest-doctor-")


def _switches(installed: bool) -> tuple[str, str]:
    """What the plugin would do in a scheduler process here, from the same
    switches it reads: (a sentence, the mode)."""
    import importlib.metadata
    import os

    mode, warning = monitor.mode()
    if warning is not None:
        return f"kvest OFF: {warning}", "off"
    if mode == "off":
        return "kvest OFF (KVEST_SGLANG turns it off): SGLang runs its own code", "off"
    allowed = os.environ.get("SGLANG_PLUGINS", "").strip()
    if allowed and "kvest" not in [p.strip() for p in allowed.split(",")]:
        return (f"kvest not loaded (SGLANG_PLUGINS={allowed!r} does not list it)",
                "off (SGLANG_PLUGINS)")
    points = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")
              if ep.name == "kvest"]
    if not points:
        return "kvest not loaded (its entry point is not installed)", "off (no entry point)"
    how = "kvest runs beside upstream, upstream answers (shadow)" if mode == "shadow" \
        else "kvest's kernels answer where listed below"
    return how + ("" if installed else " (for the SGLang named by --sglang-root)"), mode
