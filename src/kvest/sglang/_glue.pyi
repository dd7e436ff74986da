# Type stubs for the SGLang glue's compiled half (kvest.sglang.glue's twins).
from collections.abc import Callable

# Private, for the SGLang glue: a class's version tag (0: none, or the public-API build).
def _type_version(cls: type) -> int: ...

# Private, for the SGLang rewrite's size checks (one call, no Python code run).
def _small_list(obj: object, below: int) -> bool: ...
def _small_reqs(owner: object, below: int) -> bool: ...

# Private, the SGLang glue's compiled half (kvest.sglang.glue): a hot spot's
# counters, and the glues whose bound ``run`` a rewritten statement calls.
class _Tally:
    calls: int
    kernel: int
    fallbacks: int
    last_kernel: int
    last_fallback: int
    def tick(self) -> None: ...
    def answered(self, answer: object) -> object: ...
    def declined(self, declined: object) -> object: ...

class _Glue:
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], builtin: object) -> None: ...

class _DecodeCountGlue(_Glue):
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], builtin: object,
                 layout: str | None) -> None: ...
    def run(self, requests: object, page_size: object, sum_: object) -> object: ...

class _BeamTailGlue(_Glue):
    def run(self, owner: object, enumerate_: object) -> object: ...

class _SpecV2TotalGlue(_Glue):
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], builtin: object, layout: str | None,
                 factor: int, ceil_align: Callable[..., object],
                 ceil_div: Callable[..., object]) -> None: ...
    def run(self, total: object, requests: object, page_size: object, reserve: object,
            max_: object, ceil_align_: object) -> object: ...

# Private, for the SGLang glue: whether a function's global names still resolve
# to the objects kvest proved its pattern with.
def _globals_resolve(namespace: dict[str, object], names: tuple[str, ...],
                     expected: tuple[object, ...], missing: object) -> bool: ...

class _AllocLensGlue(_Glue):
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], namespace: dict[str, object],
                 names: tuple[str, ...], expected: tuple[object, ...], missing: object,
                 layout: str | None, lists_below: int) -> None: ...
    def run(self, reqs: object, reserve: object, page_size: object) -> object: ...
