"""A finished run's released model, scored again from its run directory
(:func:`securefed.released.load_released`)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from securefed import runs
from securefed.config import TrainConfig, with_private_mode
from securefed.errors import ConfigError, IntegrityError
from securefed.evaluation import evaluate_splits
from securefed.released import load_released
from securefed.training import train

SMALL = {"synthetic_users": 120, "synthetic_items": 300, "rounds": 2}


def _final(summary: dict, key: str) -> float:
    return float(summary[f"final_test_{key}"])


def _same_as_run(released, summary) -> None:
    test = evaluate_splits(released.model, released.split)["test"]
    assert math.isclose(test.hr, _final(summary, "hr@10"), abs_tol=1e-9)
    assert math.isclose(test.full_hr, _final(summary, "full_hr@10"), abs_tol=1e-9)


def test_fedals_model_pt_scores_as_the_run_did(tmp_path):
    """fedals's users solve their factors from the released item factors and their own
    items: ``model.pt`` alone reproduces the last round's test metrics."""
    run = tmp_path / "r"
    result = train(TrainConfig(model="fedals", **SMALL), out=run)
    released = load_released(run)
    assert released.clients == "complete" and released.round == 2
    _same_as_run(released, result.summary)
    top = released.recommend(3, k=5)
    seen = set(
        released.split.train_items[released.split.train_indptr[3] : released.split.train_indptr[4]]
    )
    assert len(top) == 5 and not seen & set(top.tolist())
    assert (
        released.recommend(3, k=5, exclude_seen=False).tolist()
        == torch.topk(released.scores(3), 5).indices.tolist()
    )
    with pytest.raises(ConfigError, match="not one of the run's 120 users"):
        released.scores(120)


@pytest.mark.parametrize("keep", [False, True], ids=["model-pt", "kept-state"])
def test_a_private_model_with_the_prior_keeps_its_counts(tmp_path, keep):
    """A private FedRecGEL's scores are mostly the released popularity counts, which
    ``model.pt`` did not hold (found by a library walkthrough: it scored below random
    scores, 0.074 sampled HR@10 against the run's 0.436 on MovieLens 100K). They are kept
    beside the shared parameters; with ``--keep-private-state`` the users' own state is
    loaded too and the scores are the run's exactly."""
    raw = with_private_mode({"model": "fedrecgel", **SMALL, "privacy": {"epsilon": 2.0}})
    raw["keep_private_state"] = keep
    config = TrainConfig.from_dict(raw)
    run = tmp_path / "r"
    result = train(config, out=run)
    saved = runs.load_state(run / runs.MODEL_FILE)
    assert saved is not None and "popularity_prior" in saved
    prior = runs.load_state(run / "popularity_prior.pt")
    assert prior is not None and torch.equal(saved["popularity_prior"]["counts"], prior["counts"])
    released = load_released(run)
    assert torch.equal(released.model.prior.counts, prior["counts"])  # type: ignore[attr-defined]
    if keep:
        assert released.clients == "checkpoint"
        _same_as_run(released, result.summary)
    else:
        assert released.clients == "fresh"
        without = dict(saved)
        without.pop("popularity_prior")
        runs.save_state(run / runs.MODEL_FILE, without)
        with pytest.raises(IntegrityError, match="lacks the released popularity counts"):
            load_released(run)


def test_what_is_not_a_finished_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="is not a run directory"):
        load_released(tmp_path)
    run = tmp_path / "r"
    train(TrainConfig(model="mostpop", **SMALL), out=run)
    other = tmp_path / "o"
    train(TrainConfig(model="fedals", **SMALL), out=other)
    shutil.copy(other / runs.MODEL_FILE, run / runs.MODEL_FILE)
    with pytest.raises(IntegrityError, match="was written by 'fedals'"):
        load_released(run)
    (run / runs.MODEL_FILE).unlink()
    with pytest.raises(ConfigError, match="has not finished"):
        load_released(run)
