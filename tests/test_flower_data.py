"""The Flower server holds no data: it learns the dataset's name and sizes from the nodes,
builds everything on a split of that shape with no interaction in it, and leaves the
yardsticks to whoever holds the data (securefed.training.add_yardsticks)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import numpy as np
import pytest
import torch

from securefed import runs
from securefed.baselines import baseline_metrics
from securefed.data.manifest import PUBLIC_SOURCE, DataManifest, manifest_of, public_split
from securefed.errors import ConfigError, ProtocolError
from securefed.flower import local as local_module
from securefed.flower import models
from securefed.flower import node as node_module
from securefed.flower.local import LocalTransport
from securefed.flower.server import FederatedServer, ServerSettings
from securefed.training import (
    NO_YARDSTICKS,
    PrivacyConfig,
    TrainConfig,
    add_yardsticks,
    build_aggregator,
    build_model,
    load_split,
)


def _cfg(**kw) -> TrainConfig:
    base = dict(
        model="fedrap",
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        checkpoint_every=1,
        privacy=PrivacyConfig(secagg=True, epsilon=8.0),
    )
    base.update(kw)
    return TrainConfig(**base)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_public_split_has_the_shape_and_nothing_else():
    split = load_split(_cfg())
    manifest = manifest_of(split)
    assert manifest == DataManifest(
        name=split.name, n_users=split.n_users, n_items=split.n_items, synthetic=True
    )
    assert DataManifest.from_fields(manifest.fields()) == manifest
    public = public_split(manifest)
    assert (public.n_users, public.n_items) == (split.n_users, split.n_items)
    assert public.n_train == 0 and public.history_items.size == 0
    assert (public.val_items == -1).all() and public.test_negatives.shape == (split.n_users, 0)
    assert public.report.source == PUBLIC_SOURCE and public.report.synthetic
    for bad in (
        {**manifest.fields(), "data-users": 0},
        {**manifest.fields(), "data-items": "400"},
        {**manifest.fields(), "data-synthetic": 1},
        {k: v for k, v in manifest.fields().items() if k != "data-name"},
    ):
        with pytest.raises(ValueError):
            DataManifest.from_fields(bad)


_USER = PrivacyConfig(secagg=True, epsilon=2.0)
_INTERACTION = PrivacyConfig(secagg=True, epsilon=8.0, privacy_unit="interaction", delta=1e-6)


@pytest.mark.parametrize(
    ("model", "privacy"),
    [
        *((m, _USER) for m in ("fedrap", "fedrecgel", "fedals", "mostpop")),
        ("fedrap", _INTERACTION),
        ("fedrecgel", _INTERACTION),
        ("fedals", PrivacyConfig(secagg=True)),
    ],
)
def test_the_server_side_of_every_model_needs_only_the_sizes(model, privacy):
    # What the server builds on the public split (shared parameters, its own step's state,
    # the resolved config, the noise) is what it would build on the data; what it does with
    # them in a round is pinned by the deployed-equals-in-process tests, whose servers all
    # build on the public split.
    cfg = _cfg(model=model, privacy=privacy)
    split = load_split(cfg)
    public = public_split(manifest_of(split))
    resolve = cfg.spec.resolve_for_data
    full_cfg = resolve(cfg, split)[0] if resolve else cfg
    public_cfg = resolve(cfg, public)[0] if resolve else cfg
    assert full_cfg.to_dict() == public_cfg.to_dict()
    on_data, on_public = build_model(full_cfg, split), build_model(public_cfg, public)
    arrays, scalars = models.global_payload(model, on_data)
    arrays_p, scalars_p = models.global_payload(model, on_public)
    assert set(arrays) == set(arrays_p) and scalars == scalars_p
    assert all(np.array_equal(arrays[k], arrays_p[k]) for k in arrays)
    assert _same(models.server_state(model, on_data), models.server_state(model, on_public))
    agg, agg_p = (
        build_aggregator(full_cfg, split, on_data),
        build_aggregator(public_cfg, public, on_public),
    )
    if privacy.interaction_dp:
        assert agg.dpsgd == agg_p.dpsgd and agg.dpsgd.noise_multiplier > 0
    elif privacy.dp:
        assert agg.noise_multiplier == agg_p.noise_multiplier > 0


def test_the_nodes_check_interaction_delta_the_server_cannot():
    # The server cannot count the interactions; the nodes, on the data, refuse a delta of
    # 1 / interactions or more, and the public split is not mistaken for data.
    cfg = _cfg(privacy=dataclasses.replace(_INTERACTION, delta=0.01))
    split = load_split(cfg)
    with pytest.raises(ConfigError, match="delta must be below 1/interactions"):
        build_model(cfg, split)
    assert build_model(cfg, public_split(manifest_of(split))).dpsgd is not None
    empty = dataclasses.replace(public_split(manifest_of(split)), report=split.report)
    with pytest.raises(ConfigError, match="n_interactions must be a positive integer"):
        build_model(cfg, empty)


def _csv(path, n_users: int, seed: int):
    rng = np.random.default_rng(seed)
    rows = sorted(
        {(u, int(i)) for u in range(n_users) for i in rng.choice(400, size=12, replace=False)}
    )
    path.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    return path


def _data_only_on_nodes(monkeypatch, tmp_path):
    """A dataset file that exists only while a node handles a message (anything else that
    reads it, the server included, finds no file); returns the run's config and the list of
    the nodes' loads."""
    hidden = _csv(tmp_path / "hidden.csv", 60, seed=0)
    path = tmp_path / "data.csv"
    real_handle = local_module.handle_node_message
    loads = _count_loads(monkeypatch)

    def on_node(*args, **kwargs):
        shutil.copy(hidden, path)
        try:
            return real_handle(*args, **kwargs)
        finally:
            path.unlink()

    monkeypatch.setattr(local_module, "handle_node_message", on_node)
    return _cfg(dataset=str(path)), loads, hidden


def _count_loads(monkeypatch) -> list[str]:
    """The datasets the nodes of this process load from now on (each node its partition's
    rows in a run without replay, node.node_split; every row with replay)."""
    loads: list[str] = []
    for name in ("load_split", "load_interactions"):
        real = getattr(node_module, name)

        def counted(config, *args, _real=real, **kwargs):
            loads.append(config.dataset)
            return _real(config, *args, **kwargs)

        monkeypatch.setattr(node_module, name, counted)
    return loads


def test_a_flower_run_never_reads_the_data_on_the_server(tmp_path, monkeypatch):
    cfg, loads, hidden = _data_only_on_nodes(monkeypatch, tmp_path)
    res = FederatedServer(
        cfg, run_dir=tmp_path / "fl", transport=LocalTransport(3, state_dir=tmp_path / "n")
    ).run()
    assert [m["round"] for m in res.metrics] == [1, 2] and res.summary["test_hr@10"] > 0
    assert loads == [cfg.dataset] * 3  # each node of this process: one load a run
    summary = res.summary
    assert summary["yardsticks"] == NO_YARDSTICKS and summary["train_interactions"] is None
    assert not [k for k in summary if k.startswith("baseline_")]
    split = load_split(_cfg(dataset=str(hidden)))
    data = json.loads((tmp_path / "fl" / runs.DATA_FILE).read_text())
    assert data == {**manifest_of(split).record(), "name": "data"}  # name and sizes only

    # The operator, who holds the data, adds the yardsticks: the in-process run's.
    added = add_yardsticks(tmp_path / "fl", split)
    assert "yardsticks" not in added and added["train_interactions"] == split.n_train
    expected = baseline_metrics(split, seed=cfg.seed, epsilon=8.0, delta=cfg.privacy.delta)
    for key in ("baseline_mostpop_test_hr@10", "baseline_dp_mostpop_test_full_hr@10"):
        assert added[key] == expected[key]
    assert json.loads((tmp_path / "fl" / runs.SUMMARY_FILE).read_text()) == added
    data = json.loads((tmp_path / "fl" / runs.DATA_FILE).read_text())
    assert data["train_interactions"] == split.n_train and data["source"] != PUBLIC_SOURCE
    other = load_split(_cfg(synthetic_users=61))
    with pytest.raises(ConfigError, match="not the run's dataset"):
        add_yardsticks(tmp_path / "fl", other)
    assert added["evaluated_users"] == split.n_users  # every node stayed to the end
    assert not any(line.startswith("NOT COMPARED") for line in added["verdict"])

    # A node that dropped out of the selected round's evaluation: the model's test metrics
    # are over fewer users than the yardsticks, and no BELOW line may compare them (found in
    # a deployment walkthrough: 134 of 200 users against all 200, "BELOW DP-MostPop").
    path = tmp_path / "fl" / runs.SUMMARY_FILE
    path.write_text(json.dumps({**added, "evaluated_users": split.n_users - 20, "test_hr@10": 0}))
    partial = add_yardsticks(tmp_path / "fl", split)
    assert "lift_over_mostpop_test_full_hr@10" in added
    assert not [k for k in partial if k.startswith("lift_over_mostpop_")]
    assert partial["verdict"] == [
        f"NOT COMPARED with the yardsticks: the selected round's test metrics cover "
        f"{split.n_users - 20} of {split.n_users} users (the others' nodes dropped out of its "
        f"evaluation round) and the yardsticks all {split.n_users}"
    ]


def _tamper_hello(transport, change):
    exchange = transport.exchange

    def tamper(stage, messages, *, timeout):
        replies = exchange(stage, messages, timeout=timeout)
        if stage == "hello":
            for node, reply in replies.items():
                change(node, reply.config)
        return replies

    transport.exchange = tamper  # type: ignore[method-assign]


def test_nodes_on_different_datasets_are_refused(tmp_path):
    transport = LocalTransport(3, state_dir=tmp_path / "n")
    first = min(transport.node_ids())

    def other_size(node, config):
        if node == first:
            config["data-users"] += 1

    _tamper_hello(transport, other_size)
    server = FederatedServer(_cfg(), run_dir=tmp_path / "fl", transport=transport)
    with pytest.raises(ConfigError, match="hold different datasets"):
        server.run()
    assert not (tmp_path / "fl").exists()  # refused before anything was written


def test_a_node_that_does_not_say_its_dataset_is_refused(tmp_path):
    transport = LocalTransport(2, state_dir=tmp_path / "n")
    _tamper_hello(transport, lambda node, config: config.pop("data-items"))
    server = FederatedServer(_cfg(), run_dir=tmp_path / "fl", transport=transport)
    with pytest.raises(ProtocolError, match="which dataset"):
        server.run()


def test_a_resume_on_another_dataset_is_refused(tmp_path):
    cfg = _cfg(rounds=3)
    run_dir = tmp_path / "fl"
    transport = LocalTransport(3, state_dir=tmp_path / "n")
    server = FederatedServer(cfg, run_dir=run_dir, transport=transport)
    server.run()
    # The run as if it had stopped, its data.json saying it ran on one user more.
    (run_dir / runs.SUMMARY_FILE).unlink()
    data = json.loads((run_dir / runs.DATA_FILE).read_text())
    runs.write_json(run_dir / runs.DATA_FILE, {**data, "users": data["users"] + 1})
    resumed = FederatedServer.resume(run_dir, transport=LocalTransport(3, state_dir=tmp_path / "n"))
    with pytest.raises(ConfigError, match="this run started on"):
        resumed.run()


def test_a_pinned_node_reads_only_the_operators_dataset(tmp_path, monkeypatch):
    # The hello makes a node load the dataset the run's config names and report its sizes: a
    # node holding the operator's copy of the config refuses another one before loading it
    # (found in review: a named dataset is looked up in the config's data_dir first).
    loads = _count_loads(monkeypatch)
    honest = _cfg()
    pinned = tmp_path / "run.toml"
    pinned.write_text(runs.dumps_toml(honest.to_dict()))
    transport = LocalTransport(2, state_dir=tmp_path / "n")
    for node_config in transport.node_configs.values():
        node_config["pin-config"] = str(pinned)
    for name, value in (
        ("synthetic_users", 61),
        ("dataset", "ml-100k"),
        ("data_dir", str(tmp_path / "elsewhere")),
    ):
        server = FederatedServer(
            _cfg(**{name: value}), run_dir=tmp_path / f"run-{name}", transport=transport
        )
        with pytest.raises(ProtocolError, match=f"pinned config .* {name} = "):
            server.run()
        assert not (tmp_path / f"run-{name}").exists() and not loads
    res = FederatedServer(honest, run_dir=tmp_path / "ok", transport=transport).run()
    assert len(res.metrics) == 2  # the operator's own run goes through


def test_cli_yardsticks_where_the_data_is(tmp_path):
    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app

    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    runner = CliRunner()
    there = _csv(tmp_path / "there.csv", 60, seed=0)
    cfg = _cfg(dataset=str(there))
    run_dir = tmp_path / "fl"
    FederatedServer(
        cfg, run_dir=run_dir, transport=LocalTransport(3, state_dir=tmp_path / "n")
    ).run()
    here = tmp_path / "here.csv"
    there.rename(here)  # the data lies elsewhere on the machine that adds the yardsticks
    res = runner.invoke(root, ["flower", "yardsticks", str(run_dir)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    other = _csv(tmp_path / "other.csv", 59, seed=1)
    res = runner.invoke(root, ["flower", "yardsticks", str(run_dir), "--dataset", str(other)])
    assert res.exit_code == 2 and "not the run's dataset" in res.output, res.output
    assert "yardsticks" in json.loads((run_dir / runs.SUMMARY_FILE).read_text())  # untouched
    res = runner.invoke(root, ["flower", "yardsticks", str(run_dir), "--dataset", str(here)])
    assert res.exit_code == 0, res.output
    summary = json.loads((run_dir / runs.SUMMARY_FILE).read_text())
    expected = baseline_metrics(
        load_split(_cfg(dataset=str(here))), seed=cfg.seed, epsilon=8.0, delta=cfg.privacy.delta
    )
    assert summary["baseline_dp_mostpop_test_hr@10"] == expected["baseline_dp_mostpop_test_hr@10"]
    assert "MostPop" in res.output and "yardsticks" not in summary
    res = runner.invoke(root, ["flower", "yardsticks", str(tmp_path / "n")])
    assert res.exit_code == 2 and "no finished run" in res.output, res.output


class _GridLike(LocalTransport):
    """A node's error is a silent dropout recorded in ``errors``, as over Flower's Grid."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: list[tuple[str, int, str]] = []

    def exchange(self, stage, messages, *, timeout):
        replies = {}
        for node, payload in messages.items():
            try:
                replies.update(super().exchange(stage, {node: payload}, timeout=timeout))
            except Exception as exc:
                self.errors.append((stage, node, f"{type(exc).__name__}: {exc}"[:200]))
        return replies


def test_a_node_that_fails_the_hello_is_named_not_waited_for(tmp_path):
    # Found in review: over Flower a node's error is a dropout, and the server waited out
    # connect_timeout for a partition that would never answer, then blamed its absence.
    pinned = tmp_path / "run.toml"
    pinned.write_text(runs.dumps_toml(_cfg().to_dict()))
    transport = _GridLike(3, state_dir=tmp_path / "n")
    transport.node_configs[101]["pin-config"] = str(pinned)
    server = FederatedServer(
        _cfg(rounds=3),
        run_dir=tmp_path / "fl",
        transport=transport,
        settings=ServerSettings(connect_timeout=3.0),
    )
    with pytest.raises(ConfigError, match="node 101 failed the hello: ProtocolError: .*rounds"):
        server.run()


def test_an_interaction_level_dp_run_goes_through(tmp_path):
    # Found in review: the server's public split has no interactions to check delta against,
    # and every interaction-level run failed at its start; the nodes check it on the data.
    cfg = _cfg(model="fedrecgel", rounds=1, privacy=_INTERACTION)
    res = FederatedServer(
        cfg, run_dir=tmp_path / "fl", transport=LocalTransport(2, state_dir=tmp_path / "n")
    ).run()
    first = res.metrics[0]
    assert first["contributors"] == first["participants"] > 0
    assert 0 < res.summary["epsilon"] <= 8.0 and res.summary["privacy_unit"] == "interaction"


def test_the_metrics_follower_shows_each_new_round_once(tmp_path):
    # `flower local` and `simulate` print a line per round while the ServerApp (another
    # process) writes them; a resumed run's kept rounds are not shown again.
    from securefed.flower.deploy import MetricsFollower

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs.append_metrics(run_dir, {"round": 1, "loss": 0.5})  # kept by a resume
    shown = []
    follower = MetricsFollower(
        run_dir, lambda rec: shown.append((rec.round, rec.rounds_planned)), rounds=3, poll=60
    )
    with follower:
        follower.check()
        assert shown == []
        runs.append_metrics(run_dir, {"round": 2, "loss": 0.4})
        with (run_dir / runs.METRICS_FILE).open("a") as fh:
            fh.write('{"round": 3, "lo')  # still being written
        follower.check()
        assert shown == [(2, 3)]
        (run_dir / runs.CONFIG_FILE).write_text("rounds = 4\n")  # the server's resolved config
        with (run_dir / runs.METRICS_FILE).open("a") as fh:
            fh.write('ss": 0.3}\n')
    assert shown == [(2, 3), (3, 4)]  # the last poll when the follower stops


def test_the_metrics_follower_shows_an_aborted_round_and_goes_on(tmp_path):
    # Found in review: an aborted round's loss is NaN, written null; the display's abs()
    # raised on None, the follower's thread died and later rounds came only at the end.
    from securefed.cli.progress import RoundDisplay
    from securefed.flower.deploy import MetricsFollower

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    display, shown = RoundDisplay(plain=True), []

    def show(rec):
        display.round(rec)  # an aborted round's line says so (its loss is NaN)
        shown.append(rec.round)
        if rec.round == 2:
            raise RuntimeError("a display that fails once")

    with MetricsFollower(run_dir, show, rounds=3, poll=0.01) as follower:
        runs.append_metrics(run_dir, {"round": 1, "loss": float("nan"), "aborted": "too few"})
        runs.append_metrics(run_dir, {"round": 2, "loss": 0.5})
        deadline = time.monotonic() + 10
        while len(shown) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        runs.append_metrics(run_dir, {"round": 3, "loss": 0.4})
        while len(shown) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shown == [1, 2, 3] and follower._thread.is_alive()  # shown while it runs


def _fedals(**params):
    return TrainConfig.from_dict(
        {
            "model": "fedals",
            "synthetic_users": 80,
            "synthetic_items": 400,
            "privacy": {"secagg": True, "epsilon": 8.0},
            "fedals": params,
        }
    )


def test_the_pin_settles_only_the_operators_copy(tmp_path):
    from securefed.flower.messages import check_pinned

    split = load_split(_fedals())
    loads = []

    def data():
        loads.append(1)
        return split

    def pin(cfg):
        path = tmp_path / "run.toml"
        path.write_text(runs.dumps_toml(cfg.to_dict()))
        return path

    settled = _fedals(population="large")
    settled = settled.spec.resolve_for_data(settled, split)[0]
    assert settled.rounds == 4
    check_pinned(settled, pin(_fedals(population="large")), data)  # the copy settles to 4
    check_pinned(settled, pin(_fedals(large_above=1.0)), data)  # the rule makes it large too
    assert len(loads) == 2
    with pytest.raises(ProtocolError, match="rounds = 4 \\(pinned 3\\)"):
        check_pinned(settled, pin(_fedals()), data)  # the copy settles small: 3 rounds
    # A server never has its own config settled: 3 rounds with the large population's setting
    # against a copy pinned at 4 (settling both let it through, found in review).
    fewer = dataclasses.replace(_fedals(population="large"), rounds=3)
    with pytest.raises(ProtocolError, match="rounds = 3 \\(pinned 4\\)"):
        check_pinned(fewer, pin(dataclasses.replace(_fedals(), rounds=4)), data)
    loads.clear()
    elsewhere = dataclasses.replace(settled, data_dir=str(tmp_path))
    with pytest.raises(ProtocolError, match="data_dir = "):
        check_pinned(elsewhere, pin(_fedals(population="large")), data)
    assert not loads  # another data setting: refused before the node reads any data


@pytest.mark.slow
def test_a_pinned_node_settles_the_population_rule_on_its_own_data(tmp_path):
    # Found in review: the private fedals' population rule raises a large population's rounds
    # from 3 to 4 when the run starts, and every pinned node refused the server's settled
    # config (`securefed flower local` pins every node). The node now settles its own copy on
    # its data and compares again; the server still gets no more than that copy allows.
    operator = _fedals(population="large")
    pinned = tmp_path / "run.toml"
    pinned.write_text(runs.dumps_toml(operator.to_dict()))
    transport = LocalTransport(2, state_dir=tmp_path / "n")
    for node_config in transport.node_configs.values():
        node_config["pin-config"] = str(pinned)
    res = FederatedServer(operator, run_dir=tmp_path / "ok", transport=transport).run()
    assert operator.rounds == 3 and len(res.metrics) == 4  # settled to the large mode's 4
    more = dataclasses.replace(operator, rounds=5)
    with pytest.raises(ProtocolError, match="rounds = 5 \\(pinned 4\\)"):
        FederatedServer(more, run_dir=tmp_path / "more", transport=transport).run()
    small = tmp_path / "small.toml"  # the operator's copy settles small on these 80 users
    small.write_text(runs.dumps_toml(_fedals().to_dict()))
    for node_config in transport.node_configs.values():
        node_config["pin-config"] = str(small)
    with pytest.raises(ProtocolError, match="rounds = 4 \\(pinned 3\\)"):
        FederatedServer(operator, run_dir=tmp_path / "large", transport=transport).run()


def test_a_node_given_data_sha256_refuses_another_file(tmp_path):
    """Found in a deployment walkthrough: two nodes holding different CSVs of the same name and
    sizes (a relative path) trained one run unnoticed: the server compares names and sizes
    only. A node given the operator's `sha256sum` (`data-sha256`, never sent to the server)
    refuses another file in its hello, named at once."""
    import hashlib

    from securefed.flower.messages import check_data_sha256

    rows = "user,item\n" + "".join(
        f"{u},{(u * 7 + k * 13) % 200}\n" for u in range(30) for k in range(6)
    )
    mine, other = tmp_path / "mine.csv", tmp_path / "other.csv"
    mine.write_text(rows)
    other.write_text(rows.replace("0,0\n", "0,199\n", 1))
    digest = hashlib.sha256(mine.read_bytes()).hexdigest()
    check_data_sha256(str(mine), digest)
    check_data_sha256(str(mine), digest.upper() + "\n")
    with pytest.raises(ProtocolError, match="holds another file than the operator's") as info:
        check_data_sha256(str(other), digest)
    # The reason reaches the server: no digest in it, not even a prefix (found in review).
    other_digest = hashlib.sha256(other.read_bytes()).hexdigest()
    assert other_digest[:8] not in str(info.value) and digest[:8] not in str(info.value)
    with pytest.raises(ProtocolError, match="built in"):
        check_data_sha256("synthetic", digest)
    cfg = _cfg(dataset=str(other), rounds=1, min_interactions=3)
    transport = _GridLike(3, state_dir=tmp_path / "n")
    transport.node_configs[101]["data-sha256"] = digest
    server = FederatedServer(
        cfg,
        run_dir=tmp_path / "fl",
        transport=transport,
        settings=ServerSettings(connect_timeout=3.0),
    )
    with pytest.raises(ConfigError, match="node 101 failed the hello: ProtocolError: this node's"):
        server.run()


# ----------------------------------------------------------------------------- a node's rows


def _partition_of(split, users) -> list:
    """Every row of ``split`` for ``users`` (what a partition split must hold as is)."""
    hist = split.history_indptr
    return [
        [split.user_train_items(u).tolist() for u in users.tolist()],
        [split.history_items[hist[u] : hist[u + 1]].tolist() for u in users.tolist()],
        split.val_items[users].tolist(),
        split.test_items[users].tolist(),
    ]


@pytest.mark.parametrize("timestamps", [True, False])
def test_a_partition_split_holds_its_users_rows_exactly(tmp_path, timestamps):
    """A DP node keeps the rows of its own users only (node.node_split): each of them gets
    the rows, held-out items and evaluation negatives of the split of every user, bit for
    bit, with and without timestamps (the tie order and the negatives are drawn from streams
    over every user)."""
    from securefed.data.split import leave_one_out
    from securefed.data.types import Interactions
    from securefed.errors import DataError
    from securefed.flower.node import partition_users
    from securefed.training import load_interactions

    cfg = _cfg() if timestamps else _cfg(dataset=str(_csv(tmp_path / "d.csv", 60, seed=1)))
    data = load_interactions(cfg)
    assert (data.timestamps is not None) == timestamps
    full = leave_one_out(data, seed=cfg.seed)
    for p in range(3):
        own = partition_users(data.n_users, p, 3).numpy()
        part = leave_one_out(data, seed=cfg.seed, users=own)
        assert np.array_equal(part.held_users, own) and full.held_users is None
        assert (part.name, part.n_users, part.n_items) == (full.name, full.n_users, full.n_items)
        assert _partition_of(part, own) == _partition_of(full, own)
        for which in ("val_negatives", "test_negatives"):
            assert np.array_equal(getattr(part, which), getattr(full, which)[own])
            assert np.array_equal(
                getattr(part, which)[part.eval_rows(own)], getattr(full, which)[own]
            )
        others = np.setdiff1d(np.arange(data.n_users), own)
        assert not part.train_counts[others].any() and (part.val_items[others] == -1).all()
        assert not np.diff(part.history_indptr)[others].any()
        assert (part.test_items[others] == -1).all()
        assert part.n_train == int(full.train_counts[own].sum())
        with pytest.raises(ConfigError, match="holds the rows of 20 of its 60 users"):
            part.eval_rows(others[:1])
    assert full.n_train == len(data.users) - 2 * data.n_users  # what the node checks delta on
    # The whole data is still checked: a user outside the partition with too few rows.
    short = Interactions(
        name="short",
        users=np.array([0, 0, 0, 1, 1]),
        items=np.array([0, 1, 2, 0, 1]),
        timestamps=None,
        n_users=2,
        n_items=200,
        user_ids=np.arange(2),
        item_ids=np.arange(200),
        report=data.report,
    )
    with pytest.raises(DataError, match="fewer than 3 interactions"):
        leave_one_out(short, seed=0, users=np.array([0]))
    with pytest.raises(ConfigError, match="sorted, distinct user indices"):
        leave_one_out(data, seed=0, users=np.array([3, 1]))


@pytest.mark.parametrize(
    ("model", "privacy"),
    [
        ("fedals", PrivacyConfig(secagg=True, epsilon=8.0)),
        ("fedrap", PrivacyConfig(secagg=True, epsilon=8.0)),
        ("fedrecgel", PrivacyConfig(secagg=True, epsilon=8.0)),
        # Local DP-SGD draws its noise from the OS in a run; seeded here to compare.
        ("fedrap", dataclasses.replace(_INTERACTION, replay=True)),
        ("fedrecgel", dataclasses.replace(_INTERACTION, replay=True)),
    ],
)
def test_a_node_on_its_partition_trains_and_evaluates_as_on_every_row(model, privacy):
    """Results unchanged: a model built on a node's partition split starts as the one built
    on every row, a round of local training of the node's users gives the same updates and
    loss from the same generator, and their evaluation the same ranks (full-ranking ranks
    up to 10, all that an evaluation round encodes: pipeline.evaluation_counters)."""
    from protocols.seeding import torch_generator
    from securefed.data.split import leave_one_out
    from securefed.evaluation import evaluate_splits
    from securefed.flower.node import partition_users
    from securefed.training import load_interactions

    cfg = _cfg(model=model, privacy=privacy)
    data = load_interactions(cfg)
    own = partition_users(data.n_users, 1, 3)
    full = build_model(cfg, leave_one_out(data, seed=cfg.seed))
    part = build_model(cfg, leave_one_out(data, seed=cfg.seed, users=own.numpy()))
    assert _same(full.state_dict(), part.state_dict())
    for r in range(2):
        a, stats_a = full.client_round(own, r, torch_generator(7, "train", r))
        b, stats_b = part.client_round(own, r, torch_generator(7, "train", r))
        assert torch.equal(a.clients, b.clients) and torch.equal(a.dense(), b.dense())
        assert stats_a.loss == stats_b.loss
    ranks = [evaluate_splits(m, m.split, users=own.numpy(), per_user=True) for m in (full, part)]
    for which in ("val", "test"):
        assert np.array_equal(ranks[0][which].ranks, ranks[1][which].ranks)
        capped = [np.minimum(r[which].full_ranks, 10) for r in ranks]
        assert np.array_equal(*capped)


def test_a_dp_node_holds_its_partition_and_a_replaying_node_every_row(tmp_path):
    """What a node builds its runtime on: its partition in a DP run drawing from the OS (the
    default), every row in a replay run (it plans the whole cohort's round); the hello's
    manifest is the same either way. Interaction-level DP's delta is still checked against
    every user's interactions, at the hello (the partition's count alone would let a delta
    between 1/4501 and 1/1691 through)."""
    from securefed.flower.messages import (
        PROTOCOL,
        NodeMemory,
        Payload,
        _runtime,
        handle_node_message,
    )
    from securefed.flower.node import partition_users

    def runtime(cfg, token):
        memory = NodeMemory()
        node_config = {"partition-id": 1, "num-partitions": 3, "state-dir": str(tmp_path / token)}
        message = {
            "protocol": PROTOCOL,
            "run-token": token,
            "config": runs.dumps_toml(cfg.to_dict()),
        }
        hello = handle_node_message(
            "hello", Payload(config=dict(message)), node_config=node_config, state={}, memory=memory
        )
        return hello, _runtime(Payload(config=dict(message)), node_config, memory, token, 1, 3)

    everyone = load_split(_cfg())
    own = partition_users(everyone.n_users, 1, 3).numpy()
    hello, dp = runtime(_cfg(), "dp")
    assert np.array_equal(dp.split.held_users, own) and dp.split.n_train < everyone.n_train
    assert DataManifest.from_fields(hello.config) == manifest_of(everyone)
    hello, replay = runtime(_cfg(privacy=PrivacyConfig(secagg=True, epsilon=8.0, replay=True)), "r")
    assert replay.split.held_users is None and replay.split.n_train == everyone.n_train
    assert DataManifest.from_fields(hello.config) == manifest_of(everyone)
    assert everyone.n_train == 4501 and dp.split.n_train == 1691
    loose = _cfg(model="fedrecgel", privacy=dataclasses.replace(_INTERACTION, delta=1 / 3000))
    with pytest.raises(ConfigError, match="delta must be below 1/interactions"):
        runtime(loose, "loose")
