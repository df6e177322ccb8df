"""Training negatives: never a training positive (train) / never in the history (history)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.data import (
    Interactions,
    LoadReport,
    NegativeSampler,
    leave_one_out,
    make_synthetic,
    sample_train_negatives,
)
from securefed.errors import ConfigError, DataError


def _interactions(user_items: list[list[int]], n_items: int) -> Interactions:
    users = np.repeat(np.arange(len(user_items)), [len(x) for x in user_items])
    return Interactions(
        name="tiny",
        users=users.astype(np.int64),
        items=np.concatenate([np.asarray(x, dtype=np.int64) for x in user_items]),
        timestamps=np.arange(len(users), dtype=np.float64),
        n_users=len(user_items),
        n_items=n_items,
        user_ids=np.arange(len(user_items)),
        item_ids=np.arange(n_items),
        report=LoadReport(
            source="test",
            raw_rows=len(users),
            duplicate_rows=0,
            dropped_users=0,
            dropped_interactions=0,
        ),
    )


@st.composite
def histories(draw: st.DrawFn) -> tuple[Interactions, int]:
    n_items = draw(st.integers(4, 30))
    n_users = draw(st.integers(1, 8))
    rows = []
    for _ in range(n_users):
        k = draw(st.integers(3, n_items - 1))  # at least one item never seen
        rows.append(draw(st.permutations(range(n_items)))[:k])
    return _interactions(rows, n_items), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(case=histories(), n_neg=st.integers(1, 5), table=st.booleans())
def test_negatives_never_excluded_items(
    case: tuple[Interactions, int], n_neg: int, table: bool
) -> None:
    """Both lookup paths (gather table and searchsorted) respect the excluded items."""
    data, seed = case
    split = leave_one_out(data, seed=seed, n_eval_negatives=0)
    gen = torch.Generator().manual_seed(seed)
    pos_users = torch.from_numpy(split.train_users())
    for source, indptr, items in (
        ("train", split.train_indptr, split.train_items),
        ("history", split.history_indptr, split.history_items),
    ):
        if table:
            neg = sample_train_negatives(split, pos_users, n_neg, source=source, generator=gen)
        else:
            sampler = NegativeSampler(split, source, max_table_entries=0)
            neg = sampler.sample(pos_users, n_neg, gen)
        assert neg.shape == (len(pos_users), n_neg) and neg.dtype == torch.int64
        for row, u in enumerate(pos_users.tolist()):
            banned = set(items[indptr[u] : indptr[u + 1]].tolist())
            drawn = set(neg[row].tolist())
            assert not drawn & banned
            assert min(drawn) >= 0 and max(drawn) < data.n_items


def test_train_source_can_draw_held_out_items_history_cannot() -> None:
    # User 0 saw items 0..4 of 6 (4 and 3 held out); item 5 is the only never-seen item.
    split = leave_one_out(_interactions([[0, 1, 2, 3, 4]], 6), seed=0, n_eval_negatives=0)
    gen = torch.Generator().manual_seed(0)
    users = torch.zeros(3000, dtype=torch.int64)
    train = NegativeSampler(split, "train").sample(users, 1, gen)
    history = NegativeSampler(split, "history").sample(users, 1, gen)
    assert set(history.unique().tolist()) == {5}
    # {3, 4, 5} each with probability 1/3: each appears (failure probability < 1e-500).
    assert set(train.unique().tolist()) == {3, 4, 5}


@pytest.mark.parametrize("max_table_entries", [1 << 22, 0])
def test_negatives_are_uniform_over_allowed_items(max_table_entries: int) -> None:
    """Allowed items 3..9 each get Binomial(70000, 1/7) draws (mean 10000, sd ~93).

    Tolerance 6 sd: false-failure rate below 2e-8 over the 7 counts; an item favoured by 6 %
    (600 draws, 6.5 sd) fails.
    """
    split = leave_one_out(_interactions([[0, 1, 2, 3, 4]], 10), seed=0, n_eval_negatives=0)
    gen = torch.Generator().manual_seed(1)
    sampler = NegativeSampler(split, max_table_entries=max_table_entries)
    neg = sampler.sample(torch.zeros(10_000, dtype=torch.int64), 7, gen)
    counts = torch.bincount(neg.flatten(), minlength=10).numpy()
    assert counts[:3].sum() == 0
    sd = np.sqrt(70_000 * (1 / 7) * (6 / 7))
    assert np.all(np.abs(counts[3:] - 10_000) < 6 * sd)


def test_sampler_is_reproducible_and_validates() -> None:
    split = leave_one_out(make_synthetic(n_users=30, n_items=200), seed=0, n_eval_negatives=5)
    sampler = NegativeSampler(split)
    users = torch.from_numpy(split.train_users())
    a = sampler.sample(users, 4, torch.Generator().manual_seed(7))
    b = sampler.sample(users, 4, torch.Generator().manual_seed(7))
    c = NegativeSampler(split, max_table_entries=0).sample(
        users, 4, torch.Generator().manual_seed(7)
    )
    assert torch.equal(a, b) and torch.equal(a, c)  # both paths: the same draws
    assert sampler.sample(users[:0], 4, torch.Generator()).shape == (0, 4)
    with pytest.raises(ConfigError, match="train' or 'history"):
        NegativeSampler(split, "test")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="int64"):
        sampler.sample(users.int(), 4, torch.Generator())
    with pytest.raises(ConfigError, match="out of range"):
        sampler.sample(torch.tensor([30]), 4, torch.Generator())
    full = leave_one_out(_interactions([[0, 1, 2, 3]], 4), seed=0, n_eval_negatives=0)
    with pytest.raises(DataError, match="every item"):
        NegativeSampler(full, "history").sample(torch.tensor([0]), 1, torch.Generator())
