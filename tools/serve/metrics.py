"""The service's Prometheus metrics (prometheus_client), one registry per server.

Gauges are set by the engine thread after every step; counters and histograms by the request
handlers when tokens reach them, so latencies include the hop from the engine to the client.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# seconds: from a millisecond step on the H200 to a long CPU prefill
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self, model: str):
        self.registry = r = CollectorRegistry()
        self.running = Gauge("day0_requests_running", "Requests admitted to the engine", registry=r)
        self.waiting = Gauge("day0_requests_waiting", "Requests waiting for admission", ["kind"], registry=r)
        self.blocks_used = Gauge("day0_kv_blocks_used", "KV-cache blocks in use", registry=r)
        self.blocks_free = Gauge("day0_kv_blocks_free", "KV-cache blocks free", registry=r)
        self.blocks_evicted = Gauge(
            "day0_kv_blocks_evicted", "KV-cache blocks of image tokens returned early (--evict-images)", registry=r
        )
        self.ready = Gauge("day0_ready", "1 once warm-up is done", registry=r)
        self.ttft = Histogram(
            "day0_time_to_first_token_seconds", "Arrival to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "day0_inter_token_latency_seconds", "Time between tokens of a request", buckets=TOKEN_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "day0_e2e_request_latency_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter("day0_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("day0_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter(
            "day0_requests_finished", "Requests that ended, by finish reason", ["finish_reason"], registry=r
        )
        self.errors = Counter(
            "day0_request_errors", "Requests answered with an error, by status", ["status"], registry=r
        )
        self.steps = Counter("day0_engine_steps", "Engine steps run", registry=r)
        self.info = Gauge("day0_model_info", "The served model", ["model"], registry=r)
        self.info.labels(model=model).set(1)

    def engine_counters(self, c: dict) -> None:
        """Set the gauges from `Engine.counters()`."""
        self.running.set(c["running"])
        for kind in ("text", "image"):
            self.waiting.labels(kind=kind).set(c[f"waiting_{kind}"])
        self.blocks_used.set(c["blocks_used"])
        self.blocks_free.set(c["blocks_free"])
        self.blocks_evicted.set(c["blocks_evicted"])

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
