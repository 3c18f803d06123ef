"""Wall-clock timing shared by the benchmarks (numpy-only, so GPU hosts without torch can use it)."""

import statistics
import time


def median_seconds(fn, repeats: int, warmup: bool = True) -> float:
    """Median wall time of fn() over `repeats` calls, after one untimed warm-up call."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
