"""`day0 serve ARTIFACT_DIR`: load the artifact into an Engine, then serve it over HTTP.

Everything that can be wrong with the artifact or the options (a missing file, a device the
artifact was not compiled for, a pool too small for one block) is found before the port is
bound, and `day0 serve` exits with one line naming it. The Engine runs in a process of its own
(worker.py); uvicorn serves the app (app.py) in this one. Warm-up runs in the engine process and
/health turns 200 when it is done. SIGINT or SIGTERM stop
the server gracefully: it stops accepting connections, lets running answers finish for up to
`graceful_s` seconds, then stops the engine thread.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from day0.runtime.memory_plan import size_arg

log = logging.getLogger("day0.runtime")


@dataclass
class ServeConfig:
    artifact: Path
    host: str = "127.0.0.1"
    port: int = 8000
    device: str | None = None
    max_batch: int | None = None  # sequences running at once (default: the artifact's largest batch)
    kv_memory: int | None = None  # bytes for the cache pools (default: every sequence to max_seq_len)
    num_blocks: int | None = None
    prefill_chunk: int | None = None  # most prompt tokens a step (default: the Engine's, Engine.load)
    max_waiting: int = 256
    model_name: str | None = None
    checkpoint_dir: Path | None = None
    warmup: bool = True
    verify: bool = True  # hash the vmfb and the checkpoint's shards at load
    graceful_s: float = 30.0
    evict_images: bool = False  # Engine.load's evict_images (visual-token eviction, opt-in)


def load_service(cfg: ServeConfig):
    """(engine worker, tokenizer, chat template, model name): the engine process forked and its
    artifact loaded first (ServeError naming what is wrong), before this process starts a thread."""
    from day0.runtime.tokenizer import load_tokenizer
    from day0.tools.serve.chat import load_chat_template
    from day0.tools.serve.metrics import Metrics
    from day0.tools.serve.worker import EngineWorker

    if cfg.max_waiting < 1:
        raise ValueError(f"--max-queue must be >= 1 (got {cfg.max_waiting})")
    name = cfg.model_name or Path(cfg.artifact).resolve().name
    engine_args = dict(
        artifact_dir=cfg.artifact,
        device=cfg.device,
        num_blocks=cfg.num_blocks,
        memory_bytes=cfg.kv_memory,
        chunk=cfg.prefill_chunk,
        checkpoint_dir=cfg.checkpoint_dir,
        max_running=cfg.max_batch,
        verify=cfg.verify,
        evict_images=cfg.evict_images,
    )
    worker = EngineWorker(engine_args, Metrics(name), cfg.max_waiting, cfg.warmup)
    try:
        tokenizer = load_tokenizer(cfg.artifact)
        template = load_chat_template(cfg.artifact)
    except Exception:
        worker.stop()
        raise
    info = worker.info
    log.info(
        "loaded",
        extra={
            "artifact": str(cfg.artifact),
            "model": name,
            "architecture": info.architecture,
            "target": info.target,
            "max_seq_len": info.max_seq_len,
            "max_running": info.max_running,
            "blocks": info.blocks,
            "block_size": info.block_size,
            "tokenizer": tokenizer is not None,
            "chat_template": template is not None,
        },
    )
    return worker, tokenizer, template, name


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    from day0.tools.serve.app import ServeOptions, create_app

    worker, tokenizer, template, name = load_service(cfg)
    try:
        app = create_app(worker, tokenizer, template, ServeOptions(name, cfg.graceful_s))
        config = uvicorn.Config(
            app,
            host=cfg.host,
            port=cfg.port,
            log_config=None,  # logs.setup configured the loggers
            access_log=False,  # app.py writes one access line per request, with its id
            timeout_graceful_shutdown=cfg.graceful_s,
        )
        uvicorn.Server(config).run()
    finally:
        worker.stop()


def add_arguments(
    p: argparse.ArgumentParser, checkpoint_dir_help: str = "the checkpoint's directory, if it moved"
) -> None:
    """`day0 serve`'s arguments (the CLI's subcommand and `python -m day0.tools.serve` alike)."""
    p.add_argument("artifact")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="runtime device (local-task, cuda); default: the artifact's")
    p.add_argument(
        "--max-batch", type=int, default=None, help="sequences running at once (default: the artifact's largest batch)"
    )
    p.add_argument(
        "--kv-memory",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="device memory for the paged caches (80GiB, 141GB, bytes; default: every running sequence can "
        "reach max_seq_len, within 16 GiB)",
    )
    p.add_argument("--num-blocks", type=int, default=None, help="cache blocks in the pool (instead of --kv-memory)")
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="most prompt tokens one engine step runs (default: the artifact's static prompt chunk, else 64)",
    )
    p.add_argument("--max-queue", type=int, default=256, help="requests that may wait for admission; past it: 429")
    p.add_argument("--model-name", default=None, help="the name clients ask for (default: the artifact's folder name)")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    p.add_argument("--log-levels", default=None, help="per layer, e.g. server=debug,engine=warning,runtime=info")
    p.add_argument("--no-warmup", action="store_true", help="report ready without the warm-up requests")
    p.add_argument("--no-verify", action="store_true", help="skip the hash checks of the vmfb and the shards")
    p.add_argument(
        "--evict-images",
        action="store_true",
        help="after an image request's prompt, return its blocks of image tokens to the pool (changes answers)",
    )
    p.add_argument("--checkpoint-dir", default=None, help=checkpoint_dir_help)


def serve_from_args(a: argparse.Namespace) -> None:
    """Set up the logs, check the arguments (ValueError naming one), serve until stopped."""
    from day0.tools.serve import logs

    logs.setup(logs.parse_levels(a.log_level, a.log_levels))
    if not 0 <= a.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (got {a.port})")
    serve(
        ServeConfig(
            artifact=Path(a.artifact),
            host=a.host,
            port=a.port,
            device=a.device,
            max_batch=a.max_batch,
            kv_memory=a.kv_memory,
            num_blocks=a.num_blocks,
            prefill_chunk=a.prefill_chunk,
            max_waiting=a.max_queue,
            model_name=a.model_name,
            checkpoint_dir=a.checkpoint_dir,
            warmup=not a.no_warmup,
            verify=not a.no_verify,
            evict_images=a.evict_images,
        )
    )
