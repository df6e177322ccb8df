"""Leave-one-out invariants, evaluation negatives and the synthetic dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.data import Interactions, LoadReport, leave_one_out, make_synthetic
from securefed.data.loaders import load_filmtrust, load_ml100k
from securefed.data.split import complement_items
from securefed.errors import ConfigError, DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(
    not (SHARED / "ml-100k" / "u.data").is_file(),
    reason=f"reference data not found at {SHARED} (clone ../shared beside the repo)",
)


def make_interactions(
    pairs: list[tuple[int, int]], n_items: int, timestamps: list[float] | None = None
) -> Interactions:
    users = np.array([u for u, _ in pairs], dtype=np.int64)
    n_users = int(users.max()) + 1
    return Interactions(
        name="tiny",
        users=users,
        items=np.array([i for _, i in pairs], dtype=np.int64),
        timestamps=None if timestamps is None else np.asarray(timestamps, dtype=np.float64),
        n_users=n_users,
        n_items=n_items,
        user_ids=np.arange(n_users),
        item_ids=np.arange(n_items),
        report=LoadReport(
            source="test",
            raw_rows=len(pairs),
            duplicate_rows=0,
            dropped_users=0,
            dropped_interactions=0,
        ),
    )


@st.composite
def datasets(draw: st.DrawFn, *, timestamps: bool | None = None) -> Interactions:
    n_items = draw(st.integers(8, 40))
    n_users = draw(st.integers(1, 12))
    with_ts = draw(st.booleans()) if timestamps is None else timestamps
    pairs, ts = [], []
    for u in range(n_users):
        k = draw(st.integers(3, n_items - 4))
        items = draw(st.permutations(range(n_items)))[:k]
        pairs += [(u, i) for i in items]
        ts += draw(st.lists(st.integers(0, 5), min_size=k, max_size=k))  # many ties
    return make_interactions(pairs, n_items, [float(t) for t in ts] if with_ts else None)


def _check_split(data: Interactions, split, n_neg: int) -> None:
    n_users, n_items = data.n_users, data.n_items
    assert split.val_negatives.shape == split.test_negatives.shape == (n_users, n_neg)
    hist = {u: set() for u in range(n_users)}
    for u, i in zip(data.users.tolist(), data.items.tolist(), strict=True):
        hist[u].add(i)
    for u in range(n_users):
        train = split.user_train_items(u)
        assert np.all(np.diff(train) > 0)  # sorted, unique
        val, test = int(split.val_items[u]), int(split.test_items[u])
        assert val != test and val not in train and test not in train
        assert set(train.tolist()) | {val, test} == hist[u]
        h = split.history_items[split.history_indptr[u] : split.history_indptr[u + 1]]
        assert set(h.tolist()) == hist[u]
        for negs in (split.val_negatives[u], split.test_negatives[u]):
            assert len(set(negs.tolist())) == n_neg
            assert not set(negs.tolist()) & hist[u]
            assert negs.min(initial=0) >= 0 and negs.max(initial=0) < n_items
    assert split.n_train == len(data.users) - 2 * n_users


@settings(max_examples=40, deadline=None)
@given(data=datasets(), seed=st.integers(0, 2**32), n_neg=st.integers(0, 4))
def test_split_invariants_property(data: Interactions, seed: int, n_neg: int) -> None:
    split = leave_one_out(data, seed=seed, n_eval_negatives=n_neg)
    _check_split(data, split, n_neg)
    if data.timestamps is not None:
        # Test is the latest, val the second latest; equal times: the later row wins.
        for u in range(data.n_users):
            rows = np.nonzero(data.users == u)[0]
            order = rows[np.lexsort((rows, data.timestamps[rows]))]
            assert data.items[order[-1]] == split.test_items[u]
            assert data.items[order[-2]] == split.val_items[u]


@settings(max_examples=40, deadline=None)
@given(data=datasets(), seed=st.integers(0, 2**32))
def test_complement_items_matches_brute_force(data: Interactions, seed: int) -> None:
    split = leave_one_out(data, seed=seed, n_eval_negatives=0)
    ip, items = split.history_indptr, split.history_items
    for u in range(data.n_users):
        allowed = np.setdiff1d(np.arange(data.n_items), items[ip[u] : ip[u + 1]])
        ranks = np.arange(len(allowed))
        got = complement_items(ip, items, data.n_items, np.full_like(ranks, u), ranks)
        assert np.array_equal(got, allowed)


@needs_shared
def test_ml100k_split_respects_time() -> None:
    data = load_ml100k(SHARED / "ml-100k")
    split = leave_one_out(data, seed=0)
    _check_split(data, split, 99)
    ts = {(u, i): t for u, i, t in zip(data.users, data.items, data.timestamps, strict=True)}
    for u in range(data.n_users):
        t_test, t_val = ts[u, split.test_items[u]], ts[u, split.val_items[u]]
        assert t_test >= t_val >= max(ts[u, i] for i in split.user_train_items(u))
    again = leave_one_out(data, seed=0)
    assert np.array_equal(again.test_negatives, split.test_negatives)
    other = leave_one_out(data, seed=1)
    assert np.array_equal(other.test_items, split.test_items)  # timestamps fix the split
    assert not np.array_equal(other.test_negatives, split.test_negatives)
    assert not np.array_equal(split.val_negatives, split.test_negatives)


@settings(max_examples=30, deadline=None)
@given(data=datasets(timestamps=False), who=st.integers(0, 11), seed=st.integers(0, 3))
def test_one_users_data_never_moves_another_users_split(data, who, seed) -> None:
    """User-level DP (zero-out): without timestamps the tie order is a keyed hash of each
    interaction's own (user, item), so replacing one user's rows (here by its first 3, file
    order) leaves every other user's train, validation and test items as they were. One
    stream in file order (before 2026-12-06) re-split every later user (found in review)."""
    who = who % data.n_users
    mine = np.flatnonzero(data.users == who)
    keep = np.ones(len(data.users), dtype=bool)
    keep[mine[3:]] = False
    neighbour = make_interactions(
        list(zip(data.users[keep].tolist(), data.items[keep].tolist(), strict=True)),
        data.n_items,
    )
    if neighbour.n_users != data.n_users:  # the last user kept fewer rows: same users
        return
    a, b = (
        leave_one_out(data, seed=seed, n_eval_negatives=0),
        leave_one_out(neighbour, seed=seed, n_eval_negatives=0),
    )
    for u in range(data.n_users):
        if u == who:
            continue
        assert np.array_equal(a.user_train_items(u), b.user_train_items(u))
        assert a.val_items[u] == b.val_items[u] and a.test_items[u] == b.test_items[u]


@needs_shared
def test_filmtrust_split_uses_seeded_permutation() -> None:
    data = load_filmtrust(SHARED / "filmtrust")
    a, b = leave_one_out(data, seed=3), leave_one_out(data, seed=3)
    c = leave_one_out(data, seed=4)
    assert np.array_equal(a.test_items, b.test_items) and np.array_equal(a.val_items, b.val_items)
    assert (a.test_items != c.test_items).mean() > 0.5  # a different random pair per user
    _check_split(data, a, 99)


def test_split_rejects_short_users_duplicates_and_bad_sizes() -> None:
    short = make_interactions([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)], 10)
    with pytest.raises(DataError, match="1 user\\(s\\) have fewer than 3.*min_interactions"):
        leave_one_out(short, seed=0)
    dup = make_interactions([(0, 0), (0, 1), (0, 1)], 10)
    with pytest.raises(DataError, match="duplicate"):
        leave_one_out(dup, seed=0)
    ok = make_interactions([(0, 0), (0, 1), (0, 2)], 10)
    # 7 items left: fewer than a run's least (10); --synthetic-items is no fix for a file.
    with pytest.raises(DataError, match="fewer than the 8 negatives") as caught:
        leave_one_out(ok, seed=0, n_eval_negatives=8)
    assert str(caught.value).endswith(
        "a run draws at least 10 (--eval-negatives): use a dataset with more items"
    )
    rows = [(0, i) for i in range(30)] + [(1, 0), (1, 1), (1, 2)]
    with pytest.raises(DataError, match="draw 20 or fewer \\(--eval-negatives 20; eval_neg"):
        leave_one_out(make_interactions(rows, 50), seed=0, n_eval_negatives=21)
    synthetic = make_synthetic(n_users=20, n_items=60, seed=0)
    with pytest.raises(DataError, match="more items \\(--synthetic-items \\d+ or more\\)"):
        leave_one_out(synthetic, seed=0)
    with pytest.raises(ConfigError, match="non-negative"):
        leave_one_out(ok, seed=0, n_eval_negatives=-1)
    assert sorted(leave_one_out(ok, seed=0, n_eval_negatives=7).test_negatives[0]) == list(
        range(3, 10)
    )


def test_eval_negatives_are_uniform() -> None:
    """Each of the 7 allowed items is drawn with probability 2/7 per user row.

    20000 rows x 2 draws; the count of every item is Binomial(20000, 2/7), sd ~64. A 7-sd
    tolerance gives a false-failure rate below 1e-10; a sampler that never picks one item, or
    favours one allowed item by 10 % (571 draws, 8.9 sd), fails.
    """
    pairs = [(u, i) for u in range(20000) for i in (0, 4, 9)]
    split = leave_one_out(make_interactions(pairs, 10), seed=0, n_eval_negatives=2)
    counts = np.bincount(split.test_negatives.ravel(), minlength=10)
    assert counts[[0, 4, 9]].sum() == 0
    expected = 20000 * 2 / 7
    sd = np.sqrt(20000 * (2 / 7) * (5 / 7))
    assert np.all(np.abs(counts[[1, 2, 3, 5, 6, 7, 8]] - expected) < 7 * sd)


def test_synthetic_is_deterministic_and_shaped_like_ml100k() -> None:
    # Its speed is a benchmark's business (docs/benchmarks.md), never a timed assertion.
    data = make_synthetic()
    again, other = make_synthetic(), make_synthetic(seed=1)
    assert np.array_equal(data.items, again.items)
    assert np.array_equal(data.timestamps, again.timestamps)
    assert not np.array_equal(data.items, other.items)
    assert (data.n_users, data.n_items) == (943, 1682) and data.report.synthetic
    assert data.report.notes[0].startswith("synthetic data:")
    counts = np.bincount(data.users, minlength=data.n_users)
    assert counts.min() >= 20 and 90 < counts.mean() < 125 and counts.max() > 400
    pairs = data.users * data.n_items + data.items
    assert len(np.unique(pairs)) == len(pairs)
    pop = np.sort(np.bincount(data.items, minlength=data.n_items))[::-1]
    assert pop[:168].sum() > 0.25 * pop.sum()  # top 10 % of items: a quarter of interactions
    gender = data.attributes["gender"]
    assert set(np.unique(gender)) == {0, 1} and 0.25 < gender.mean() < 0.33
    _check_split(data, leave_one_out(data, seed=0), 99)


def test_synthetic_attribute_is_predictable_from_behaviour() -> None:
    """The planted attribute leaves a trace in what users pick (signal for attacks).

    Items' female share in the first half of users predicts gender in the second half far
    better than chance (AUC > 0.75); with ``attribute_strength=0`` it does not (< 0.6).
    """

    def auc(strength: float) -> float:
        data = make_synthetic(n_users=2000, n_items=400, attribute_strength=strength, seed=5)
        g = data.attributes["gender"]
        half = data.users < 1000
        f = np.bincount(data.items[half], weights=g[data.users[half]], minlength=400)
        n = np.bincount(data.items[half], minlength=400)
        share = (f + 1) / (n + 2)
        score = (
            np.bincount(
                data.users[~half], weights=np.log(share[data.items[~half]]), minlength=2000
            )[1000:]
            / np.bincount(data.users[~half], minlength=2000)[1000:]
        )
        y = g[1000:]
        pos, neg = score[y == 1], score[y == 0]
        return float((pos[:, None] > neg[None, :]).mean())

    assert auc(2.0) > 0.75
    assert auc(0.0) < 0.6
