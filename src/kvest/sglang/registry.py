"""Every fact kvest knows about SGLang's hot spots, written once.

A :class:`HotSpot` is one SGLang function kvest may replace: the modules it has
lived in, its class (for a method), its name, and the kinds of statement it may
hold (:class:`Use`: a kind and what the function's own variables mean to it).
A :class:`Kind` is one kind of statement: how to pick it out of the function,
which of its variables the glue is passed and which it binds, whether it writes
to what it is given, and the fingerprints a human has read and proven a kernel
equal to (:class:`Accepted`).  The glue of kind ``k`` is
``kvest.sglang.glue.make_<k>``.

A kind also names the kvest function that answers (:class:`Kernel`: its
compiled home and its pure-Python twin), and what its code costs on each build
against upstream's (:class:`Cost` per :class:`Build`), from which the plan
decides, per build, whether to install it and from which batch size.  A hot
spot names its rows in the benchmarks' tables (:class:`Bench`, the cache
simulator's; :class:`Step`, the real-SGLang step benchmark's).

The plugin, :func:`kvest.sglang.status`, the doctor and its parity run, the
stand-in modules the doctor and the tests load from SGLang's files,
``tools/sglang_patterns.py`` (which writes ``patterns.json``),
``tools/cachegrind_hotspots.py``, ``kvest._bench.sglang_step``, the tests'
parametrisation and docs/sglang.md's table all read this module.  A new hot
spot is its records here, its kernel and the kernel's twin: a kind with no
glue of its own in :mod:`kvest.sglang.glue` is answered by the generic one
(tests/test_sglang_new_kind.py adds one so).  States and the kinds of note are
enums (:class:`State`, :class:`NoteKind`).
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "HELPERS",
    "HOTSPOTS",
    "KINDS",
    "Accepted",
    "Bench",
    "Build",
    "Cost",
    "HotSpot",
    "Kernel",
    "Kind",
    "Note",
    "NoteKind",
    "State",
    "Step",
    "Use",
    "deciding_build",
    "files",
    "installed_build",
    "module_file",
]


class State(enum.Enum):
    """What kvest did with a hot spot in this process."""

    REPLACED = "replaced"  # kvest's version runs
    SHADOW = "shadow"  # both run, upstream answers
    LEFT_ALONE = "left alone"  # in the release, not compiled: the notes say why
    NOT_RECOGNISED = "not recognised in this release"  # an older shape kvest has no pattern for
    SKIPPED = "skipped"  # another hook is there, torch is not loaded, KVEST_SGLANG_SKIP
    NOT_LOADED = "not loaded"  # its module is not imported in this process
    ABSENT = "absent"  # not in this release
    OFF = "off"  # kvest is off in this process

    def __str__(self) -> str:
        return self.value


class NoteKind(enum.Enum):
    """What a note says, so that nothing is decided by a note's wording."""

    EDITED = "edited"  # a statement or function differs from the pattern nearest to it
    HELPER = "helper"  # a name the statement reads is not the object kvest checked
    UNREADABLE = "unreadable"  # the source is not provably the code that runs
    FRAME = "frame"  # the function reads its own frame
    SCRATCH = "scratch"  # the loop's own variable is read outside it
    OLDER_SHAPE = "older shape"  # the release's own older statement: no pattern, no edit
    NO_STATEMENT = "no statement"  # the function holds no statement of the kind
    CALLERS = "callers"  # why a caller keeps upstream's lists (int32 arrays)
    SLOWER = "slower"  # upstream's statement is faster than kvest's kernel: left to it
    INFO = "info"  # anything else worth saying (not a decline)

    @property
    def declines(self) -> bool:
        """Whether the note says kvest left compiled code of this hot spot to upstream."""
        return self in _DECLINES


_DECLINES = frozenset({NoteKind.EDITED, NoteKind.HELPER, NoteKind.UNREADABLE,
                       NoteKind.FRAME, NoteKind.SCRATCH})


class Note(NamedTuple):
    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text


# ------------------------------------------------------------------ kinds of statement

def _assigned(stmt: ast.stmt) -> ast.expr | None:
    """The value a plain assignment binds (``x = v``, or ``x: T = v``)."""
    if isinstance(stmt, ast.Assign):
        return stmt.value
    if isinstance(stmt, ast.AnnAssign) and stmt.simple and isinstance(stmt.target, ast.Name):
        return stmt.value
    return None


def _assign_of_sum(stmt: ast.stmt) -> bool:
    value = _assigned(stmt)
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "sum")


def _is_for(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.For)


def _is_return(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Return)


def _selection(stmt: ast.stmt) -> bool:
    """``x = (a if c else [... for ... in ...])``: a list of selected requests."""
    value = _assigned(stmt)
    return isinstance(value, ast.IfExp) and isinstance(value.orelse, ast.ListComp)


def _for_writing(*attrs: str) -> Callable[[ast.stmt], bool]:
    """A ``for`` loop whose body assigns one of ``attrs`` on an object."""
    def select(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.For) and any(
            isinstance(target, ast.Attribute) and target.attr in attrs
            for node in stmt.body if isinstance(node, (ast.Assign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))
    return select


def _for_updating(attr: str) -> Callable[[ast.stmt], bool]:
    """A ``for`` loop that updates ``attr`` in place (``x.attr op= v``) anywhere
    in its body, so that an edited loop (a branch added, ``+= 2``) is still a
    candidate that kvest reports, not a loop it never saw."""
    def select(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.For) and any(
            isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute)
            and node.target.attr == attr for body in stmt.body for node in ast.walk(body))
    return select


class Accepted(NamedTuple):
    """A fingerprint a human has read and proven a kernel equal to."""

    prefix: str  # the digest's first 12 hex digits
    id: str
    layout: str | None = None  # where the request keeps its lengths: flat, mixed, nested
    reserve_factor: int = 1  # R = factor * the reserve variable
    reserve: str | None = None  # upstream's name of the reserve variable, if not "reserve"


class Build(enum.Enum):
    """A build of kvest's request kernels: what decides how many instructions
    they take, and so whether a kind is worth installing (:class:`Cost`)."""

    DEFAULT = "default"  # CPython's private internals, fenced (3.10-3.13)
    PUBLIC_API = "public API"  # KVEST_PUBLIC_API_ONLY=1, and every Python newer than 3.13

    def __str__(self) -> str:
        return self.value


def installed_build() -> Build:
    """The build installed here (``kvest._reqs._PUBLIC_API_ONLY``); the pure-Python
    twin, a test implementation, is decided as the default build."""
    import kvest

    if kvest.IMPLEMENTATION == "cython":
        from kvest import _reqs

        if getattr(_reqs, "_PUBLIC_API_ONLY", False):
            return Build.PUBLIC_API
    return Build.DEFAULT


# The build whose figures decide what is installed: None, as DECIDE_AS_ENV says,
# else the installed one.  (tools/cachegrind_hotspots.py measures kvest's code as
# the default build installs it, on every build, so that builds are compared on
# the same code; the test suite checks kvest's code on every build the same way,
# and tests/test_sglang_builds.py each build's own decisions.)
DECIDING: Build | None = None
DECIDE_AS_ENV = "KVEST_SGLANG_DECIDE_AS"  # "default" or "public API": for measuring


def deciding_build() -> Build:
    """The build whose figures decide (:data:`DECIDING`)."""
    if DECIDING is not None:
        return DECIDING
    import os

    wanted = os.environ.get(DECIDE_AS_ENV, "").strip()
    return next((b for b in Build if b.value == wanted), None) or installed_build()


class Cost(NamedTuple):
    """What tools/cachegrind_hotspots.py measured for a kind on one build
    (``--no-handoff``, release-shaped requests): instructions a request at 4,096,
    kvest's glue and kernel against upstream's statement, and the crossover."""

    kvest: int
    upstream: int
    # the smallest batch measured (1, 2, 4, ..., 128, 256, 1,024, 4,096) from which
    # kvest takes fewer instructions per call than upstream at every size measured;
    # None: at none of them (then kvest leaves the kind to upstream on that build)
    below: int | None = 0
    # why kvest leaves the kind to upstream where per request it is not slower
    why: str = ""


class Kernel(NamedTuple):
    """The kvest function that answers for a kind: ``name`` in ``module`` where
    the compiled kernels are served, in ``twin`` where the pure-Python twin is
    (``kvest`` itself serves the public functions as either)."""

    name: str
    module: str = "kvest"
    twin: str = "kvest"

    def resolve(self) -> Callable[..., Any]:
        """The function, looked up now (a test may have replaced it)."""
        import importlib

        import kvest

        home = self.twin if kvest.IMPLEMENTATION == "python" else self.module
        return getattr(importlib.import_module(home), self.name)  # type: ignore[no-any-return]


class Kind(NamedTuple):
    """One kind of statement kvest compiles (or, ``select`` None, a whole function)."""

    name: str
    summary: str  # what it computes, for docs/sglang.md
    kernel: str  # the kvest function that answers, for docs/sglang.md
    select: Callable[[ast.stmt], bool] | None
    accepted: tuple[Accepted, ...]
    inputs: tuple[str, ...] = ()  # roles the glue is passed, in order
    binds: str | None = ""  # role assigned from the glue (None: returned; "": neither)
    # the global names passed after the inputs (None: every global the statement reads)
    reads: tuple[str, ...] | None = None
    writes: bool = False  # changes what it is given: runs once (upstream's) in shadow mode
    # compiled only in the releases where it took an accepted shape; the older
    # shapes seen in releases (patterns.json's "older") are the release's own
    # code kvest has no kernel for, not edits
    older_shapes: bool = False
    paths: bool = False  # the glue is told the attribute paths the loop adds to
    # what each build's code costs against upstream's (measured): where kvest
    # is below upstream at no size measured, kvest leaves the kind to upstream
    # on that build and says so; else batches below the crossover go to
    # upstream's statement.  None: an array kernel's kind, whose code no build
    # switch changes (tools/instructions.py gates it)
    costs: Mapping[Build, Cost] | None = None
    # how the note names each side's code ("kvest's kernel", "the loop's")
    ours: str = "kernel"
    theirs: str = "loop's"
    # the input role holding the requests' list (``owner``: its ``.reqs``): the
    # rewritten function checks its size itself, before any call (rewrite.py)
    sized: str | None = None
    # a whole function answering arrays where upstream answers lists: below
    # this batch it answers upstream's lists (kvest's arrays cost its caller
    # more there; glue.make_alloc_lens_int32); 0: never
    lists_below: int = 0
    # the kvest function that answers; a kind with no glue of its own in
    # kvest.sglang.glue is answered by the generic glue (glue.make_kernel),
    # which calls it with the inputs
    function: Kernel | None = None

    @property
    def whole(self) -> bool:
        return self.select is None

    def slower(self, build: Build) -> str:
        """Why kvest leaves the kind to upstream on ``build`` ("" where it does not)."""
        cost = (self.costs or {}).get(build)
        if cost is None or cost.below is not None:
            return ""
        if cost.why:
            return f"upstream's code is faster on this build ({build}) where it runs: {cost.why}"
        return (f"upstream's code is faster on this build ({build}): kvest's {self.ours} "
                f"takes {cost.kvest:,} instructions a request against the {self.theirs} "
                f"{cost.upstream:,}")

    def below(self, build: Build) -> int:
        """The batch size from which kvest's kernel answers on ``build`` (0: every size)."""
        cost = (self.costs or {}).get(build)
        return cost.below or 0 if cost is not None else 0

    @property
    def upstream_faster(self) -> str:
        """:meth:`slower` on the deciding build (the installed one)."""
        return self.slower(deciding_build())

    @property
    def upstream_below(self) -> int:
        """:meth:`below` on the deciding build (the installed one)."""
        return self.below(deciding_build())


def _kinds(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


# What each kind's code costs on each build against upstream's (Cost): instructions
# a request at 4,096 release-shaped requests, and the crossover, from
#     python tools/cachegrind_hotspots.py --no-handoff --wheel sglang-0.5.23-...whl
# run once on each build (kvest built with KVEST_PUBLIC_API_ONLY=1 for the public
# API; docs/benchmarks.md).  Each is the hot spot's row in the tool's table: the
# no-spec count's, its shuffled selection's where that is the worse (the selection
# is what the retract loop counts); the writers make a new int for every write, as
# CPython's `+=` does, against CPython 3.11's specialised attribute stores.
_D, _P = Build.DEFAULT, Build.PUBLIC_API
_WRITER = "writer, making a new int for every write as CPython does,"
# (fewer a request from 64 requests on, but a call costs more below that, and
# the statement runs on every check_decode_mem, mostly with no selection at all)
_SELECT_CALLS = ("a call of its glue takes 4,972 instructions at one request against "
                 "the comprehension's 2,149, and check_decode_mem makes one every step")
_COSTS: Mapping[str, Mapping[Build, Cost]] = {
    "select_requests": {build: Cost(167, 226, None, _SELECT_CALLS) for build in (_D, _P)},
    # (the public API's readers, pure as the glue runs them, search each request's
    # instance dict whole: behind the fence no dict says its keys are all exact
    # str, and only a search proves no key would answer through its own __eq__.
    # The default build's shuffled selection is below upstream up to 1,024, 791
    # against 765 at 4,096.)
    "decode_count": {_D: Cost(238, 540, 0), _P: Cost(12_924, 757, None)},
    "spec_v2_total": {_D: Cost(122, 5_467, 0), _P: Cost(12_573, 5_471, None)},
    "beam_rows": {_D: Cost(212, 137, None), _P: Cost(12_071, 137, None)},
    # (the default build's glue is compiled, and answers at every size: a
    # crossover would take the Python glue's, which costs more a call)
    "beam_tail_loop": {_D: Cost(99, 425, 0), _P: Cost(12_074, 423, None)},
    "alloc_lens_loop": {_D: Cost(610, 3_243, 8), _P: Cost(13_010, 3_256, None)},
    # (the int32 form, not measured apart: the lists form's work less the lists;
    # on the default build it answers from one request on, as the step benchmark's
    # "alloc lens + 2 int32 tensors" shows)
    "alloc_lens_function": {_D: Cost(610, 3_243, 0), _P: Cost(13_010, 3_256, None)},
    "add_lengths_loop": {_D: Cost(577, 785, 16), _P: Cost(2_002, 786, None)},
    # (pure, as `max` is looked up on every pass: behind the fence that means a
    # whole-dict search of each request, twice)
    "max_allocated_loop": {_D: Cost(150, 1_624, 0), _P: Cost(25_461, 1_624, None)},
    "batch_idx_loop": {_D: Cost(754, 422, None), _P: Cost(1_088, 423, None)},
}

KINDS: Mapping[str, Kind] = _kinds(
    Kind("select_requests", "the list of selected requests", "`operator.itemgetter`",
         _selection, (Accepted("fca0c46ba1a5", "select_requests"),),
         inputs=("owner", "selected"), binds="target", older_shapes=True,
         costs=_COSTS["select_requests"], ours="list (its indices checked to be exact ints, "
         "then `operator.itemgetter`)", theirs="comprehension's"),
    Kind("decode_count", "the count of requests whose committed length is on a page boundary",
         "`decode_new_tokens_from_reqs`", _assign_of_sum,
         (Accepted("df1187ec4fb9", "decode_count/flat", "flat"),
          Accepted("720dd25ff1a7", "decode_count/nested", "nested")),
         inputs=("requests", "page_size"), binds="target", costs=_COSTS["decode_count"],
         sized="requests", function=Kernel("decode_new_tokens_from_reqs")),
    Kind("spec_v2_total", "the spec-v2 loop", "`spec_v2_new_tokens_from_reqs`", _is_for,
         (Accepted("a7767a028b04", "spec_v2_total/flat/2x", "flat", 2, "alloc_len"),
          Accepted("ac283f7fb881", "spec_v2_total/flat", "flat"),
          Accepted("b26520a658a2", "spec_v2_total/mixed", "mixed"),
          Accepted("5c9eaf01b495", "spec_v2_total/nested", "nested")),
         inputs=("total", "requests", "page_size", "reserve"), binds="total",
         costs=_COSTS["spec_v2_total"], sized="requests",
         function=Kernel("spec_v2_new_tokens_from_reqs")),
    Kind("beam_rows", "the member rows of the requests with a beam group",
         "`beam_member_rows_from_reqs`", _is_return, (Accepted("000952999d89", "beam_rows"),),
         inputs=("reqs",), binds=None, costs=_COSTS["beam_rows"], theirs="generator's",
         function=Kernel("beam_member_rows_from_reqs")),
    Kind("beam_tail_loop", "the loop collecting the beam groups' member rows, skipped when "
         "no request is in a beam group", "`beam_groups_from_reqs`", _is_for,
         (Accepted("12869f036c9f", "beam_tail_loop"),),
         # reads only; but append_beam_tail extends the batch when a request is in a group
         inputs=("owner",), reads=("enumerate",), writes=True, costs=_COSTS["beam_tail_loop"],
         sized="owner", function=Kernel("beam_groups_from_reqs")),
    Kind("alloc_lens_loop", "the loop filling `cur`, `nxt` and the total",
         "`decode_alloc_plan_from_reqs`, lists written whole", _is_for,
         (Accepted("41109038e55f", "alloc_lens_loop/nested", "nested"),),
         inputs=("reqs", "reserve", "page_size", "cur", "nxt", "total"), binds="total",
         costs=_COSTS["alloc_lens_loop"], sized="reqs",
         function=Kernel("decode_alloc_plan_from_reqs")),
    Kind("alloc_lens_function", "the whole function, for callers that make int32 tensors of "
         "its lists", "the plan as int32 arrays", None,
         (Accepted("c7fcaae0bb6b", "alloc_lens_function/nested", "nested"),),
         costs=_COSTS["alloc_lens_function"], lists_below=_COSTS["alloc_lens_loop"][_D].below or 0,
         function=Kernel("decode_alloc_plan_from_reqs")),
    Kind("get_num_new_pages", "the whole function", "`num_new_pages` on `Tensor.numpy()`",
         None, (Accepted("9bda6bd0efc8", "get_num_new_pages"),),
         function=Kernel("num_new_pages")),
    Kind("ceil_align", "the helper (checked, never replaced)", "", None,
         (Accepted("7b40dcca57e9", "ceil_align"),)),
    Kind("ceil_div", "the helper (checked, never replaced)", "", None,
         (Accepted("974e86067eb8", "ceil_div"),)),
    Kind("add_lengths_loop", "both lengths `+= token_per_req`", "`add_to_attrs`",
         _for_writing("kv_allocated_len", "kv_committed_len"),
         (Accepted("226feb6771b3", "add_lengths_loop/nested"),),
         inputs=("owner", "delta"), writes=True, older_shapes=True,
         costs=_COSTS["add_lengths_loop"], ours=_WRITER, sized="owner",
         function=Kernel("add_to_attrs")),
    Kind("max_allocated_loop", "the allocated length raised to the plan's", "`max_into_attr`",
         _for_writing("kv_allocated_len"), (Accepted("52ea9dba3a67", "max_allocated_loop/nested"),),
         inputs=("reqs", "values"), writes=True, older_shapes=True,
         costs=_COSTS["max_allocated_loop"], ours=_WRITER, function=Kernel("max_into_attr")),
    # `for req in <batch>.reqs: req.<path> += 1` for each path (written to patterns.json
    # from the statement, which the digest fixes): decode_batch_idx; then
    # kv_committed_len (flat2); then kv_allocated_len too (flat3)
    Kind("batch_idx_loop", "`req.decode_batch_idx += 1` (with the flat lengths before 0.5.19)",
         "`add_to_attrs`", _for_updating("decode_batch_idx"),
         (Accepted("cdc4dffc828b", "batch_idx_loop"),
          Accepted("c8bf94dc0a90", "batch_idx_loop/flat2"),
          Accepted("5df113efbe18", "batch_idx_loop/flat3")),
         inputs=("owner",), writes=True, older_shapes=True, paths=True,
         costs=_COSTS["batch_idx_loop"], ours=_WRITER, function=Kernel("add_to_attrs")),
)


# ------------------------------------------------------------------ where they live

BATCH = "sglang.srt.managers.schedule_batch"  # loaded: this process runs the scheduler
COMMON = "sglang.srt.utils.common"
ALLOCATION = "sglang.srt.mem_cache.allocation"
ALLOC_SIZING = "sglang.srt.mem_cache.allocation_sizing"
BEAM_TAIL = "sglang.srt.beam_search.batch_tail"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"


class Use(NamedTuple):
    """A kind of statement a hot spot holds, and what its variables mean there
    (role -> upstream's own name)."""

    kind: str
    roles: Mapping[str, str]


class Bench(NamedTuple):
    """A row of the benchmarks' tables for a hot spot: how its caller calls it, on
    release-shaped requests (``tools/cachegrind_hotspots.py``: ``label`` is the row
    and its ceilings' key).  The world's values a call names: ``batch`` (a
    stand-in ``ScheduleBatch``), ``eagle`` (the same with EAGLE on), ``reqs``,
    ``picked`` (every request's index, shuffled, as the retract loop selects),
    ``reserve`` and ``page_size``, and each upstream variable of a statement."""

    label: str
    what: str  # for the tables
    kind: str = ""  # a statement measured alone ("": the whole function as installed)
    args: tuple[str, ...] = ()  # what a whole function is passed, in order
    kwargs: tuple[str, ...] = ()  # ... and by name
    # the passes over the batch each side makes (kvest's, upstream's), for the tables
    passes: tuple[str, str] = ("", "")


class Step(NamedTuple):
    """A row of the real-SGLang step benchmark's loop table for a hot spot
    (``kvest._bench.sglang_step``): the hot spot called alone, as its caller
    calls it, on real ``Req``/``ScheduleBatch`` objects.  The world's values a
    call names: ``batch``, ``reqs``, ``picked`` (every request's index,
    shuffled), ``token_per_req`` (1), ``reserve`` (the configuration's),
    ``page_size``, ``cache`` and ``pool`` (the tree cache and the request pool),
    ``req_pool_indices``, ``cur``/``nxt``/``need`` (the alloc lens as int32
    tensors), ``next_seq_lens`` (the batch's CPU lengths plus one), ``true``."""

    label: str
    args: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, str], ...] = ()  # (parameter, the world's value)
    spec: bool = False  # the EAGLE world (else no speculation)
    via: str | None = None  # the module whose binding the caller calls, if not the home's
    tensors: bool = False  # the caller makes two int32 tensors of the first two results


class HotSpot(NamedTuple):
    """One SGLang function kvest may replace."""

    name: str
    modules: tuple[str, ...]  # where it has lived (the first that defines it)
    cls: str | None  # the class, for a method
    attr: str
    uses: tuple[Use, ...]
    # whole-function forms installed only where a caller's use of the result allows
    # (page_aligned_decode_alloc_lens as int32 arrays: INT32_CALLER_MODULES)
    forms: tuple[Use, ...] = ()
    bench: tuple[Bench, ...] = ()  # the cache simulator's rows
    steps: tuple[Step, ...] = ()  # the real-SGLang step benchmark's rows

    @property
    def qualname(self) -> str:
        return self.attr if self.cls is None else f"{self.cls}.{self.attr}"

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(u.kind for u in self.uses)

    @property
    def writes(self) -> bool:
        return any(KINDS[u.kind].writes for u in self.uses)


_SELECTED = {"target": "requests", "owner": "self", "selected": "selected_indices"}
# Passes over the batch each benchmark row makes, kvest's and upstream's (Bench),
# read from src/kvest/sglang/glue.py, src/kvest/_reqs.pyx, src/kvest/_src/addrorder.h
# and reqwrite.h, and from upstream's code (n >= 2,048, the batch's list in creation
# order; "pointers" reads only a list's array, "objects" reads or writes every
# request; below 2,048 requests kvest neither checks the order, nor sorts, nor walks
# backward).
_ESTIMATE_PASSES = (
    "3: pointers (address-order check), pointers (the list reversed), objects (count, last "
    "to first); then upstream's `num_beam_member_rows`: objects",
    "2: objects (count); objects (beam rows)")
_SELECTION_PASSES = (
    "12 -- 6 over the requests: upstream's comprehension (objects: incref); the count: "
    "pointers (check), pointers (min/max), 4 pointers (2-digit radix sort: count, scatter), "
    "objects (incref), objects (walk in address order), objects (decref); upstream's beam "
    "rows (objects); the list freed (objects: decref)",
    "4 -- 4 over the requests: the comprehension (objects: incref), objects (count), "
    "objects (beam rows), the list freed (objects: decref)")

HOTSPOTS: Mapping[str, HotSpot] = {h.name: h for h in (
    HotSpot("new_tokens_required_next_decode", (BATCH,), "ScheduleBatch",
            "new_tokens_required_next_decode",
            (Use("select_requests", _SELECTED),
             Use("decode_count", {"target": "new_pages", "requests": "requests",
                                  "page_size": "page_size"})),
            bench=(Bench("estimate", "`new_tokens_required_next_decode()`", args=("batch",),
                         passes=_ESTIMATE_PASSES),
                   Bench("estimate, selection", "`new_tokens_required_next_decode(selected)`, "
                         "every request selected in a shuffled order", args=("batch", "picked"),
                         passes=_SELECTION_PASSES),
                   Bench("estimate, EAGLE", "`new_tokens_required_next_decode()`, EAGLE (the "
                         "spec-v2 loop)", args=("eagle",), passes=(
                             "3: pointers (address-order check), pointers (the list reversed), "
                             "objects (the spec-v2 rows, last to first)",
                             "1: objects (the loop)"))),
            steps=(Step("estimate no-spec"), Step("estimate spec", spec=True),
                   Step("estimate spec, shuffled selection", ("picked",), spec=True))),
    HotSpot("check_decode_mem", (BATCH,), "ScheduleBatch", "check_decode_mem",
            (Use("select_requests", _SELECTED),),
            bench=(Bench("check_decode_mem selection", "`check_decode_mem`'s own list of the "
                         "selected requests", "select_requests", passes=(
                             "left to upstream; kvest's list would take 5 -- 3 over the "
                             "requests: indices unpacked into an argument tuple; itemgetter's "
                             "tuple (objects: incref); `list()` of it (objects: incref); the "
                             "tuple freed (objects: decref); the argument tuple freed",
                             "1: the comprehension (objects: incref)")),)),
    HotSpot("_new_tokens_required_next_decode_spec_v2", (BATCH,), "ScheduleBatch",
            "_new_tokens_required_next_decode_spec_v2",
            (Use("spec_v2_total", {"total": "total", "requests": "requests",
                                   "page_size": "page_size", "reserve": "reserve"}),)),
    HotSpot("page_aligned_decode_alloc_lens", (ALLOC_SIZING,), None,
            "page_aligned_decode_alloc_lens",
            (Use("alloc_lens_loop", {"reqs": "reqs", "reserve": "reserve",
                                     "page_size": "page_size", "cur": "cur_kv_lens",
                                     "nxt": "nxt_kv_lens", "total": "num_needed_tokens"}),),
            forms=(Use("alloc_lens_function", {}),),
            bench=(Bench("alloc lens", "`page_aligned_decode_alloc_lens` (lists)", args=("reqs",),
                         kwargs=("reserve", "page_size"), passes=(
                             "8 -- 1 over the requests: 2 lists `[0] * n` (upstream's own "
                             "lines); pointers (the list reversed); objects (the plan, last to "
                             "first, into 2 arrays); 2 `tolist()` (2n new ints); 2 slice "
                             "assignments", "3 -- 1 over the requests: 2 lists `[0] * n`; "
                             "objects (n new ints for nxt)")),),
            steps=(Step("alloc lens + 2 int32 tensors", ("reqs",),
                        (("reserve", "reserve"), ("page_size", "page_size")), spec=True,
                        via=EAGLE_UTILS, tensors=True),)),
    HotSpot("get_num_new_pages", (COMMON,), None, "get_num_new_pages",
            (Use("get_num_new_pages", {}),),
            steps=(Step("get_num_new_pages decode", kwargs=(
                       ("seq_lens", "next_seq_lens"), ("page_size", "page_size"),
                       ("decode", "true"))),
                   Step("get_num_new_pages extend", kwargs=(
                       ("seq_lens", "nxt"), ("page_size", "page_size"), ("prefix_lens", "cur")),
                        spec=True))),
    HotSpot("alloc_for_decode", (ALLOCATION,), None, "alloc_for_decode",  # 0.5.19-0.5.21
            (Use("add_lengths_loop", {"owner": "batch", "delta": "token_per_req"}),)),
    HotSpot("alloc_for_decode_default", (ALLOCATION,), None, "alloc_for_decode_default",
            (Use("add_lengths_loop", {"owner": "batch", "delta": "token_per_req"}),),
            bench=(Bench("alloc_for_decode_default loop", "`alloc_for_decode_default`'s adding "
                         "loop", "add_lengths_loop", passes=("1: objects (2 new ints each)",
                                                             "1: objects (2 new ints each)")),),
            steps=(Step("alloc_for_decode_default", ("batch", "token_per_req")),)),
    HotSpot("prepare_for_decode", (BATCH,), "ScheduleBatch", "prepare_for_decode",
            (Use("batch_idx_loop", {"owner": "self"}),),
            bench=(Bench("prepare_for_decode loop", "`prepare_for_decode`'s batch-index loop",
                         "batch_idx_loop", passes=(
                             "left to upstream; kvest's writer would take 1: objects (a new "
                             "int each, stored with a dict lookup)",
                             "1: objects (a new int each)")),)),
    HotSpot("num_beam_member_rows", (BEAM_TAIL,), None, "num_beam_member_rows",
            (Use("beam_rows", {"reqs": "reqs"}),),
            bench=(Bench("num_beam_member_rows", "`num_beam_member_rows`", "beam_rows", passes=(
                "left to upstream; kvest's kernel would take 2: pointers (check), objects",
                "1: objects")),)),
    # ("offset": the running row offset, set before the loop and changed only past
    # its `continue`, which the kernel's answer -- no request in a beam group --
    # proves the loop never reaches: skipping the loop leaves it as is.)
    HotSpot("append_beam_tail", (BEAM_TAIL,), None, "append_beam_tail",
            (Use("beam_tail_loop", {"owner": "batch", "offset": "t"}),),
            bench=(Bench("append_beam_tail loop", "`append_beam_tail`'s loop", "beam_tail_loop",
                         passes=("2: pointers (check), objects", "1: objects")),),
            steps=(Step("append_beam_tail", ("batch",)),)),
    HotSpot("eagle_prepare_for_decode", (EAGLE_UTILS,), None, "eagle_prepare_for_decode",
            (Use("batch_idx_loop", {"owner": "batch"}),)),
    HotSpot("alloc_for_spec_decode", (ALLOCATION,), None, "alloc_for_spec_decode",
            (Use("max_allocated_loop", {"reqs": "reqs", "values": "nxt_kv_lens_list"}),),
            bench=(Bench("alloc_for_spec_decode loop", "`alloc_for_spec_decode`'s max loop",
                         "max_allocated_loop", passes=(
                             "2: objects (read, then a write each), the values (pointers)",
                             "1: objects, the values zipped in")),),
            steps=(Step("alloc_for_spec_decode", ("cache", "pool"), (
                ("reqs", "reqs"), ("req_pool_indices", "req_pool_indices"),
                ("cur_kv_lens", "cur"), ("cur_kv_lens_cpu", "cur"), ("nxt_kv_lens", "nxt"),
                ("nxt_kv_lens_cpu", "nxt"), ("num_needed_tokens", "need"), ("batch", "batch")),
                spec=True),)),
)}

# Functions a pattern calls by name, matched whole and checked, never replaced.
HELPERS: Mapping[str, HotSpot] = {h.name: h for h in (
    HotSpot("ceil_align", (COMMON,), None, "ceil_align", (Use("ceil_align", {}),)),
    HotSpot("ceil_div", (COMMON,), None, "ceil_div", (Use("ceil_div", {}),)),
)}

# Where the int32 form of page_aligned_decode_alloc_lens may go: the modules whose
# functions may hand its two lists straight to torch.tensor(..., dtype=torch.int32).
INT32_CALLER_MODULES = (EAGLE_UTILS, "sglang.srt.speculative.dflash_info_v2",
                        "sglang.srt.speculative.uno_info")

# What the stand-in modules need beside the hot spots: the settings the bookkeeping
# reads (get_alloc_len_per_decode & co., whose home moved, newest first), the batch's
# own helpers, the release's version and its plugin framework.
ALLOC_SETTINGS_MODULES = (ALLOC_SIZING, "sglang.srt.mem_cache.common",
                          "sglang.srt.managers.utils")
ALLOC_SETTINGS = ("get_alloc_page_size", "get_alloc_len_per_decode",
                  "get_alloc_reserve_per_decode")
BATCH_HELPERS = ("is_spec_v2",)
VERSION_MODULE = "sglang.version"
PLUGINS = "sglang.srt.plugins"  # load_plugins(); also the entry points' group
HOOK_REGISTRY = "sglang.srt.plugins.hook_registry"
PLUGIN_MODULES = (f"{PLUGINS}.__init__", HOOK_REGISTRY)
# The point after which a scheduler process has configured logging (HookType.AFTER).
SCHEDULER = "sglang.srt.managers.scheduler"
LOGGING_CONFIGURED = f"{SCHEDULER}.configure_scheduler_process"
# The stand-ins' settings: server args, the speculative algorithm, the runtime context.
SERVER_ARGS = "sglang.srt.server_args"
SPEC_INFO = "sglang.srt.speculative.spec_info"
RUNTIME_CONTEXT = "sglang.srt.runtime_context"
ENVIRON = "sglang.srt.environ"


def module_file(module: str) -> str:
    """The file of an sglang module, relative to the directory holding ``sglang/``."""
    return module.replace(".", "/") + ".py"


def files() -> tuple[str, ...]:
    """Every file of a release kvest reads (whichever of them exist)."""
    modules = [VERSION_MODULE, BATCH, *ALLOC_SETTINGS_MODULES, *INT32_CALLER_MODULES,
               *PLUGIN_MODULES]
    for spot in (*HOTSPOTS.values(), *HELPERS.values()):
        modules += spot.modules
    return tuple(dict.fromkeys(module_file(m) for m in modules))


# ------------------------------------------------------------------ the audit's facts
# (kvest.sglang.audit: the estimate the decode step's check decided on, against
# what the KV pools then hand out; read from 0.5.23's own classes)

ALLOCATOR_BASE = "sglang.srt.mem_cache.allocator.base"
# SpeculativeAlgorithm's predicates for the families the audit command's driver
# treats apart, newest first (is_dflash_family, with DSPARK: 0.5.17+; is_uno: 0.5.20+)
SPEC_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "dflash": ("is_dflash_family", "is_dflash"), "uno": ("is_uno",), "ngram": ("is_ngram",)}
# The speculative decode preparation (0.5.15+): the batch calls it; before, the
# batch calls its draft input's own prepare_for_decode, the class by family
# (a spec-v2 batch only, as the release's ScheduleBatch.is_spec_v2 says, where it
# has one; the others' KV is allocated by the speculative worker, on a model).
SPEC_PREPARE = ("sglang.srt.speculative.spec_utils", "spec_prepare_for_decode")
DRAFT_INPUTS: Mapping[str, tuple[str, str]] = {
    "eagle": ("sglang.srt.speculative.eagle_info", "EagleDraftInput"),
    "ngram": ("sglang.srt.speculative.ngram_info", "NgramVerifyInput"),
    "dflash": ("sglang.srt.speculative.dflash_info_v2", "DFlashDraftInputV2")}
# The request-to-token writer (a Triton kernel; the audit command's driver stands
# it in): its homes, newest first (before 0.5.16 the speculative utilities').
ASSIGN = "assign_req_to_token_pool_func"
ASSIGN_HOMES = (ALLOCATION, "sglang.srt.speculative.spec_utils",
                "sglang.srt.speculative.triton_ops.cache_locs")


class Attach(NamedTuple):
    """An SGLang method the audit wraps: ``cls.attr`` in the first of ``modules``
    that defines it."""

    modules: tuple[str, ...]
    cls: str
    attr: str


# The decode check's own question to the allocator (0.5.19+): check_decode_mem
# passes it the estimate (num_tokens) and the requests it counted; the retract
# loop asks again after each request it removes.
CAPACITY_CHECK = Attach((ALLOCATOR_BASE,), "BaseTokenToKVPoolAllocator",
                        "check_decode_capacity")
# Before it (0.5.11-0.5.18): check_decode_mem takes the estimate from
# new_tokens_required_next_decode(selected_indices), hands it to the batch module's
# evict_from_tree_cache(tree_cache, num_tokens) and compares it with the
# allocator's available_size() itself: the estimate it decided on is what it
# passed there (the estimate function itself is a hot spot kvest may replace).
DECODE_CHECK = Attach((BATCH,), "ScheduleBatch", "check_decode_mem")
DECODE_EVICT = (BATCH, "evict_from_tree_cache")  # a global of the batch's module
# The decode step's allocation: alloc_for_decode without speculation, the
# speculative algorithm's own preparation with it (spec_prepare_for_decode ->
# eagle_prepare_for_decode, DFlash's and UNO's prepare_for_decode), all inside it.
DECODE_STEP = Attach((BATCH,), "ScheduleBatch", "prepare_for_decode")
# The underlying pools: every allocator ends in these, and what they hand out
# is counted at their own allocation methods (a free-size difference across
# the call, which the method itself only lowers).
POOL_ALLOCS = ("alloc", "alloc_extend", "alloc_decode")
POOLS = (Attach(("sglang.srt.mem_cache.allocator.token", "sglang.srt.mem_cache.allocator"),
                "TokenToKVPoolAllocator", ""),
         Attach(("sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.allocator"),
                "PagedTokenToKVPoolAllocator", ""))


# The allocator families known findings and the audit command name, by class
ALLOCATOR_FAMILIES: Mapping[str, str] = {
    "TokenToKVPoolAllocator": "token", "PagedTokenToKVPoolAllocator": "paged",
    "SWATokenToKVPoolAllocator": "swa", "PureSWATokenToKVPoolAllocator": "pure-swa",
    "HiSparseTokenToKVPoolAllocator": "hisparse"}
# The audit command's allocators, each in the first of its homes (newest first:
# one module, sglang.srt.mem_cache.allocator, before the package of 0.5.13; SWA's
# and HiSparse's beside their KV pools before that; pure SWA from 0.5.15).
DRIVEN_ALLOCATORS: Mapping[str, tuple[str, ...]] = {
    "TokenToKVPoolAllocator": POOLS[0].modules,
    "PagedTokenToKVPoolAllocator": POOLS[1].modules,
    "SWATokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator.swa",
                                  "sglang.srt.mem_cache.swa_memory_pool"),
    "PureSWATokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator.swa",),
    "HiSparseTokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator.hisparse",
                                       "sglang.srt.mem_cache.hisparse_memory_pool")}


class Composite(NamedTuple):
    """An allocator made of underlying pools (attributes), and the pool whose
    tokens the requests' ``kv_allocated_len`` records."""

    pools: tuple[str, ...]
    recorded: str


COMPOSITES: Mapping[str, Composite] = {
    # SWA (0.5.13+): a full pool and a sliding-window pool (one object for pure SWA)
    "SWATokenToKVPoolAllocator": Composite(("full_attn_allocator", "swa_attn_allocator"),
                                           "full_attn_allocator"),
    # HiSparse (0.5.14+): logical KV, and the device buffers HiSparseCoordinator grows
    "HiSparseTokenToKVPoolAllocator": Composite(
        ("logical_attn_allocator", "hisparse_attn_allocator"), "logical_attn_allocator"),
}
# Where the requests keep their lengths (flat before 0.5.16; under req.kv since)
KV_INFO = "kv"
ALLOCATED, COMMITTED = "kv_allocated_len", "kv_committed_len"


class KnownFinding(NamedTuple):
    """A finding of the audit that kvest knows in SGLang: what it is, the
    findings (audit kind, pool) and allocator families it shows as, the
    releases it appears in, upstream's reference, and the configurations:
    the speculative algorithms (none named: any, or none) and the smallest
    page size it shows at."""

    name: str
    text: str
    shows_as: tuple[tuple[str, str], ...]  # (kvest.sglang.audit.Kind value, pool)
    allocators: tuple[str, ...]  # the audit command's allocator families
    releases: tuple[str, str | None]  # first and last release it appears in (None: any since)
    fixed_in: str | None
    reference: str
    speculation: tuple[str, ...] = ()
    min_page: int = 1


# Read from each release's own classes (the audit command on 0.5.13-0.5.23).
KNOWN_FINDINGS = (
    KnownFinding(
        "hisparse-device-buffer-padding",
        "HiSparse device buffer padded past its cap: two pages where the estimate counts one",
        (("undercount", "HiSparseTokenToKVPoolAllocator.hisparse_attn_allocator"),
         # check_decode_mem said "fits"; then HiSparse _grow_device_buffers failed
         ("failed after fits", "HiSparseTokenToKVPoolAllocator.hisparse_attn_allocator")),
        ("hisparse",), ("0.5.13", None), None,
        "not fixed in a release (0.5.23): HiSparseCoordinator._grow_device_buffers pads to "
        "device_buffer_size + page_size, and check_decode_mem does not ask "
        "can_grow_device_buffers (upstream's main after 0.5.23 does)"),
    KnownFinding(
        "dflash-reserve-unaligned",
        "DFLASH's decode reserve not rounded up to a page: kv_allocated_len records less than "
        "the pages handed out",
        (("bookkeeping gap", "PagedTokenToKVPoolAllocator"),
         ("bookkeeping gap", "SWATokenToKVPoolAllocator.full_attn_allocator")),
        ("paged", "swa"), ("0.5.14", "0.5.18"), "0.5.19",
        "SGLang #35265 (0.5.19 page-aligns the DFLASH family's reserve as EAGLE's since 0.5.16)",
        ("DFLASH", "DSPARK"), 2),
    KnownFinding(
        "spec-tail-stranded",
        "the speculative decode's nxt not rounded up to a page: kv_allocated_len records up to "
        "page - 1 tokens short of the pages handed out",
        (("bookkeeping gap", "PagedTokenToKVPoolAllocator"),
         ("bookkeeping gap", "SWATokenToKVPoolAllocator.full_attn_allocator")),
        ("paged", "swa"), ("0.5.11", "0.5.15"), "0.5.16",
        "SGLang #31616 (0.5.16 page-aligns nxt in page_aligned_decode_alloc_lens)",
        ("EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM"), 2),
)
