"""Every fact kvest knows about SGLang's hot spots, written once.

A :class:`HotSpot` is one SGLang function kvest may replace: the modules it has
lived in, its class (for a method), its name, and the kinds of statement it may
hold (:class:`Use`: a kind and what the function's own variables mean to it).
A :class:`Kind` is one kind of statement: how to pick it out of the function,
which of its variables the glue is passed and which it binds, whether it writes
to what it is given, and the fingerprints a human has read and proven a kernel
equal to (:class:`Accepted`).  The glue of kind ``k`` is
``kvest.sglang.glue.make_<k>``.

The plugin, :func:`kvest.sglang.status`, the doctor, the stand-in modules the
doctor and the tests load from SGLang's files, ``tools/sglang_patterns.py``,
the tests' parametrisation and docs/sglang.md's table all read this module; a
new hot spot is one :class:`HotSpot` here and its kernel.  States and the kinds
of note are enums (:class:`State`, :class:`NoteKind`).
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable, Mapping
from typing import NamedTuple

__all__ = [
    "HELPERS",
    "HOTSPOTS",
    "KINDS",
    "Accepted",
    "HotSpot",
    "Kind",
    "Note",
    "NoteKind",
    "State",
    "Use",
    "files",
    "module_file",
]


class State(enum.Enum):
    """What kvest did with a hot spot in this process."""

    REPLACED = "replaced"  # kvest's version runs
    SHADOW = "shadow"  # both run, upstream answers
    LEFT_ALONE = "left alone"  # in the release, not compiled: the notes say why
    NOT_RECOGNISED = "not recognised in this release"  # an older shape kvest has no pattern for
    SKIPPED = "skipped"  # another hook is there, torch is not loaded, a writer in shadow mode
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
    # why upstream's statement is faster than kvest's kernel (measured), if it is:
    # then kvest leaves it to upstream at install, and says so
    upstream_faster: str = ""
    # batches of fewer requests go to upstream's statement: below this its code
    # takes fewer instructions than kvest's glue and kernel (the crossover,
    # tools/cachegrind_hotspots.py, docs/benchmarks.md); 0: never
    upstream_below: int = 0
    # the input role holding the requests' list (``owner``: its ``.reqs``): the
    # rewritten function checks its size itself, before any call (rewrite.py)
    sized: str | None = None
    # a whole function answering arrays where upstream answers lists: below
    # this batch it answers upstream's lists (kvest's arrays cost its caller
    # more there; glue.make_alloc_lens_int32); 0: never
    lists_below: int = 0

    @property
    def whole(self) -> bool:
        return self.select is None


def _kinds(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


# A writer that makes a new int for every write, as CPython's `+=` does, against
# CPython 3.11's specialised attribute stores (tools/cachegrind_hotspots.py, 4,096
# release-shaped requests, instructions a request).
_NEW_INTS = ("upstream's loop is faster: kvest's writer, making a new int for every write as "
             "CPython does, takes {} instructions a request against the loop's {}")
# Crossovers: the smallest batch measured (1, 2, 4, ..., 128, 256, 1,024, 4,096)
# from which kvest's glue and kernel take fewer instructions per call than
# upstream's code (tools/cachegrind_hotspots.py --no-handoff; docs/benchmarks.md).
# 0: kvest takes fewer from one request on (the glue compiled, kvest._reqs).
_CROSS_DECODE = 0  # the no-spec estimate
_CROSS_SPEC_V2 = 0  # the EAGLE estimate
_CROSS_BEAM_TAIL = 0  # append_beam_tail
_CROSS_ALLOC_LENS = 8  # page_aligned_decode_alloc_lens
_CROSS_ADD_LENGTHS = 16  # alloc_for_decode_default's adding loop
_SLOWER = "upstream's code is faster: kvest's {} takes {} instructions a request against the {} {}"

KINDS: Mapping[str, Kind] = _kinds(
    Kind("select_requests", "the list of selected requests", "`operator.itemgetter`",
         _selection, (Accepted("fca0c46ba1a5", "select_requests"),),
         inputs=("owner", "selected"), binds="target", older_shapes=True,
         upstream_faster=_SLOWER.format("list (its indices checked to be exact ints, then "
                                        "`operator.itemgetter`)", 385, "comprehension's", 218)),
    Kind("decode_count", "the count of requests whose committed length is on a page boundary",
         "`decode_new_tokens_from_reqs`", _assign_of_sum,
         (Accepted("df1187ec4fb9", "decode_count/flat", "flat"),
          Accepted("720dd25ff1a7", "decode_count/nested", "nested")),
         inputs=("requests", "page_size"), binds="target", upstream_below=_CROSS_DECODE,
         sized="requests"),
    Kind("spec_v2_total", "the spec-v2 loop", "`spec_v2_new_tokens_from_reqs`", _is_for,
         (Accepted("a7767a028b04", "spec_v2_total/flat/2x", "flat", 2, "alloc_len"),
          Accepted("ac283f7fb881", "spec_v2_total/flat", "flat"),
          Accepted("b26520a658a2", "spec_v2_total/mixed", "mixed"),
          Accepted("5c9eaf01b495", "spec_v2_total/nested", "nested")),
         inputs=("total", "requests", "page_size", "reserve"), binds="total",
         upstream_below=_CROSS_SPEC_V2, sized="requests"),
    Kind("beam_rows", "the member rows of the requests with a beam group",
         "`beam_member_rows_from_reqs`", _is_return, (Accepted("000952999d89", "beam_rows"),),
         inputs=("reqs",), binds=None,
         upstream_faster=_SLOWER.format("kernel", 227, "generator's", 137)),
    Kind("beam_tail_loop", "the loop collecting the beam groups' member rows, skipped when "
         "no request is in a beam group", "`beam_groups_from_reqs`", _is_for,
         (Accepted("12869f036c9f", "beam_tail_loop"),),
         # reads only; but append_beam_tail extends the batch when a request is in a group
         inputs=("owner",), reads=("enumerate",), writes=True, upstream_below=_CROSS_BEAM_TAIL,
         sized="owner"),
    Kind("alloc_lens_loop", "the loop filling `cur`, `nxt` and the total",
         "`decode_alloc_plan_from_reqs`, lists written whole", _is_for,
         (Accepted("41109038e55f", "alloc_lens_loop/nested", "nested"),),
         inputs=("reqs", "reserve", "page_size", "cur", "nxt", "total"), binds="total",
         upstream_below=_CROSS_ALLOC_LENS, sized="reqs"),
    Kind("alloc_lens_function", "the whole function, for callers that make int32 tensors of "
         "its lists", "the plan as int32 arrays", None,
         (Accepted("c7fcaae0bb6b", "alloc_lens_function/nested", "nested"),),
         lists_below=_CROSS_ALLOC_LENS),
    Kind("get_num_new_pages", "the whole function", "`num_new_pages` on `Tensor.numpy()`",
         None, (Accepted("9bda6bd0efc8", "get_num_new_pages"),)),
    Kind("ceil_align", "the helper (checked, never replaced)", "", None,
         (Accepted("7b40dcca57e9", "ceil_align"),)),
    Kind("ceil_div", "the helper (checked, never replaced)", "", None,
         (Accepted("974e86067eb8", "ceil_div"),)),
    Kind("add_lengths_loop", "both lengths `+= token_per_req`", "`add_to_attrs`",
         _for_writing("kv_allocated_len", "kv_committed_len"),
         (Accepted("226feb6771b3", "add_lengths_loop/nested"),),
         inputs=("owner", "delta"), writes=True, older_shapes=True,
         upstream_below=_CROSS_ADD_LENGTHS, sized="owner"),
    Kind("max_allocated_loop", "the allocated length raised to the plan's", "`max_into_attr`",
         _for_writing("kv_allocated_len"), (Accepted("52ea9dba3a67", "max_allocated_loop/nested"),),
         inputs=("reqs", "values"), writes=True, older_shapes=True),
    # `for req in <batch>.reqs: req.<path> += 1` for each path (written to patterns.json
    # from the statement, which the digest fixes): decode_batch_idx; then
    # kv_committed_len (flat2); then kv_allocated_len too (flat3)
    Kind("batch_idx_loop", "`req.decode_batch_idx += 1` (with the flat lengths before 0.5.19)",
         "`add_to_attrs`", _for_updating("decode_batch_idx"),
         (Accepted("cdc4dffc828b", "batch_idx_loop"),
          Accepted("c8bf94dc0a90", "batch_idx_loop/flat2"),
          Accepted("5df113efbe18", "batch_idx_loop/flat3")),
         inputs=("owner",), writes=True, older_shapes=True, paths=True,
         upstream_faster=_NEW_INTS.format(790, 423)),
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

HOTSPOTS: Mapping[str, HotSpot] = {h.name: h for h in (
    HotSpot("new_tokens_required_next_decode", (BATCH,), "ScheduleBatch",
            "new_tokens_required_next_decode",
            (Use("select_requests", _SELECTED),
             Use("decode_count", {"target": "new_pages", "requests": "requests",
                                  "page_size": "page_size"}))),
    HotSpot("check_decode_mem", (BATCH,), "ScheduleBatch", "check_decode_mem",
            (Use("select_requests", _SELECTED),)),
    HotSpot("_new_tokens_required_next_decode_spec_v2", (BATCH,), "ScheduleBatch",
            "_new_tokens_required_next_decode_spec_v2",
            (Use("spec_v2_total", {"total": "total", "requests": "requests",
                                   "page_size": "page_size", "reserve": "reserve"}),)),
    HotSpot("num_beam_member_rows", (BEAM_TAIL,), None, "num_beam_member_rows",
            (Use("beam_rows", {"reqs": "reqs"}),)),
    # ("offset": the running row offset, set before the loop and changed only past
    # its `continue`, which the kernel's answer -- no request in a beam group --
    # proves the loop never reaches: skipping the loop leaves it as is.)
    HotSpot("append_beam_tail", (BEAM_TAIL,), None, "append_beam_tail",
            (Use("beam_tail_loop", {"owner": "batch", "offset": "t"}),)),
    HotSpot("page_aligned_decode_alloc_lens", (ALLOC_SIZING,), None,
            "page_aligned_decode_alloc_lens",
            (Use("alloc_lens_loop", {"reqs": "reqs", "reserve": "reserve",
                                     "page_size": "page_size", "cur": "cur_kv_lens",
                                     "nxt": "nxt_kv_lens", "total": "num_needed_tokens"}),),
            forms=(Use("alloc_lens_function", {}),)),
    HotSpot("get_num_new_pages", (COMMON,), None, "get_num_new_pages",
            (Use("get_num_new_pages", {}),)),
    HotSpot("alloc_for_decode", (ALLOCATION,), None, "alloc_for_decode",  # 0.5.19-0.5.21
            (Use("add_lengths_loop", {"owner": "batch", "delta": "token_per_req"}),)),
    HotSpot("alloc_for_decode_default", (ALLOCATION,), None, "alloc_for_decode_default",
            (Use("add_lengths_loop", {"owner": "batch", "delta": "token_per_req"}),)),
    HotSpot("prepare_for_decode", (BATCH,), "ScheduleBatch", "prepare_for_decode",
            (Use("batch_idx_loop", {"owner": "self"}),)),
    HotSpot("eagle_prepare_for_decode", (EAGLE_UTILS,), None, "eagle_prepare_for_decode",
            (Use("batch_idx_loop", {"owner": "batch"}),)),
    HotSpot("alloc_for_spec_decode", (ALLOCATION,), None, "alloc_for_spec_decode",
            (Use("max_allocated_loop", {"reqs": "reqs", "values": "nxt_kv_lens_list"}),)),
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
