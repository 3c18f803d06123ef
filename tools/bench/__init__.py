"""day0.tools.bench: benchmarks (`make bench`, `make bench-gpu`) and GPU-host checks of the kernels."""
