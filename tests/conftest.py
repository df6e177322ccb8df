"""Shared fixtures: real data from ../shared/data and small synthetic splits."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _fresh_calibration():
    """Every test calibrates from scratch: ``calibrate_noise_multiplier`` remembers its
    answers, and a test that patches the accountant must neither leave its answer behind
    nor read another test's (found in review)."""
    from protocols.dp.accounting import _calibrated

    _calibrated.cache_clear()
    yield
    _calibrated.cache_clear()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The reference data folder beside the project (skips when it is absent)."""
    if not (SHARED_DATA / "ml-100k" / "u.data").exists():
        pytest.skip(f"reference data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def small_split():
    """A small deterministic synthetic leave-one-out split (40 users x 60 items)."""
    from securefed.data.split import leave_one_out
    from securefed.data.synthetic import make_synthetic

    data = make_synthetic(n_users=40, n_items=60, seed=3, min_history=6, mean_history=14.0)
    return leave_one_out(data, seed=3, n_eval_negatives=20)


@pytest.fixture(scope="session")
def small_split_data() -> dict[str, int]:
    """TrainConfig settings that describe ``small_split`` (``train(config, split=...)``
    refuses a split its config does not describe)."""
    return {"seed": 3, "synthetic_users": 40, "synthetic_items": 60}
