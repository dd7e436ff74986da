"""``python -m kvest.sglang``: the doctor (the same as ``python -m kvest sglang``)."""

from kvest.sglang.doctor import run

run()
