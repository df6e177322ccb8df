"""FedRAP's paged private views (issue 17): ``D`` in a file the kernel pages, the same bits as
the dense views in memory, pages released after every block so the process holds little of
it, checkpoints streamed from the file and resumed to the same run."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from test_fedrap_sparse import (  # tests/ is on sys.path under pytest; the same runs' settings
    _assert_same_model,
    _cfg,
    _interrupted_after_round_2,
    _same,
)

from securefed import paging, runs
from securefed.config import TrainConfig
from securefed.costs import (
    InsufficientMemory,
    RunShape,
    check_memory,
    choose_views,
    estimate_run,
)
from securefed.errors import ConfigError
from securefed.models.fedrap import FedRAP, FedRAPConfig, resolve_views
from securefed.training import train


def _resident_bytes(tensor: torch.Tensor) -> int:
    """Resident bytes of the mapping holding ``tensor`` (its VMA in /proc/self/smaps)."""
    ptr = tensor.data_ptr()
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the tensor")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paged")
    return train(_cfg("dense"), out=tmp / "dense"), train(_cfg("paged"), out=tmp / "paged")


def test_paged_views_train_to_the_same_bits_as_dense(trained):
    dense, paged = trained
    assert (dense.model.views, paged.model.views) == ("dense", "paged")
    _assert_same_model(dense.model, paged.model)
    strip = [{k: v for k, v in m.items() if "seconds" not in k} for m in dense.metrics]
    assert strip == [{k: v for k, v in m.items() if "seconds" not in k} for m in paged.metrics]
    gen = torch.Generator().manual_seed(3)
    users = torch.randperm(40, generator=gen)[:17]
    items = torch.randint(0, 2000, (17, 30), generator=gen)
    assert _same(paged.model.score(users, items), dense.model.score(users, items))
    assert _same(paged.model.score_all(torch.arange(40)), dense.model.score_all(torch.arange(40)))
    assert paged.model.written_rows() == dense.model.written_rows() > 0


def test_paged_views_are_released_after_training_and_scoring(trained):
    """Every block of the file a round or an evaluation touched left the resident set (the
    views are 40 x 2000 x 32 floats, 10 MB; nothing of them stays mapped in)."""
    _, paged = trained
    model = paged.model
    assert model._D is not None
    assert _resident_bytes(model._D) == 0
    model.score_all(torch.arange(40))
    assert _resident_bytes(model._D) == 0
    model.score(torch.arange(40), torch.randint(0, 2000, (40, 100)))
    assert _resident_bytes(model._D) == 0
    model.written_rows()
    assert _resident_bytes(model._D) == 0
    model.dense_views(torch.arange(10))
    assert _resident_bytes(model._D) == 0
    model._D.sum()  # touching it does make it resident: the probe sees pages
    assert _resident_bytes(model._D) > 5_000_000
    model._release()
    assert _resident_bytes(model._D) == 0


def test_resume_from_a_paged_checkpoint_equals_the_uninterrupted_run(trained, tmp_path):
    _, paged = trained
    saved = _interrupted_after_round_2("paged", tmp_path / "cut")
    assert saved["D"].shape == (40, 2000, 32)  # the views as they are, streamed from the file
    del saved
    resumed = train(resume=tmp_path / "cut")
    assert resumed.model.views == "paged"
    _assert_same_model(resumed.model, paged.model)


def test_save_state_streams_a_paged_tensor_and_loads_it_back(tmp_path):
    paged = paging.PagedTensor((300, 1000, 16), directory=tmp_path)
    data = torch.randn(300, 1000, 16, generator=torch.Generator().manual_seed(0))
    paged.copy_(data)
    assert _resident_bytes(paged.tensor) == 0
    runs.save_state(tmp_path / "state.pt", {"D": paged.tensor, "round": 3})
    assert _resident_bytes(paged.tensor) == 0  # written block by block, released as it went
    back = runs.load_state(tmp_path / "state.pt")
    assert back is not None and back["round"] == 3 and torch.equal(back["D"], data)
    assert torch.serialization.get_crc32_options()  # restored for every other save
    assert list(tmp_path.iterdir()) == [tmp_path / "state.pt"]  # the paged file is unlinked


def test_pageout_never_changes_data():
    anonymous = torch.randn(1 << 20)
    copy = anonymous.clone()
    paging.pageout(anonymous)
    assert torch.equal(anonymous, copy)


def test_paged_views_refuse_a_directory_that_cannot_hold_them(small_split, tmp_path):
    with pytest.raises(ConfigError, match="views_dir"):
        FedRAP(
            small_split,
            FedRAPConfig(views="paged", views_dir=str(tmp_path / "missing")),
            generator=torch.Generator().manual_seed(0),
        )


def test_dpsgd_may_page_its_dense_views():
    assert resolve_views(FedRAPConfig(views="paged"), 2, 2, dpsgd=True) == "paged"
    assert resolve_views(FedRAPConfig(views="paged"), 2, 2, dpsgd=False) == "paged"


ML1M = RunShape(users=6040, items=3706, train_interactions=624_449, synthetic=True)


def _ml1m(views: str, **kw) -> TrainConfig:
    return TrainConfig(
        model="fedrap",
        dataset="synthetic",
        synthetic_users=ML1M.users,
        synthetic_items=ML1M.items,
        rounds=100,
        params=FedRAPConfig(views=views),
        **kw,
    )


def test_a_machine_too_small_for_dense_views_is_told_to_page_them(monkeypatch):
    """MovieLens-1M-sized FedRAP on 4 GB: the dense views (2.9 GB) do not fit beside a
    round, sparse ones would hold most rows after 100 rounds, paged ones fit."""
    monkeypatch.setattr("securefed.costs.free_disk", lambda directory="": 10**12)
    auto = _ml1m("auto")
    est = estimate_run(auto, ML1M, speed=1.0)
    assert est.memory["state"] > 2.8e9
    with pytest.raises(InsufficientMemory, match="--param views=paged would fit"):
        check_memory(auto, est, available=4 * 10**9)
    paged = estimate_run(_ml1m("paged"), ML1M, speed=1.0)
    assert paged.memory["state"] < 10**7  # D is in the file, not resident
    assert paged.peak_memory <= 4 * 10**9 < est.peak_memory
    assert paged.state["D"] == est.state["D"]  # the checkpoint still holds every row
    assert any("paged" in note for note in paged.notes)
    assert "D 2.9 GB in a file, not resident" in paged.detail_line()
    assert "in a file" not in est.detail_line()
    # Without the disk for the file, paging is not offered.
    monkeypatch.setattr("securefed.costs.free_disk", lambda directory="": 10**9)
    with pytest.raises(InsufficientMemory) as info:
        check_memory(auto, est, available=4 * 10**9)
    assert "views=paged" not in str(info.value)


def test_finite_checks_of_paged_state_see_nan_and_stay_released(tmp_path):
    paged = paging.PagedTensor((64, 2000, 16), directory=tmp_path)
    paged.copy_(torch.ones(64, 2000, 16))
    assert paging.aminmax(paged.tensor) == (1.0, 1.0)
    paged.tensor[50, 3, 2] = float("nan")
    paged.tensor[7, 0, 0] = -float("inf")
    low, high = paging.aminmax(paged.tensor)
    assert math.isnan(low) and math.isnan(high)
    paged.tensor[50, 3, 2] = 2.0
    assert paging.aminmax(paged.tensor) == (-math.inf, 2.0)
    assert _resident_bytes(paged.tensor) == 0


def test_auto_views_page_when_dense_ones_do_not_fit(monkeypatch):
    """``views="auto"`` on a machine too small for dense views: the storage that fits (of
    those that do, the lower estimate), never one whose file the disk cannot hold."""
    monkeypatch.setattr("securefed.costs.free_disk", lambda directory="": 10**12)
    auto = _ml1m("auto")
    est = estimate_run(auto, ML1M, speed=1.0)
    chosen = choose_views(auto, est, 4 * 10**9)
    assert chosen is not None
    cfg, paged = chosen
    assert cfg.params.views == "paged" and paged.peak_memory <= 4 * 10**9
    assert dataclasses.replace(cfg, params=auto.params) == auto  # nothing else changed
    assert choose_views(auto, est, est.peak_memory) is None  # dense fits: kept
    assert choose_views(_ml1m("dense"), est, 4 * 10**9) is None  # the user's choice stands
    monkeypatch.setattr("securefed.costs.free_disk", lambda directory="": 10**9)
    assert choose_views(auto, est, 4 * 10**9) is None  # sparse too large, no disk for paged


def test_the_cli_chooses_views_that_fit_and_records_it(monkeypatch, tmp_path):
    """Too little memory for dense views: the CLI trains with the storage ``choose_views``
    picks (here sparse: a small catalogue's file would not save its 128 MiB of blocks), says
    so and records it; with too little for any, it refuses with nothing written."""
    from typer.testing import CliRunner

    from securefed.cli import app
    from securefed.training import load_split

    cfg = TrainConfig(model="fedrap", synthetic_users=300, synthetic_items=3000, rounds=1, seed=0)
    shape = RunShape.of(load_split(cfg))
    peaks = {
        views: estimate_run(
            dataclasses.replace(cfg, params=FedRAPConfig(views=views)), shape, speed=1.0
        ).peak_memory
        for views in ("auto", "sparse", "paged")
    }
    expected = min(("sparse", "paged"), key=lambda v: peaks[v])
    assert peaks[expected] < peaks["auto"]
    monkeypatch.setattr("securefed.costs.free_disk", lambda directory="": 10**12)
    monkeypatch.setattr("securefed.costs._available_for", lambda device: peaks["auto"] - 1)
    args = ["train", "--model", "fedrap", "--synthetic-users", "300", "--synthetic-items"]
    args += ["3000", "--rounds", "1", "--out", str(tmp_path / "run")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f'views = "{expected}"' in (tmp_path / "run" / "config.toml").read_text()
    assert f"private views: {expected} (dense would need about" in text
    monkeypatch.setattr("securefed.costs._available_for", lambda device: 10**6)
    args[-1] = str(tmp_path / "none")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and not (tmp_path / "none").exists()


def test_paged_tensor_without_posix_fallocate(tmp_path, monkeypatch):
    """Where the OS has no posix_fallocate (macOS), the file is a sparse one of the same size
    and the tensor works the same."""
    monkeypatch.delattr(paging.os, "posix_fallocate")
    paged = paging.PagedTensor((10, 300, 4), directory=tmp_path)
    data = torch.randn(10, 300, 4)
    paged.copy_(data)
    assert torch.equal(paged.tensor, data)
