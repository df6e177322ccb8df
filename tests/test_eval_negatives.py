"""A catalogue too small for the papers' 99 sampled evaluation negatives (a shop's 40 items):
the run is refused in one line naming the ``--eval-negatives`` that fits, and runs with it;
``config.toml`` records it, so a resume and ``audit --run`` split the data the same way."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
from typer.testing import CliRunner

from securefed import runs
from securefed.cli import app
from securefed.config import TrainConfig
from securefed.data import load_dataset
from securefed.data.split import DEFAULT_EVAL_NEGATIVES, MIN_EVAL_NEGATIVES
from securefed.errors import ConfigError
from securefed.training import RunInterrupted, train

runner = CliRunner()


def _shop(path, n_items: int = 40, n_users: int = 60, most: int = 15):
    rng = np.random.default_rng(1)
    rows = [
        f"c{u},sku{i},{t}\n"
        for u in range(n_users)
        for t, i in enumerate(rng.choice(n_items, size=int(rng.integers(5, most)), replace=False))
    ]
    path.write_text("user,item,timestamp\n" + "".join(rows))
    return path


def _fewest_unseen(path) -> int:
    """The fewest items a user of the loaded table never interacted with."""
    data = load_dataset(str(path), min_interactions=5)
    return int(data.n_items - np.bincount(data.users).max())


def _one_line(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def test_a_small_catalogue_is_refused_naming_the_flag_and_runs_with_it(tmp_path, monkeypatch):
    from securefed.cli import common

    monkeypatch.setattr(common.out, "width", 200)  # the table's cells unwrapped (xdist: 80)
    shop = _shop(tmp_path / "shop.csv")
    fits = _fewest_unseen(shop)
    assert MIN_EVAL_NEGATIVES <= fits < DEFAULT_EVAL_NEGATIVES
    args = ["train", "--model", "mostpop", "--dataset", str(shop)]
    line = _one_line(runner.invoke(app, [*args, "--out", str(tmp_path / "no")]))
    assert "fewer than the 99 negatives" in line and f"--eval-negatives {fits};" in line, line
    assert "--synthetic-items" not in line  # a flag of the synthetic data only
    assert not (tmp_path / "no").exists()
    one_more = runner.invoke(app, [*args, "--eval-negatives", str(fits + 1), "--dry-run"])
    assert f"draw {fits} or fewer" in _one_line(one_more)

    out = tmp_path / "run"
    res = runner.invoke(app, [*args, "--eval-negatives", str(fits), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"HR@10 (sampled, {fits} negatives)" in res.output, res.output
    assert tomllib.loads((out / runs.CONFIG_FILE).read_text())["eval_negatives"] == fits
    summary = json.loads((out / runs.SUMMARY_FILE).read_text())
    assert summary["eval_negatives"] == fits
    # Random scores rank the held-out item uniformly among itself and the fits negatives.
    assert summary["baseline_random_test_hr@10"] == pytest.approx(10 / (fits + 1))


def test_a_catalogue_too_small_for_ten_negatives_says_a_run_needs_more_items(tmp_path):
    shop = _shop(tmp_path / "tiny.csv", n_items=16, n_users=20, most=12)
    assert _fewest_unseen(shop) < MIN_EVAL_NEGATIVES
    res = runner.invoke(app, ["train", "--model", "mostpop", "--dataset", str(shop), "--dry-run"])
    line = _one_line(res)
    assert "a run draws at least 10 (--eval-negatives): use a dataset with more items" in line


def test_a_resume_and_audit_run_split_as_the_run_recorded(tmp_path):
    shop = _shop(tmp_path / "shop.csv")
    run = tmp_path / "run"
    cfg = TrainConfig(
        model="fedals", dataset=str(shop), eval_negatives=20, rounds=2, checkpoint_every=1
    )

    def stop(record):
        if record.round == 1:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train(cfg, out=run, progress=stop)
    resumed = train(resume=run)
    assert resumed.split.val_negatives.shape == (resumed.split.n_users, 20)
    assert resumed.summary["rounds"] == 2 and resumed.summary["eval_negatives"] == 20
    # audit --run re-simulates a run from its config.toml (a mostpop run: the cheapest).
    counted = tmp_path / "counted"
    train(TrainConfig(model="mostpop", dataset=str(shop), eval_negatives=20), out=counted)
    res = runner.invoke(
        app, ["audit", "--run", str(counted), "--canaries", "0", "--out", str(tmp_path / "a")]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["audit", "--run", str(run), "--eval-negatives", "30"])
    assert res.exit_code == 2 and "drop --eval-negatives" in res.output, res.output
    res = runner.invoke(app, ["train", "--resume", str(run), "--eval-negatives", "30"])
    assert res.exit_code == 2 and "drop --eval-negatives" in res.output, res.output


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (9, "eval negatives must be an integer >= 10 .* HR@10 would be 1 whatever"),
        (0, "eval negatives must be an integer >= 10"),
        (True, "eval_negatives must be a whole number, got True"),
        ("20", "eval_negatives must be a whole number, got '20'; write 20 without quotes"),
    ],
)
def test_eval_negatives_must_be_a_count_of_at_least_ten(value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(eval_negatives=value)


def test_the_default_is_the_papers_99_and_an_older_config_reads_as_it(tmp_path):
    assert TrainConfig().eval_negatives == DEFAULT_EVAL_NEGATIVES == 99
    recorded = TrainConfig().to_dict()
    del recorded["eval_negatives"]  # a config.toml written before the setting
    assert TrainConfig.from_dict(recorded).eval_negatives == 99
    config = tmp_path / "c.toml"
    config.write_text("model = 'mostpop'\neval_negatives = 50\nsynthetic_users = 60\n")
    res = runner.invoke(app, ["train", "--config", str(config), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "r" / runs.SUMMARY_FILE).read_text())
    assert summary["eval_negatives"] == 50
