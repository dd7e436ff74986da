"""The timer every benchmark uses, and the description of the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kvest


def calibrate(call: Callable[[], Any], target: float) -> int:
    """How many back-to-back calls take about ``target`` seconds."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            call()
        elapsed = time.perf_counter() - start
        if elapsed >= target or number >= 1 << 22:
            return max(1, int(number * target / max(elapsed, 1e-9)))
        number *= 4


def measure(calls: dict[str, Callable[[], Any]], samples: int, target: float) -> dict[str, float]:
    """Median seconds per call of each callable, sampled round-robin (side by side)."""
    numbers = {name: calibrate(call, target) for name, call in calls.items()}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(samples):
        for name, call in calls.items():
            number = numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                call()
            times[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(ts) for name, ts in times.items()}


def machine() -> str:
    """CPU, cores, Python, NumPy and the kvest build: printed under every result."""
    variant = ""
    if kvest.IMPLEMENTATION == "cython":
        from kvest import _kernels

        variant = f", {_kernels.cpu_variant()} loops"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"NumPy {np.__version__}, kvest {kvest.__version__} "
            f"({kvest.IMPLEMENTATION}{variant})")
