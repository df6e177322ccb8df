"""securefed used as a library (``import securefed``): a mistake through the Python API is
one clear SecureFedError, and what a run records is what it trained on."""

from __future__ import annotations

import pytest

import securefed
from securefed import ConfigError, PrivacyConfig, TrainConfig, with_private_mode


@pytest.fixture(scope="module")
def other_split():
    """A synthetic split of other sizes than ``small_split`` (50 users x 80 items)."""
    from securefed.data.split import leave_one_out
    from securefed.data.synthetic import make_synthetic

    data = make_synthetic(n_users=50, n_items=80, seed=3, min_history=6, mean_history=14.0)
    return leave_one_out(data, seed=3, n_eval_negatives=20)


# Raw Python exceptions through the public API -------------------------------------------


def test_train_refuses_a_config_that_is_not_a_train_config(tmp_path):
    with pytest.raises(ConfigError, match=r"config must be a TrainConfig, got str 'fedals'"):
        securefed.train("fedals", out=tmp_path / "run")  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_split_that_is_not_a_split(tmp_path):
    with pytest.raises(ConfigError, match=r"split must be a securefed\.data\.types\.Split.*str"):
        securefed.train(TrainConfig(rounds=1), split="x", out=tmp_path / "run")  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_from_dict_refuses_what_is_not_a_mapping():
    with pytest.raises(ConfigError, match="takes a mapping of settings.*got list"):
        TrainConfig.from_dict([("model", "fedals")])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"model": "fedrap", "privacy": None}, r"\[privacy\] must be a table"),
        ({"model": 3}, "model must be a string, got 3"),
        (["fedrap"], "takes a mapping of settings.*got list"),
    ],
)
def test_with_private_mode_refuses_what_is_not_a_config_mapping(raw, message):
    with pytest.raises(ConfigError, match=message):
        with_private_mode(raw)


def test_an_unknown_setting_names_the_settings_that_exist():
    with pytest.raises(ConfigError) as info:
        TrainConfig(epochs=3)  # type: ignore[call-arg]
    text = str(info.value)
    assert "TrainConfig has no setting 'epochs'" in text
    assert "rounds" in text and "privacy" in text and "params=" in text
    assert "\n" not in text
    with pytest.raises(ConfigError, match=r"no setting 'eps' \(did you mean epsilon\?\)"):
        PrivacyConfig(eps=2.0)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="keyword arguments only"):
        TrainConfig("fedals")  # type: ignore[misc]


def test_the_keyword_check_keeps_copies_and_replace_working():
    import copy
    import dataclasses
    import pickle

    cfg = TrainConfig(rounds=2, privacy=PrivacyConfig(epsilon=1.0))
    assert copy.deepcopy(cfg) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert dataclasses.replace(cfg, rounds=3).rounds == 3
    with pytest.raises(ConfigError, match="no setting 'epochs'"):
        dataclasses.replace(cfg, epochs=3)


def test_evaluate_refuses_a_split_of_other_sizes_than_the_model(small_split, other_split):
    from securefed.evaluation import evaluate
    from securefed.training import build_model

    model = build_model(TrainConfig(model="fedals"), small_split)
    assert 0.0 <= evaluate(model, small_split, which="test").hr <= 1.0
    with pytest.raises(ConfigError, match=r"built on 40 users x 60 items and the split has 50 x"):
        evaluate(model, other_split, which="test")


def test_evaluate_refuses_what_is_not_a_model_or_a_split(small_split):
    from securefed.evaluation import evaluate, evaluate_splits
    from securefed.training import build_model

    with pytest.raises(ConfigError, match=r"needs a model with score\(\).*got NoneType"):
        evaluate(None, small_split, which="test")  # type: ignore[arg-type]
    model = build_model(TrainConfig(model="fedals"), small_split)
    with pytest.raises(ConfigError, match=r"needs a securefed\.data\.types\.Split .*got str"):
        evaluate_splits(model, "split")  # type: ignore[arg-type]


# Messages that name what the run itself does ----------------------------------------------


def _tiny(**kw):
    return TrainConfig(synthetic_users=100, synthetic_items=200, **kw)


def _tiny_settings():
    """The resume tests' run: ``_tiny``'s data, a checkpoint every round."""
    return {"synthetic_users": 100, "synthetic_items": 200, "checkpoint_every": 1}


@pytest.mark.parametrize("model", ["fedals", "fedrap"])
def test_an_unreachable_epsilon_names_the_runs_own_rounds(model):
    """fedals's population rule calibrates a 4-round reference run first; its failure said
    "with 4 rounds" to a 1-round run (FedRAP said 1)."""
    from securefed.training import plan_run

    cfg = _tiny(model=model, rounds=1, privacy=PrivacyConfig(epsilon=1e-6))
    with pytest.raises(ConfigError, match="with 1 rounds"):
        plan_run(cfg)


def test_the_population_rules_reference_run_is_named_as_such(monkeypatch):
    """Where only the reference calibration fails, the message says what its rounds are."""
    from securefed.models import fedals
    from securefed.training import plan_run

    def unreachable(config, n_users):
        raise ConfigError("cannot reach epsilon=1.0 ... with 4 rounds ...")

    monkeypatch.setattr(fedals, "population_ratio", unreachable)
    cfg = _tiny(model="fedals", rounds=1, privacy=PrivacyConfig(epsilon=1.0))
    with pytest.raises(ConfigError, match="calibrates a reference run of 4 rounds") as info:
        plan_run(cfg)
    assert "population=small" in str(info.value)


# Run directories ---------------------------------------------------------------------------


def test_train_refuses_an_out_folder_holding_other_files(tmp_path):
    """The CLI refused such a folder; ``train(out=...)`` wrote its run beside the files."""
    out = tmp_path / "folder"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match="already holds other files.*folder of its own"):
        securefed.train(_tiny(model="mostpop"), out=out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_train_takes_an_empty_out_folder(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    result = securefed.train(_tiny(model="mostpop"), out=out)
    assert (out / "summary.json").exists() and result.run_dir == out


# A split given to train must be the config's data -------------------------------------


def test_train_refuses_a_split_of_another_dataset_than_the_config(shared_data, tmp_path):
    """An ML-100K split under the default config trained and was recorded as synthetic data
    (config.toml and summary.json), which a resume would then rebuild."""
    from securefed.training import load_split

    ml = load_split(TrainConfig(dataset="ml-100k", data_dir=str(shared_data)))
    with pytest.raises(ConfigError, match=r"holds ml-100k .* says dataset 'synthetic'"):
        securefed.train(TrainConfig(rounds=1), split=ml, out=tmp_path / "a")
    with pytest.raises(ConfigError, match="min_interactions 30 drops them"):
        securefed.train(
            TrainConfig(
                rounds=1, dataset="ml-100k", data_dir=str(shared_data), min_interactions=30
            ),
            split=ml,
            out=tmp_path / "b",
        )
    synthetic = load_split(_tiny())
    with pytest.raises(ConfigError, match="is synthetic data .* says dataset 'ml-100k'"):
        securefed.train(
            TrainConfig(rounds=1, dataset="ml-100k", data_dir=str(shared_data)),
            split=synthetic,
            out=tmp_path / "c",
        )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"synthetic_users": 80}, "100 synthetic users and 200 items .* synthetic_users=80"),
        ({"synthetic_items": 150}, "synthetic_items=150"),
        ({"seed": 1}, r"synthetic\(seed=0\) and the config's seed is 1"),
    ],
)
def test_train_refuses_a_synthetic_split_the_config_does_not_make(tmp_path, settings, message):
    """A 300 x 400 synthetic split under a 200 x 250 config was recorded as 200 x 250."""
    from securefed.training import load_split

    split = load_split(_tiny())
    cfg = TrainConfig(
        model="mostpop", **{"synthetic_users": 100, "synthetic_items": 200, **settings}
    )
    with pytest.raises(ConfigError, match=message):
        securefed.train(cfg, split=split, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_train_records_the_split_its_config_describes(tmp_path):
    from securefed.config import load_config_file
    from securefed.training import load_split

    cfg = _tiny(model="mostpop", seed=2)
    result = securefed.train(cfg, split=load_split(cfg), out=tmp_path / "run")
    assert result.summary["dataset"] == "synthetic"
    recorded = TrainConfig.from_dict(load_config_file(tmp_path / "run" / "config.toml"))
    assert (recorded.synthetic_users, recorded.synthetic_items, recorded.seed) == (100, 200, 2)


# Resume with a config: what is compared ------------------------------------------------


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A 3-round fedals run on 100 x 200 synthetic data, stopped after round 1 (its
    checkpoint kept), and the config it was started with."""
    cfg = TrainConfig(model="fedals", rounds=3, **_tiny_settings())

    def stop(record):
        if record.round == 1:
            raise _Stop

    run = tmp_path_factory.mktemp("resume") / "run"
    with pytest.raises(_Stop):
        securefed.train(cfg, out=run, progress=stop)
    return run, cfg


@pytest.mark.parametrize(
    ("settings", "phrases"),
    [
        (
            {"rounds": 8, "dataset": "ml-100k", "data_dir": "/nowhere/data"},
            ["rounds 8, the run's 3", "dataset 'ml-100k', the run's 'synthetic'", "data_dir"],
        ),
        ({"synthetic_users": 300}, ["synthetic_users 300, the run's 100"]),
        ({"min_interactions": 6}, ["min_interactions 6, the run's 5"]),
        ({"eval_every": 2}, ["eval_every 2, the run's 1"]),
        ({"client_fraction": 0.5}, ["client_fraction 0.5, the run's None"]),
    ],
)
def test_resume_refuses_a_config_whose_data_or_rounds_differ(stopped_run, settings, phrases):
    """Only the model, seed, DP and the privacy settings given were compared: rounds=8 and
    another dataset resumed the 3-round synthetic run silently."""
    run, cfg = stopped_run
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir())
    given = TrainConfig(**{**_tiny_settings(), "model": "fedals", "rounds": 3, **settings})
    with pytest.raises(ConfigError, match="the config given differs from it") as info:
        securefed.train(given, resume=run)
    for phrase in phrases:
        assert phrase in str(info.value)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir()) == before


def test_resume_takes_the_config_it_was_started_with(stopped_run):
    """The comparison leaves out what the run settles on its data (fedals's dimension: None
    given, recorded as chosen) and a model default it would replace."""
    from securefed.config import load_config_file

    run, cfg = stopped_run
    recorded = TrainConfig.from_dict(load_config_file(run / "config.toml"))
    assert cfg.params.dim is None and recorded.params.dim is not None
    assert securefed.train(cfg, resume=run).summary["rounds"] == 3
