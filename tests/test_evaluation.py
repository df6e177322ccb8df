"""Metric functions against hand-computed values and evaluate() on oracle models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from securefed.data import Split, leave_one_out, make_synthetic
from securefed.errors import ConfigError
from securefed.evaluation import evaluate, hit_ratio, ndcg, rank_of_target


def test_metric_functions_hand_values() -> None:
    assert hit_ratio(torch.tensor([0]), 10) == 1.0 and ndcg(torch.tensor([0]), 10) == 1.0
    assert ndcg(torch.tensor([3]), 10) == pytest.approx(1 / math.log2(5))
    assert hit_ratio(torch.tensor([9]), 10) == 1.0 and hit_ratio(torch.tensor([10]), 10) == 0.0
    assert ndcg(torch.tensor([10]), 10) == 0.0
    ranks = np.array([0, 1, 3, 10])  # numpy works too
    assert hit_ratio(ranks, 10) == 0.75
    assert ndcg(ranks, 10) == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(5)) / 4)
    assert hit_ratio(ranks, 1) == 0.25
    with pytest.raises(ConfigError, match="k must be"):
        ndcg(ranks, 0)


def test_rank_of_target_ties_and_nan_are_pessimistic() -> None:
    target = torch.tensor([0.5, 0.5, 0.5, float("nan"), 0.5])
    cand = torch.tensor(
        [
            [0.1, 0.2, 0.3],  # strictly best -> 0
            [0.9, 0.5, 0.1],  # one greater, one tie -> 2
            [0.5, 0.5, 0.5],  # all ties -> 3
            [0.1, 0.2, 0.3],  # NaN target -> last
            [float("nan"), 0.1, 0.9],  # NaN candidate counts ahead -> 2
        ]
    )
    assert rank_of_target(target, cand).tolist() == [0, 2, 3, 3, 2]
    mask = torch.tensor([[True] * 3, [False, True, True], [True] * 3, [True] * 3, [True] * 3])
    assert rank_of_target(target, cand, mask)[1].item() == 1


class _Model:
    """Scores from a dense ``[n_users, n_items]`` table."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.calls = 0

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.table[users[:, None], items]

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        return self.table[users]


@pytest.fixture(scope="module")
def split() -> Split:
    data = make_synthetic(n_users=50, n_items=120, seed=2, min_history=8, mean_history=20.0)
    return leave_one_out(data, seed=2, n_eval_negatives=30)


def _train_mask(split: Split) -> torch.Tensor:
    mask = torch.zeros((split.n_users, split.n_items), dtype=torch.bool)
    mask[torch.from_numpy(split.train_users()), torch.from_numpy(split.train_items)] = True
    return mask


def test_oracle_scores_perfectly_even_when_training_items_score_higher(split: Split) -> None:
    table = torch.zeros((split.n_users, split.n_items))
    table[_train_mask(split)] = 10.0  # training positives are excluded from full ranking
    users = torch.arange(split.n_users)
    table[users, torch.from_numpy(split.val_items)] = 10.0  # the other held-out item too
    table[users, torch.from_numpy(split.test_items)] = 5.0
    model = _Model(table)
    result = evaluate(model, split, which="test", batch_size=7, per_user=True)
    assert (result.hr, result.ndcg, result.full_hr, result.full_ndcg) == (1.0, 1.0, 1.0, 1.0)
    assert model.calls == math.ceil(split.n_users / 7)
    assert result.ranks.shape == result.full_ranks.shape == (split.n_users,)
    # For validation the target (10) ties only training positives and the test item, all
    # excluded from full ranking; sampled negatives (never in the history) score 0.
    val = evaluate(model, split, which="val")
    assert val.full_hr == 1.0 and val.hr == 1.0 and val.ranks is None


def test_constant_model_gets_zero_not_a_lucky_hit(split: Split) -> None:
    result = evaluate(_Model(torch.ones((split.n_users, split.n_items))), split, which="test")
    assert result.hr == result.ndcg == result.full_hr == result.full_ndcg == 0.0


def test_ranks_match_an_independent_numpy_count(split: Split) -> None:
    gen = torch.Generator().manual_seed(0)
    table = torch.randint(0, 8, (split.n_users, split.n_items), generator=gen).float()  # ties
    result = evaluate(_Model(table), split, which="val", k=5, per_user=True)
    t = table.numpy()
    train = _train_mask(split).numpy()
    for u in range(split.n_users):
        target, other = split.val_items[u], split.test_items[u]
        s = t[u, target]
        assert result.ranks[u] == int((t[u, split.val_negatives[u]] >= s).sum())
        allowed = ~train[u]
        allowed[[target, other]] = False
        assert result.full_ranks[u] == int((t[u, allowed] >= s).sum())
    assert result.hr == pytest.approx(float((result.ranks < 5).mean()))
    assert result.full_ndcg == pytest.approx(
        float(np.where(result.full_ranks < 5, 1 / np.log2(result.full_ranks + 2), 0).mean())
    )


def test_evaluate_validates_arguments(split: Split) -> None:
    model = _Model(torch.zeros((split.n_users, split.n_items)))
    with pytest.raises(ConfigError, match="which"):
        evaluate(model, split, which="train")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch_size"):
        evaluate(model, split, which="val", batch_size=0)
    sampled_only = evaluate(model, split, which="val", full=False)
    assert sampled_only.full_hr is None and sampled_only.full_ndcg is None

    class Wrong(_Model):
        def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
            return super().score(users, items)[:, :3]

    with pytest.raises(ValueError, match="model.score returned shape"):
        evaluate(Wrong(model.table), split, which="val")


def test_full_ranking_of_a_user_sample_equals_the_same_users_ranked_among_all(split: Split) -> None:
    """``full_users`` ranks exactly those users as a full pass does (any batch size, users
    whose training rows are far apart); the sampled protocol still covers every user; the 95 %
    interval holds the sample mean and shrinks to a point when the sample is everyone."""
    from securefed.evaluation import eval_user_sample

    gen = torch.Generator().manual_seed(1)
    table = torch.rand((split.n_users, split.n_items), generator=gen)
    hits = torch.arange(0, split.n_users, 2)  # half the users' test items lifted: a mix
    table[hits, torch.from_numpy(split.test_items)[hits]] += 0.95
    whole = evaluate(_Model(table), split, which="test", per_user=True)
    users = eval_user_sample(split.n_users, 17, seed=3)
    assert users is not None and len(users) == 17 and (np.diff(users) > 0).all()
    assert (users == eval_user_sample(split.n_users, 17, seed=3)).all()  # fixed by the seed
    assert not (users == eval_user_sample(split.n_users, 17, seed=4)).all()
    part = evaluate(
        _Model(table), split, which="test", per_user=True, full_users=users, batch_size=5
    )
    assert (part.ranks == whole.ranks).all() and part.hr == whole.hr  # sampled: every user
    assert (part.full_ranks == whole.full_ranks[users]).all()
    assert part.full_hr == pytest.approx(float((whole.full_ranks[users] < 10).mean()))
    assert (part.full_users == users).all()
    lo, hi = part.full_hr_ci
    assert 0.0 <= lo <= part.full_hr <= hi <= 1.0 and hi > lo
    lo_n, hi_n = part.full_ndcg_ci
    assert lo_n <= part.full_ndcg <= hi_n
    # Finite-population correction: a sample of every user but one is nearly exact.
    near = evaluate(_Model(table), split, which="test", full_users=np.arange(1, split.n_users))
    assert near.full_hr_ci[1] - near.full_hr_ci[0] < hi - lo
    assert whole.full_hr_ci is None and whole.full_users is None
    assert eval_user_sample(split.n_users, split.n_users, seed=0) is None
    assert eval_user_sample(split.n_users, None, seed=0) is None
    for bad in (np.array([3, 3]), np.array([5, 2]), np.array([split.n_users]), np.array([], int)):
        with pytest.raises(ConfigError, match="full_users"):
            evaluate(_Model(table), split, which="test", full_users=bad)


@pytest.mark.parametrize("block", [False, True])
def test_evaluating_some_users_gives_their_rows_of_everyone_s(split: Split, block: bool) -> None:
    """``users``: a Flower node evaluates its own users only; their sampled and full ranks
    are their rows of an evaluation of every user (dense and item-block full ranking), and
    the metrics are over them."""
    from securefed.evaluation import evaluate_splits

    gen = torch.Generator().manual_seed(4)
    table = torch.rand((split.n_users, split.n_items), generator=gen)
    lift = torch.arange(1, split.n_users, 3)
    table[lift, torch.from_numpy(split.val_items)[lift]] += 0.9
    model = _BlockModel(table) if block else _Model(table)
    whole = evaluate_splits(model, split, per_user=True)
    own = np.arange(2, split.n_users, 3)  # one node's partition of three
    part = evaluate_splits(model, split, per_user=True, users=own, batch_size=4)
    for which in ("val", "test"):
        w, p = whole[which], part[which]
        assert (p.ranks == w.ranks[own]).all() and (p.full_ranks == w.full_ranks[own]).all()
        assert p.n_users == len(own) and p.hr == pytest.approx(float((w.ranks[own] < 10).mean()))
    with pytest.raises(ConfigError, match="not both"):
        evaluate_splits(model, split, users=own, full_users=own)
    with pytest.raises(ConfigError, match="sorted, distinct"):
        evaluate_splits(model, split, users=own[::-1])


class _BlockModel(_Model):
    """The same table, also scored in item blocks (the early-exit full-ranking path)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__(table)
        self.block_pairs = 0

    def score_block(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        self.block_pairs += int(users.numel() * items.numel())
        return self.table[users[:, None], items[None, :]]


@pytest.mark.parametrize("k", [1, 5, 10])
def test_block_ranking_equals_the_dense_pass_below_k_and_bounds_it_above(
    split: Split, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks below k are exact (ties and NaN pessimistic, as in the dense pass), ranks from k
    on are lower bounds that are still >= k, so HR@k and NDCG@k are those of the dense pass;
    a model scored by popularity lets most users leave early."""
    import securefed.evaluation as ev

    monkeypatch.setattr(ev, "FIRST_BLOCK", 7)  # several blocks over 120 items
    monkeypatch.setattr(ev, "LAST_BLOCK", 16)
    gen = torch.Generator().manual_seed(1)
    table = torch.randint(0, 6, (split.n_users, split.n_items), generator=gen).float()
    table[3, :40] = float("nan")  # NaN candidates rank ahead
    table[4] = float("nan")  # a NaN target ranks last
    counts = np.bincount(split.train_items, minlength=split.n_items)
    table += 0.5 * torch.from_numpy(counts).float()  # popular items score high
    dense = ev.evaluate_splits(_Model(table), split, k=k, per_user=True)
    block_model = _BlockModel(table)
    block = ev.evaluate_splits(block_model, split, k=k, per_user=True, batch_size=9)
    for w in ("val", "test"):
        d, b = dense[w].full_ranks, block[w].full_ranks
        assert d is not None and b is not None
        assert (b[d < k] == d[d < k]).all()
        assert (b[d >= k] >= k).all() and (b <= d).all()
        assert block[w].full_hr == dense[w].full_hr
        assert block[w].full_ndcg == pytest.approx(dense[w].full_ndcg, abs=0)
        assert (block[w].ranks == dense[w].ranks).all()  # the sampled protocol is unchanged
    assert 0 < block_model.block_pairs < split.n_users * split.n_items
    # Every user named as the sample is no sample: no interval, as on the dense path.
    every = ev.evaluate_splits(block_model, split, k=k, full_users=np.arange(split.n_users))
    assert every["val"].full_hr_ci is None and every["val"].full_users is None


def test_fedrecgel_block_scores_match_its_pair_scores() -> None:
    """FedRecGEL's factored block scorer gives its per-pair logits (to float tolerance) and
    the same full-ranking metrics as its dense ``score_all`` pass."""
    from securefed.evaluation import evaluate_splits
    from securefed.models.fedrecgel import FedRecGEL, FedRecGELConfig

    data = make_synthetic(n_users=40, n_items=300, seed=5, min_history=8, mean_history=25.0)
    split = leave_one_out(data, seed=5, n_eval_negatives=30)
    config = FedRecGELConfig(gmf_dim=8, mlp_dim=8, layers=(16, 8, 4))
    model = FedRecGEL(split, config, generator=torch.Generator().manual_seed(0))
    counts = torch.from_numpy(np.bincount(split.train_items, minlength=split.n_items)).float()
    model.shared["embed_item_gmf"] += 0.2 * torch.log1p(counts)[:, None]
    users = torch.arange(split.n_users)
    items = torch.arange(split.n_items)
    pairs = model.score(users, items.expand(split.n_users, -1))
    torch.testing.assert_close(model.score_block(users, items), pairs, rtol=1e-5, atol=1e-5)

    class Dense:
        score = model.score
        score_all = model.score_all

    block = evaluate_splits(model, split, per_user=True)
    dense = evaluate_splits(Dense(), split, per_user=True)
    for w in ("val", "test"):
        assert block[w].full_hr == dense[w].full_hr
        assert block[w].full_ndcg == pytest.approx(dense[w].full_ndcg)
    # The item table is cached per parameter state: an in-place update is seen.
    before = model.score(users[:3], items[None, :5].expand(3, -1))
    model.shared["mlp.0.bias"].add_(1.0)
    assert not torch.equal(model.score(users[:3], items[None, :5].expand(3, -1)), before)
