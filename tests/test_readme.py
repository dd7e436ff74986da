"""The README's Python examples run as written (the SGLang patch one needs sglang)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvest._bench.arrays import make_batch

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_examples_run():
    if not README.is_file():
        pytest.skip("README.md is not beside the tests")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    ran = 0
    for block in blocks:
        if "kvest.sglang.patch()" in block:
            continue  # patches sglang's own class: covered by tests/test_sglang.py
        if "batch.reqs" in block:
            # The drop-in snippet reads a scheduler's batch: give it one.
            namespace.update(batch=make_batch(8, 16), page_size=16, reserve=128)
        exec(compile(block, str(README), "exec"), namespace)
        ran += 1
    assert ran >= 3
