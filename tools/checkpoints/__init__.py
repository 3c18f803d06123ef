"""day0.tools.checkpoints: seeded tiny checkpoints (Hugging Face layout) for the demo, tests and benchmarks."""
