"""FedRAP's sparse private views (issue 17): the same bits as the dense views, a lossless
checkpoint, the automatic choice between the two, and the memory estimate that lets Gowalla
run."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from securefed import runs
from securefed.config import PrivacyConfig, TrainConfig
from securefed.costs import (
    InsufficientMemory,
    RunShape,
    check_memory,
    estimate_run,
    state_bytes,
    state_bytes_of,
)
from securefed.errors import ConfigError
from securefed.models.fedrap import FedRAP, FedRAPConfig, resolve_views
from securefed.models.sparse_views import SparseViews
from securefed.training import train

# A catalogue much larger than what a user samples in a round, half the users per round and
# small local batches (so some clients take several sub-steps per epoch).
PARAMS = FedRAPConfig(local_epochs=2, batch_size=64)
BASE = dict(
    model="fedrap",
    synthetic_users=40,
    synthetic_items=2000,
    client_fraction=0.5,
    rounds=4,
    eval_every=1,
)
GOWALLA = RunShape(users=29_858, items=40_981, train_interactions=863_792)


def _cfg(views: str, **kw) -> TrainConfig:
    return TrainConfig(**{**BASE, "params": dataclasses.replace(PARAMS, views=views), **kw})


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _assert_same_model(a: FedRAP, b: FedRAP) -> None:
    assert _same(a.dense_views(), b.dense_views()), "D"
    for key in ("C", "w", "b", "_d_scale"):
        assert _same(getattr(a, key), getattr(b, key)), key
    assert (a.lr_args, a.lr_network) == (b.lr_args, b.lr_network)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The same run with dense and with sparse views."""
    tmp = tmp_path_factory.mktemp("views")
    dense = train(_cfg("dense"), out=tmp / "dense")
    sparse = train(_cfg("sparse"), out=tmp / "sparse")
    return dense, sparse


def test_sparse_views_train_to_the_same_bits_as_dense(trained):
    dense, sparse = trained
    assert (dense.model.views, sparse.model.views) == ("dense", "sparse")
    _assert_same_model(dense.model, sparse.model)
    # Every round's loss and every evaluation (sampled: score; full ranking: score_all).
    strip = [{k: v for k, v in m.items() if "seconds" not in k} for m in dense.metrics]
    assert strip == [{k: v for k, v in m.items() if "seconds" not in k} for m in sparse.metrics]
    # Half the users per round over 4 rounds: some users and most rows were never written.
    n_users, n_items = sparse.model.split.n_users, sparse.model.split.n_items
    written = sparse.model.written_rows()
    assert 0 < written < n_users * n_items // 2
    assert written == dense.model.written_rows()


def test_sparse_scores_equal_dense_scores(trained):
    """Sampled scores bit for bit; full-ranking scores to float summation order (the sparse
    path's base matmul against the dense path's ``bmm``): within 1e-6 of each other, and the
    same for any subset of users asked for."""
    dense, sparse = trained
    d, s = dense.model, sparse.model
    gen = torch.Generator().manual_seed(3)
    users = torch.randperm(d.split.n_users, generator=gen)[:17]
    items = torch.randint(0, d.split.n_items, (17, 30), generator=gen)
    assert _same(s.score(users, items), d.score(users, items))
    everyone = torch.arange(d.split.n_users)
    expected = d.score_all(everyone)
    got = s.score_all(everyone)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.equal(expected, torch.full_like(expected, 0.5))
    for subset in (users, users[:16], users[:1]):
        torch.testing.assert_close(s.score_all(subset), got[subset], rtol=0, atol=1e-6)


def test_sparse_checkpoint_round_trips_into_sparse_and_dense_models(trained):
    dense, sparse = trained
    state = sparse.model.checkpoint_state()
    assert {"D_base", "D_keys", "D_rows"} <= set(state) and "D" not in state
    assert state["D_rows"].shape[0] == sparse.model.written_rows()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    saved = torch.load(buf)
    split = sparse.model.split
    for views in ("sparse", "dense"):
        fresh = FedRAP(
            split,
            dataclasses.replace(PARAMS, views=views),
            generator=torch.Generator().manual_seed(99),  # a different initial view
        )
        fresh.load_state_dict(
            {k: (v.clone() if torch.is_tensor(v) else v) for k, v in saved.items()}
        )
        assert fresh.views == views
        _assert_same_model(fresh, dense.model)
    # A dense D (the form attacks/imia.py builds) and the dense model's checkpoint form.
    for source in (dense.model.state_dict(), dense.model.checkpoint_state()):
        back = FedRAP(
            split, dataclasses.replace(PARAMS, views="sparse"), generator=torch.Generator()
        )
        back._d_base = dense.model._d_base.clone()
        back.load_state_dict(
            {k: (v.clone() if torch.is_tensor(v) else v) for k, v in source.items()}
        )
        assert back.views == "sparse"
        _assert_same_model(back, sparse.model)
        assert back.written_rows() == sparse.model.written_rows()


def _interrupted_after_round_2(views: str, out) -> dict:
    """Train ``_cfg(views)`` into ``out``, stopped by Ctrl-C after round 2 (checkpointed);
    the model state its checkpoint holds."""

    def stop_at_2(record):
        if record.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_cfg(views), out=out, progress=stop_at_2)
    return runs.load_checkpoint(out)["model"]


def test_resume_from_a_sparse_checkpoint_equals_the_uninterrupted_run(trained, tmp_path):
    _, sparse = trained
    assert "D_keys" in _interrupted_after_round_2("sparse", tmp_path / "cut")
    resumed = train(resume=tmp_path / "cut")
    _assert_same_model(resumed.model, sparse.model)


def test_sparse_state_formula_is_exactly_the_state_dict(trained):
    _, sparse = trained
    model = sparse.model
    shape = RunShape(users=model.split.n_users, items=model.split.n_items, train_interactions=1)
    expected = state_bytes("fedrap", model.config, shape, written_rows=model.written_rows())
    assert expected == state_bytes_of(model.state_dict())


def test_auto_keeps_small_views_dense_and_large_ones_sparse(small_split):
    cfg = FedRAPConfig(dim=4)
    dense_bytes = small_split.n_users * small_split.n_items * 4 * 4
    gen = torch.Generator().manual_seed(0)
    at_budget = FedRAP(small_split, cfg, generator=gen, views_budget=dense_bytes)
    assert at_budget.views == "dense" and at_budget.D.shape[0] == small_split.n_users
    below = FedRAP(small_split, cfg, generator=gen, views_budget=dense_bytes - 1)
    assert below.views == "sparse" and below.written_rows() == 0
    with pytest.raises(ConfigError, match="sparsely"):
        _ = below.D
    # The default budget: MovieLens 100K dense, Gowalla sparse; a forced choice wins.
    assert resolve_views(FedRAPConfig(), 943, 1682, dpsgd=False) == "dense"
    assert resolve_views(FedRAPConfig(), GOWALLA.users, GOWALLA.items, dpsgd=False) == "sparse"
    forced = FedRAPConfig(views="dense")
    assert resolve_views(forced, GOWALLA.users, GOWALLA.items, dpsgd=False) == "dense"
    assert resolve_views(FedRAPConfig(views="sparse"), 2, 2, dpsgd=False) == "sparse"


def test_dpsgd_keeps_dense_views():
    assert resolve_views(FedRAPConfig(), GOWALLA.users, GOWALLA.items, dpsgd=True) == "dense"
    with pytest.raises(ConfigError, match="views='sparse'"):
        resolve_views(FedRAPConfig(views="sparse"), 2, 2, dpsgd=True)
    with pytest.raises(ConfigError, match="views"):
        FedRAPConfig(views="lazy")  # type: ignore[arg-type]


def test_sparse_views_put_merges_and_overwrites():
    base = torch.arange(12, dtype=torch.float32).view(3, 4)  # 3 items, dim 4
    views = SparseViews(base, n_users=2)
    views.put(torch.tensor([5, 1]), torch.full((2, 4), -1.0))
    views.put(torch.tensor([3, 5, 0]), torch.stack([torch.full((4,), v) for v in (7.0, 8.0, 9.0)]))
    assert views.keys.tolist() == [0, 1, 3, 5]
    expected = base.unsqueeze(0).repeat(2, 1, 1)
    flat = expected.view(-1, 4)
    flat[1], flat[5], flat[3], flat[0] = -1.0, 8.0, 7.0, 9.0
    assert torch.equal(views.dense(), expected)
    assert torch.equal(views.user_block(torch.tensor([1, 0])), expected[[1, 0]])
    assert torch.equal(
        views.gather(torch.tensor([[4, 5], [2, 0]])), flat[torch.tensor([[4, 5], [2, 0]])]
    )


@pytest.mark.parametrize(
    ("keys", "rows", "match"),
    [
        ([3, 1], 2, "increasing"),
        ([1, 1], 2, "increasing"),
        ([0, 6], 2, r"\[0, 6\)"),
        ([0, 1], 1, "D_rows"),
    ],
)
def test_sparse_views_reject_keys_that_describe_no_matrix(keys, rows, match):
    with pytest.raises(ValueError, match=match):
        SparseViews(torch.zeros(3, 4), 2, torch.tensor(keys), torch.zeros(rows, 4))


def _gowalla(**kw) -> TrainConfig:
    return TrainConfig(model="fedrap", client_fraction=0.1, rounds=5, eval_users=3000, **kw)


def test_gowalla_at_a_tenth_of_the_users_is_estimated_sparse_and_fits():
    cfg = _gowalla()
    est = estimate_run(cfg, GOWALLA, speed=1.0)
    assert "D" not in est.state
    # Round 1: a tenth of the positives and 4 negatives each; the same positives return.
    per_round = 0.1 * GOWALLA.train_interactions
    bound = round(0.5 * GOWALLA.train_interactions + 5 * per_round * 4)
    assert abs(est.state["D_keys"] / 8 - bound) <= 1
    assert est.state["D_rows"] == est.state["D_keys"] // 8 * 32 * 4
    assert est.peak_memory < 4 * 10**9
    check_memory(cfg, est, available=24 * 10**9)
    # The bound never passes users x items.
    many = estimate_run(dataclasses.replace(cfg, rounds=10**6), GOWALLA, speed=1.0)
    assert many.state["D_keys"] == GOWALLA.users * GOWALLA.items * 8


def test_refusals_suggest_what_fits_sparse_views(monkeypatch):
    monkeypatch.setattr("securefed.costs.free_disk", lambda directory="": 50 * 10**9)
    dense = _gowalla(params=FedRAPConfig(views="dense"))
    with pytest.raises(InsufficientMemory, match="--param views=sparse would fit"):
        check_memory(dense, estimate_run(dense, GOWALLA, speed=1.0), available=24 * 10**9)
    long = dataclasses.replace(_gowalla(), client_fraction=1.0, rounds=100)
    est = estimate_run(long, GOWALLA, speed=1.0)
    with pytest.raises(InsufficientMemory, match=r"--client-fraction (\S+) would fit") as info:
        check_memory(long, est, available=24 * 10**9)
    fraction = float(str(info.value).split("--client-fraction ")[1].split()[0])
    fits = dataclasses.replace(long, client_fraction=fraction)
    assert estimate_run(fits, GOWALLA, speed=1.0).peak_memory <= 24 * 10**9
    # Interaction-level DP-SGD keeps the views dense: refused; where not even dim 1 fits, the
    # message says why no flag helps.
    dp = _gowalla(privacy=PrivacyConfig(epsilon=2.0, privacy_unit="interaction"))
    est = estimate_run(dp, GOWALLA, speed=1.0)
    assert est.state["D"] == GOWALLA.users * GOWALLA.items * 32 * 4
    with pytest.raises(InsufficientMemory, match="--param dim=2 would fit"):
        check_memory(dp, est, available=24 * 10**9)
    with pytest.raises(InsufficientMemory, match="DP-SGD keeps FedRAP's private views dense"):
        check_memory(dp, est, available=4 * 10**9)
