"""gpu_artifact_profile's busy time: the union of kernel intervals within their span (overlaps
counted once, gaps not at all). The profiler itself needs a GPU."""

from day0.tools.bench.gpu_artifact_profile import _busy


def test_busy_is_the_union_of_kernel_intervals():
    # µs intervals: [0, 10) and [5, 20) overlap; [30, 40) after a 10 µs gap; [32, 35) inside it
    assert _busy([(30, 40), (0, 10), (5, 20), (32, 35)]) == {"span_ms": 0.04, "busy_ms": 0.03}
    assert _busy([]) == {"span_ms": 0.0, "busy_ms": 0.0}
