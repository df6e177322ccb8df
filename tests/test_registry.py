"""The model seam: the registry is the only place that knows model names."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from securefed.config import TrainConfig
from securefed.errors import ConfigError
from securefed.federation.base import CentralizedRecommender, Recommender
from securefed.models.registry import get_spec, model_names, params_from_flags

ROOT = Path(__file__).resolve().parents[1]
#: Code that must ask the registry instead of testing a model's name.
GENERIC = [
    "securefed/training.py",
    "securefed/privacy.py",
    "securefed/config.py",
    "securefed/report/sweep.py",
    "securefed/costs.py",
    "attacks/audit.py",
    "attacks/recorder.py",
    "attacks/threat.py",
    "attacks/rows.py",
    *[str(p.relative_to(ROOT)) for p in (ROOT / "securefed" / "flower").glob("*.py")],
]


@pytest.mark.parametrize("path", GENERIC)
def test_generic_code_never_branches_on_a_model_name(path):
    text = (ROOT / path).read_text()
    for name in model_names():
        hits = re.findall(rf"""==\s*["']{name}["']|["']{name}["']\s*==|in \(["']{name}""", text)
        assert not hits, f"{path} tests the model name {name!r}: ask its ModelSpec instead"
        assert f"models.{name} import" not in text, f"{path} imports the {name} module"


@pytest.mark.parametrize("name", model_names())
def test_every_registered_model_builds_and_scores(name, small_split):
    spec = get_spec(name)
    assert spec.name == name and spec.title
    model = spec.build(small_split, spec.params(), generator=torch.Generator().manual_seed(0))
    protocol = Recommender if spec.federated else CentralizedRecommender
    assert isinstance(model, protocol)
    users = torch.arange(3)
    assert model.score_all(users).shape == (3, small_split.n_items)
    if spec.federated:
        assert spec.layout_size is not None
        assert spec.layout_size(spec.params(), small_split) == model.layout.size
        assert set(spec.private_state) <= set(model.state_dict())


def test_config_roundtrip_names_the_models_table():
    cfg = TrainConfig(model="fedals", params=get_spec("fedals").params(dim=8))
    raw = cfg.to_dict()
    assert raw["fedals"]["dim"] == 8 and "fedrap" not in raw
    assert TrainConfig.from_dict(raw) == cfg
    # Tables of other models (old run directories have both) are ignored.
    assert TrainConfig.from_dict({**raw, "fedrap": {"dim": 3}}) == cfg
    with pytest.raises(ConfigError, match="unknown key 'dimm' in \\[fedals\\]"):
        TrainConfig.from_dict({"model": "fedals", "fedals": {"dimm": 3}})
    with pytest.raises(ConfigError, match="model must be one of"):
        TrainConfig(model="ncf")
    with pytest.raises(ConfigError, match="takes FedALSConfig"):
        TrainConfig(model="fedals", params=get_spec("fedrap").params())


def test_rounds_default_per_model():
    assert TrainConfig(model="mostpop").rounds == 1
    assert TrainConfig(model="fedals").rounds == 20
    assert TrainConfig(model="fedrap").rounds == 100
    assert TrainConfig(model="fedrap", rounds=3).rounds == 3


def test_cli_flags_map_to_the_models_fields():
    spec = get_spec("fedrecgel")
    p = params_from_flags(spec, {"dim": 16})
    assert p.gmf_dim == 16
    with pytest.raises(ConfigError, match="not a setting of fedals"):
        params_from_flags(get_spec("fedals"), {"lam": 0.1})
    assert dataclasses.replace(get_spec("fedals").params(), alpha=5.0) == params_from_flags(
        get_spec("fedals"), {"alpha": 5.0}
    )


def test_unsupported_defenses_are_refused_by_the_config():
    from securefed.config import PrivacyConfig

    with pytest.raises(ConfigError, match="no interaction-level DP-SGD"):
        TrainConfig(model="fedals", privacy=PrivacyConfig(epsilon=1.0, privacy_unit="interaction"))


def test_a_model_without_a_cost_formula_says_so_in_its_estimate(monkeypatch, small_split):
    """Found in a walkthrough: a fourth model's estimate read 'time 0.00 s' with nothing
    printed to say that no formula covers it (the note went to estimate.json only)."""
    import sys
    import types

    from securefed.costs import RunShape, estimate_run
    from securefed.models import registry

    module = types.ModuleType("_fourth_model_costs")
    module.SPEC = dataclasses.replace(get_spec("fedrap"), name="fourth", costs=None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_fourth_model_costs", module)
    monkeypatch.setitem(registry._MODULES, "fourth", "_fourth_model_costs")
    monkeypatch.setattr(registry, "_CACHE", dict(registry._CACHE))
    shape = RunShape.of(small_split)
    line = estimate_run(TrainConfig(model="fourth", rounds=2), shape).summary_line()
    assert "no cost formula for fourth (its ModelSpec has no costs)" in line
    known = estimate_run(TrainConfig(model="fedrap", rounds=2), shape).summary_line()
    assert "no cost formula" not in known and "machine probe" in known


def test_a_fourth_model_declares_its_cost_formulas_in_its_own_module(monkeypatch):
    """The cost formulas are the spec's (``ModelSpec.costs``), not a table keyed by name in
    securefed/costs.py: a fourth model whose module declares FedRAP's formulas is estimated,
    refused and given the storage that fits exactly as FedRAP is (they were keyed by name:
    it got a popularity count's estimate and no memory refusal worth the name)."""
    import sys
    import types

    from securefed import costs
    from securefed.costs import InsufficientMemory, RunShape, check_memory, estimate_run
    from securefed.models import registry

    module = types.ModuleType("_fourth_model_formulas")
    module.SPEC = dataclasses.replace(get_spec("fedrap"), name="fourth")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_fourth_model_formulas", module)
    monkeypatch.setitem(registry._MODULES, "fourth", "_fourth_model_formulas")
    monkeypatch.setattr(registry, "_CACHE", dict(registry._CACHE))
    monkeypatch.setattr(costs, "free_disk", lambda directory="": 10**12)
    gowalla = RunShape(users=29_858, items=40_981, train_interactions=860_000)

    def run(model: str, **fields: object) -> tuple[TrainConfig, costs.CostEstimate]:
        cfg = TrainConfig(model=model, rounds=20, client_fraction=0.1, **fields)  # type: ignore[arg-type]
        return cfg, estimate_run(cfg, gowalla, speed=1.0)

    (fourth_cfg, fourth), (_, fedrap) = run("fourth"), run("fedrap")
    assert fourth.state == fedrap.state and "D_rows" in fourth.state  # sparse views' bound
    assert fourth.peak_memory == fedrap.peak_memory > 10**9
    assert fourth.round_seconds == fedrap.round_seconds and fourth.model_bytes == fedrap.model_bytes
    assert "no cost formula" not in fourth.basis
    # Dense views too large for the machine: the storage that fits is chosen ("auto") or
    # suggested (given "dense") from the fourth model's own formulas, as for FedRAP.
    ml1m = RunShape(users=6_040, items=3_706, train_interactions=994_000)
    auto = dataclasses.replace(fourth_cfg, client_fraction=1.0)
    est = estimate_run(auto, ml1m, speed=1.0)
    chosen = costs.choose_views(auto, est, est.peak_memory - 1)
    as_fedrap = dataclasses.replace(auto, model="fedrap")
    assert chosen is not None and chosen[1].peak_memory < est.peak_memory
    expected = costs.choose_views(
        as_fedrap, estimate_run(as_fedrap, ml1m, speed=1.0), est.peak_memory - 1
    )
    assert expected is not None and chosen[0].params.views == expected[0].params.views
    dense = dataclasses.replace(auto, params=dataclasses.replace(auto.params, views="dense"))
    with pytest.raises(InsufficientMemory, match="--param views=(sparse|paged) would fit"):
        check_memory(dense, est, available=est.peak_memory - 1)
