"""patch(): code kvest cannot read is left alone; importers rebound; undo restores it all."""

from __future__ import annotations

import ast
import sys
import textwrap
import types
import warnings

import pytest
from sglang_releases import check_required, releases

import kvest.sglang
from kvest.sglang.upstream import standin_tree

RELEASES = releases()
check_required(RELEASES)
if not RELEASES:
    pytest.skip("no sglang release available", allow_module_level=True)
NEWEST = RELEASES[-1]


class FakeTensor:
    """Enough of torch for the detection to accept get_num_new_pages (never called)."""


FAKE_TORCH = types.SimpleNamespace(Tensor=FakeTensor, device=lambda name: name)


def _edited(fn, old: str, new: str):
    """``fn`` recompiled from its source with one edit: a fork of upstream's code."""
    import inspect

    source = textwrap.dedent(inspect.getsource(fn)).replace(old, new)
    assert old in textwrap.dedent(inspect.getsource(fn))
    namespace: dict = {}
    exec(compile(ast.parse(source), "<fork>", "exec"), fn.__globals__, namespace)
    return namespace[fn.__name__]


@pytest.mark.parametrize("edit", [
    ("page_size == 0", "page_size == 1"),                 # a different constant
    ("kv_committed_len", "kv_committed_len_v2"),          # a name kvest has not read
])
def test_a_function_without_readable_source_is_left_alone_with_a_warning(edit):
    """A fork compiled from a string: kvest cannot prove what runs, so it
    leaves that function alone -- and only that function."""
    with standin_tree(NEWEST) as tree:
        cls = tree.batch_class
        fork = _edited(cls.__dict__["new_tokens_required_next_decode"], *edit)
        cls.new_tokens_required_next_decode = fork
        with pytest.warns(RuntimeWarning,
                          match="left unpatched: new_tokens_required_next_decode: no source"):
            handle = kvest.sglang.patch()
        assert cls.__dict__["new_tokens_required_next_decode"] is fork
        assert "ScheduleBatch._new_tokens_required_next_decode_spec_v2" in handle.replaced
        handle.undo()


def test_a_missing_method_leaves_the_others_compiled():
    with standin_tree(NEWEST) as tree:
        del tree.batch_class._new_tokens_required_next_decode_spec_v2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            handle = kvest.sglang.patch()
        assert "ScheduleBatch.new_tokens_required_next_decode" in handle.replaced
        spot = kvest.sglang.status()["hotspots"]["_new_tokens_required_next_decode_spec_v2"]
        assert spot["state"] == "absent"
        handle.undo()


def test_patch_rebinds_importers_and_undo_restores_everything():
    with standin_tree(NEWEST, torch=FAKE_TORCH) as tree:
        common = tree.modules["sglang.srt.utils.common"]
        original = common.get_num_new_pages
        importer = types.ModuleType("sglang.srt.mem_cache.allocator.some_allocator")
        importer.get_num_new_pages = original  # as `from ...common import get_num_new_pages`
        sys.modules[importer.__name__] = importer
        cls = tree.batch_class
        before = dict(vars(cls))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            handle = kvest.sglang.patch()
        assert "get_num_new_pages" in handle.replaced
        for module in (common, tree.modules["sglang.srt.utils"], importer):
            assert module.get_num_new_pages.__kvest_original__ is original
        handle.undo()
        for module in (common, tree.modules["sglang.srt.utils"], importer):
            assert module.get_num_new_pages is original
        assert dict(vars(cls)) == before
        handle.undo()  # twice is harmless


def test_patch_twice_replaces_once():
    with standin_tree(NEWEST) as tree:
        first = kvest.sglang.patch()
        patched = tree.batch_class.__dict__["new_tokens_required_next_decode"]
        second = kvest.sglang.patch()
        assert not second.replaced
        assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is patched
        second.undo()
        assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is patched
        first.undo()
        assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is \
            patched.__kvest_original__
