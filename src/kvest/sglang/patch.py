"""Route SGLang's decode-step estimators through kvest, reversibly.

>>> import kvest.sglang
>>> undo = kvest.sglang.patch()          # imports sglang's ScheduleBatch
>>> ...                                  # the scheduler runs on kvest
>>> undo()                               # the original methods are back

or, scoped: ``with kvest.sglang.patch(): ...``.

:func:`patch` replaces two methods of a ``ScheduleBatch`` class:
``new_tokens_required_next_decode`` and ``_new_tokens_required_next_decode_spec_v2``.
The replacements read their inputs exactly as the upstream methods (sglang
0.5.11) do -- the requests from ``self.reqs`` and ``selected_indices``, the page
size from ``self.token_to_kv_pool_allocator.page_size``, the speculative mode
from ``self.spec_algorithm`` and ``self.is_spec_v2``, the settings from the
global server args and ``get_alloc_len_per_decode()`` -- and hand the loops to
:func:`kvest.decode_new_tokens_from_reqs`, :func:`kvest.spec_v2_new_tokens_from_reqs`
and :func:`kvest.spec_v1_new_tokens`, which read both request layouts (flat
``req.kv_committed_len`` and nested ``req.kv.kv_committed_len``).  Results are
unchanged; the one difference is that a corrupt (negative) length raises
``ValueError`` instead of producing a number.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import kvest

__all__ = ["Patch", "patch"]

_METHODS = ("new_tokens_required_next_decode", "_new_tokens_required_next_decode_spec_v2")
_STATE = "__kvest_patch__"  # class attribute: {"originals": {...}, "depth": n}


def _upstream(module: str, name: str) -> Callable[..., Any]:
    return getattr(importlib.import_module(module), name)


class Patch:
    """Undo handle returned by :func:`patch`; call it or use it as a context manager."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self._active = True

    def undo(self) -> None:
        """Release this patch; the originals return when the last patch is released."""
        if not self._active:
            return
        self._active = False
        state = self.cls.__dict__[_STATE]
        state["depth"] -= 1
        if state["depth"] == 0:
            for name, original in state["originals"].items():
                if original is None:
                    delattr(self.cls, name)
                else:
                    setattr(self.cls, name, original)
            delattr(self.cls, _STATE)

    __call__ = undo

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def patch(
    cls: type | None = None, *,
    get_server_args: Callable[[], Any] | None = None,
    get_alloc_len_per_decode: Callable[[], int] | None = None,
) -> Patch:
    """Make ``cls`` (default: sglang's ``ScheduleBatch``) estimate with kvest.

    ``get_server_args`` and ``get_alloc_len_per_decode`` default to the
    functions the upstream methods call (the first as found in the module that
    defines ``cls``); pass them to run against stand-ins.  Patching a class
    that is already patched stacks: the originals return when every handle has
    been undone.
    """
    if cls is None:
        cls = _upstream("sglang.srt.managers.schedule_batch", "ScheduleBatch")
    state = cls.__dict__.get(_STATE)
    if state is not None:
        state["depth"] += 1
        return Patch(cls)

    originals = {name: cls.__dict__.get(name) for name in _METHODS}
    if originals["new_tokens_required_next_decode"] is None:
        raise TypeError(f"{cls.__name__} has no new_tokens_required_next_decode to patch")
    home = getattr(originals["new_tokens_required_next_decode"], "__globals__", {})

    def server_args() -> Any:
        if get_server_args is not None:
            return get_server_args()
        if "get_global_server_args" in home:
            return home["get_global_server_args"]()
        return _upstream("sglang.srt.server_args", "get_global_server_args")()

    def alloc_len() -> int:
        if get_alloc_len_per_decode is not None:
            return get_alloc_len_per_decode()
        return _upstream("sglang.srt.managers.utils", "get_alloc_len_per_decode")()

    def new_tokens_required_next_decode(self: Any, selected_indices: Any = None) -> int:
        page_size = self.token_to_kv_pool_allocator.page_size
        reqs = self.reqs
        requests = reqs if selected_indices is None else [reqs[i] for i in selected_indices]
        if self.spec_algorithm.is_none():
            return kvest.decode_new_tokens_from_reqs(requests, page_size)
        if self.is_spec_v2:
            return self._new_tokens_required_next_decode_spec_v2(requests, page_size)
        args = server_args()
        return kvest.spec_v1_new_tokens(
            len(requests), page_size, args.speculative_num_steps,
            args.speculative_eagle_topk, args.speculative_num_draft_tokens,
        )

    def _new_tokens_required_next_decode_spec_v2(self: Any, requests: Any, page_size: int) -> int:
        return kvest.spec_v2_new_tokens_from_reqs(requests, page_size, 2 * alloc_len())

    replacements = {
        "new_tokens_required_next_decode": new_tokens_required_next_decode,
        "_new_tokens_required_next_decode_spec_v2": _new_tokens_required_next_decode_spec_v2,
    }
    for name, fn in replacements.items():
        original = originals.get(name)
        if original is not None:
            fn.__doc__ = original.__doc__
        fn.__qualname__ = f"{cls.__name__}.{name}"
        setattr(cls, name, fn)
    setattr(cls, _STATE, {"originals": originals, "depth": 1})
    return Patch(cls)
