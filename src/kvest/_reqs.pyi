# Type stubs for the compiled request-object kernels; kvest.reference._reqs has the same
# signatures.
from collections.abc import Sequence
from typing import Any

__all__: list[str]

def spec_v2_new_tokens_from_reqs(reqs: Sequence[Any], page_size: int, reserve: int) -> int: ...
def decode_new_tokens_from_reqs(reqs: Sequence[Any], page_size: int) -> int: ...
