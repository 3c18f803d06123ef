"""Paged caches in the eager models (models/paging.py): a sequence whose rows live in scattered
blocks of a shared pool gives the logits of the same sequence in a dense cache of its own, alone
(a prompt chunk: one block table) or batched with others (a decode step: one table per token),
and writes nothing outside its own blocks; for every architecture with a paged form."""

import sys
from pathlib import Path

import pytest
import torch

from day0.models.paging import dense_view, paged_view
from day0.models.registry import build_eager

sys.path.insert(0, str(Path(__file__).parent))
from parity_configs import PARITY, rel_err  # noqa: E402

BLOCK = 4
BLOCKS = 40
TOL = 1e-6


@pytest.fixture(scope="module", params=["ds-sparse", "oss-base"])
def model(request, checkpoint):
    """deepseek_v32 (MLA latent + indexer keys, DSA) and gpt_oss (K/V, sinks, sliding windows of 8)."""
    return build_eager(checkpoint(request.param), max_seq_len=PARITY[request.param]["max_seq_len"])


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(seed))


def _pools(model) -> list[torch.Tensor]:
    return [torch.zeros(BLOCKS * BLOCK, *s.shape[1:]) for s in model.state_specs()]


def _dense(model, ids: torch.Tensor, decode: list[int]) -> list[torch.Tensor]:
    """Logits of a prompt then one token at a time, in the model's own dense caches."""
    state = model.empty_state()
    out, *state = model.step(ids, torch.tensor([0]), *state)
    rows = [out]
    for i, t in enumerate(decode):
        out, *state = model.step(torch.tensor([t]), torch.tensor([len(ids) + i]), *state)
        rows.append(out)
    return rows


@torch.no_grad()
def test_one_sequence_in_scattered_blocks_equals_its_dense_cache(model):
    ids, decode = _ids(19, 0), [5, 9, 2, 7, 11]
    want = _dense(model, ids, decode)
    table = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(1))[:6][None, :]  # 24 positions
    pools = _pools(model)
    got, *pools = model.step_paged(ids, torch.arange(len(ids)), table[:, :5], *pools, block=BLOCK)
    assert rel_err(got, want[0]) < TOL
    for i, t in enumerate(decode):
        pos = len(ids) + i
        nb = pos // BLOCK + 1  # the table grows with the sequence
        got, *pools = model.step_paged(torch.tensor([t]), torch.tensor([pos]), table[:, :nb], *pools, block=BLOCK)
        assert rel_err(got, want[1 + i]) < TOL
    used = set(table[0].tolist())
    for pool in pools:
        untouched = pool.view(BLOCKS, BLOCK, -1)[[b for b in range(BLOCKS) if b not in used]]  # any row shape
        assert not untouched.any()  # nothing written outside the sequence's blocks


@torch.no_grad()
def test_a_batched_decode_step_equals_each_sequence_alone(model):
    """Three sequences of different lengths share one pool; one step decodes a token of each,
    every query through its own table (padded to the longest), as each alone would."""
    lengths, nxt = [5, 11, 18], [3, 8, 13]
    perm = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(2)).tolist()
    tables, pools = [], _pools(model)
    for j, n in enumerate(lengths):
        blocks = perm[j * 6 : (j + 1) * 6]
        tables.append(blocks)
        _, *pools = model.step_paged(_ids(n, 10 + j), torch.arange(n), torch.tensor([blocks]), *pools, block=BLOCK)
    nb = max(lengths) // BLOCK + 1
    batch = torch.tensor([t[:nb] for t in tables])  # [3, nb]: blocks past a sequence's end never visible
    got, *pools = model.step_paged(torch.tensor(nxt), torch.tensor(lengths), batch, *pools, block=BLOCK)
    for j, n in enumerate(lengths):
        want = _dense(model, _ids(n, 10 + j), [nxt[j]])[1]
        assert rel_err(got[j : j + 1], want) < TOL, j


def test_views_address_rows_as_documented():
    positions = torch.tensor([0, 5, 9])
    tables = torch.tensor([[7, 2, 4]])
    view = paged_view(positions, tables, BLOCK)
    assert view.rows.tolist() == [28, 9, 17]  # block 7 row 0, block 2 row 1, block 4 row 1
    assert view.key_rows.shape == (1, 12) and view.keys == 12 and not view.per_query
    assert view.physical(torch.tensor([[5, -1], [0, 11]])).tolist() == [[9, -1], [28, 19]]
    dense = dense_view(positions, 16)
    assert dense.rows is positions and dense.physical(torch.tensor([[3, -1]])).tolist() == [[3, -1]]
    assert dense.visible.shape == (3, 16) and dense.visible[1].sum() == 6
