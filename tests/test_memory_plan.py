"""The paged state's memory plan (runtime/memory_plan.py): bytes per token per cache kind, what a
sequence of a given length holds, and what a budget holds — checked against what the Engine
actually admits when loaded with that budget, and as `day0 inspect --memory` prints it."""

import json
import logging
import subprocess
import sys

import numpy as np
import pytest

from day0.runtime import engine as engine_module
from day0.runtime.artifact import read_manifest
from day0.runtime.engine import Engine
from day0.runtime.memory_plan import memory_plan, parse_bytes


def _plan(art):
    m = read_manifest(art)
    return memory_plan(m.paged, m.max_seq_len), m


def test_sizes_parse_in_both_unit_systems():
    assert parse_bytes("80GiB") == 80 << 30
    assert parse_bytes("141GB") == 141 * 10**9
    assert parse_bytes("1.5 MiB") == 3 << 19
    assert parse_bytes("4096") == 4096
    for bad in ("80XB", "", "-1GiB", "GiB"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_bytes(bad)


def test_bytes_per_token_are_the_pools_rows(artifact):
    """kl-base: MLA latent pools (one per MLA layer) and KDA state in slots."""
    plan, m = _plan(artifact("kl-base"))
    (latent,) = plan.caches
    pools = [p for p in m.paged.pools if p.kind == "mla_latent"]
    assert latent.kind == "mla_latent" and latent.layers == len(pools)
    assert latent.bytes_per_token * m.paged.block_size == pools[0].nbytes
    assert plan.bytes_per_token == latent.layers * latent.bytes_per_token
    assert plan.slot_bytes == m.paged.slot_bytes > 0
    # a sequence holds its own length's blocks and one slot, not max_seq_len's
    assert plan.sequence_bytes(5) == 2 * m.paged.block_bytes + m.paged.slot_bytes
    assert plan.sequence_bytes(5) < plan.sequence_bytes(m.max_seq_len)


def test_what_a_budget_holds_is_what_the_engine_admits(artifact):
    """ds-sparse (no slots): a budget the plan says holds 2 sequences of 24 positions admits 2 of
    3 such requests at once; the longest context it names is the pool's whole capacity."""
    plan, m = _plan(artifact("ds-sparse"))
    length = 24
    budget = plan.block_bytes * (1 + 2 * plan.blocks_for(length)) + plan.block_bytes // 2
    assert plan.sequences_fitting(budget, length) == 2
    assert plan.sequences_fitting(budget, m.max_seq_len + 1) == 0
    engine = Engine.load(artifact("ds-sparse"), memory_bytes=budget, max_running=3)
    assert engine.blocks.capacity * m.paged.block_size == plan.longest_context(budget)
    rng = np.random.default_rng(0)
    for _ in range(3):
        engine.add(rng.integers(0, 100, length - 4).tolist(), max_new_tokens=4, stop=())
    engine.step()
    assert engine.counters()["running"] == 2 and engine.counters()["waiting"] == 1
    big = plan.block_bytes * 10**6
    assert plan.longest_context(big) == m.max_seq_len


def test_the_default_pool_stops_at_the_default_budget(artifact, monkeypatch, caplog):
    """Neither num_blocks nor memory_bytes: every running sequence to max_seq_len, unless that is
    more than DEFAULT_MEMORY_BYTES (a 1M-position artifact); the load logs the plan."""
    plan, m = _plan(artifact("ds-sparse"))
    with caplog.at_level(logging.INFO, logger="day0.engine"):
        full = Engine.load(artifact("ds-sparse"), max_running=3)
    assert full.blocks.num_blocks == 3 * m.paged.max_blocks + 1
    (record,) = [r for r in caplog.records if r.getMessage() == "cache pools"]
    assert (record.blocks, record.longest_context, record.sequences_at_max_seq_len) == (full.blocks.num_blocks, 64, 3)
    assert (
        record.pool_bytes == full.blocks.num_blocks * m.paged.block_bytes
        and record.bytes_per_token == m.paged.block_bytes / m.paged.block_size
    )
    monkeypatch.setattr(engine_module, "DEFAULT_MEMORY_BYTES", 5 * plan.block_bytes)
    capped = Engine.load(artifact("ds-sparse"), max_running=3)
    assert capped.blocks.num_blocks == 5
    with pytest.raises(engine_module.EngineError, match=r"more than the whole pool's 4 \(load the Engine with more"):
        capped.add(list(range(20)), max_new_tokens=1)


def _day0(*args):
    return subprocess.run([sys.executable, "-m", "day0.tools.cli", *map(str, args)], capture_output=True, text=True)


def test_inspect_prints_the_plan_against_a_budget(artifact):
    art = artifact("kl-base")
    plan, m = _plan(art)
    r = _day0("inspect", art, "--memory", "1MiB")
    assert r.returncode == 0, r.stderr
    assert f"{'mla_latent':<14} {plan.caches[0].layers:>3} layer  x" in r.stdout  # kl-base: one MLA layer
    n = plan.sequences_fitting(1 << 20, m.max_seq_len)
    assert f"a sequence, {n} fit in 1.0 MiB" in r.stdout
    assert f"longest context in 1.0 MiB: {plan.longest_context(1 << 20)} tokens" in r.stdout
    info = json.loads(_day0("inspect", art, "--json", "--memory", "1MiB").stdout)
    assert info["paged"]["memory"]["budget"]["sequences"][str(m.max_seq_len)] == n
    bad = _day0("inspect", art, "--memory", "lots")
    assert bad.returncode == 2 and "--memory: 'lots' is not a size" in bad.stderr
    dense = _day0("inspect", artifact("ds-tiles-mxfp4"), "--memory", "1GiB")
    assert dense.returncode == 2 and "has no paged state (compile it with --max-batch)" in dense.stderr
