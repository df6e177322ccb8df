"""Malicious-mode secure aggregation across nodes (issue 16 item 3), without Flower's processes.

Every user signs its key advertisement and the survivor set with a long-term Ed25519 key from
an enrollment step (:mod:`securefed.flower.enrollment`); nodes check every peer's signature
against the enrollment directory, never against keys the server hands them. A server that
swaps a relayed key, or shows different survivor sets to different users, is detected: the
affected users abort without releasing a share and the round releases nothing. The honest
path computes what the in-process run computes.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols.secagg import wire
from protocols.secagg.client import Stage
from securefed import runs
from securefed.errors import ConfigError
from securefed.flower import enrollment
from securefed.flower.local import LocalTransport
from securefed.flower.messages import Payload, pack_sids, unpack_sids
from securefed.flower.pipeline import EVAL_ROUND_OFFSET
from securefed.flower.server import FederatedServer, ServerSettings
from securefed.training import PrivacyConfig, TrainConfig, train

KEYS = ("val_hr@10", "test_hr@10", "test_full_hr@10", "contributors", "epsilon")


def _metric_tol(key: str) -> float:
    """How far a deployed round's metric may be from the in-process one: hits are summed
    exactly by the secure evaluation round, a user's NDCG to 2^-16."""
    return 2.0**-16 if "ndcg" in key else 1e-12


def _cfg(**privacy) -> TrainConfig:
    base = dict(secagg=True, epsilon=8.0, replay=True, secagg_mode="malicious")
    base.update(privacy)
    return TrainConfig(
        model="fedrap",
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        checkpoint_every=1,
        privacy=PrivacyConfig(**base),
    )


def _enrolled(tmp_path, n_users=60, nodes=3, **kw) -> tuple[LocalTransport, ServerSettings]:
    state = tmp_path / "nodes"
    directory = enrollment.enroll_partitions(
        n_users, [state / f"node-{p}" for p in range(nodes)], tmp_path / "enrollment.json"
    )
    transport = LocalTransport(
        nodes, state_dir=state, node_extra={"enrollment": str(directory)}, **kw
    )
    return transport, ServerSettings(enrollment=str(directory))


@pytest.mark.parametrize("long_lived", [False, True])
def test_honest_malicious_mode_run_equals_the_in_process_run(tmp_path, long_lived):
    cfg = _cfg()
    ref = train(cfg, out=tmp_path / "ref")  # the objects engine, fresh enrollments per round
    transport, settings = _enrolled(tmp_path, long_lived=long_lived)
    res = FederatedServer(cfg, run_dir=tmp_path / "run", transport=transport, settings=settings)
    out = res.run()
    for a, b in zip(ref.metrics, out.metrics, strict=True):
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key
    stages = [stage for stage, _, _ in transport.seen]
    # Every node, every training round and every secure evaluation round.
    assert stages.count("consistency") == 3 * (cfg.rounds + stages.count("evaluate") // 3)
    # Every user signed the survivor set before any unmask share left its node.
    first_unmask = stages.index("unmask")
    assert "consistency" in stages[:first_unmask]


def test_private_keys_stay_on_their_node_and_the_directory_holds_public_keys(tmp_path):
    _enrolled(tmp_path)
    public = enrollment.load_directory(tmp_path / "enrollment.json")
    assert sorted(public) == list(range(60))
    for p in range(3):
        keys = enrollment.load_private_keys(tmp_path / "nodes" / f"node-{p}")
        assert sorted(keys) == list(range(p, 60, 3))  # its partition's users only
        path = tmp_path / "nodes" / f"node-{p}" / enrollment.KEYS_FILE
        assert path.stat().st_mode & 0o777 == 0o600
        for u, k in keys.items():
            assert k.public_key().public_bytes_raw() == public[u]
    assert "private" not in (tmp_path / "enrollment.json").read_text()
    # Enrolling again keeps every key (they are long-term).
    again = enrollment.enroll_users(range(0, 60, 3), tmp_path / "nodes" / "node-0")
    assert all(again[u] == public[u] for u in again)


def test_malicious_mode_needs_the_enrollment_on_both_sides(tmp_path):
    cfg = _cfg()
    plain = LocalTransport(3, state_dir=tmp_path / "plain")
    with pytest.raises(ConfigError, match="needs the enrollment directory"):
        FederatedServer(cfg, run_dir=tmp_path / "a", transport=plain).run()
    _, settings = _enrolled(tmp_path)
    with pytest.raises(ConfigError, match="enrollment="):
        FederatedServer(cfg, run_dir=tmp_path / "b", transport=plain, settings=settings).run()
    with pytest.raises(ConfigError, match="turn secure aggregation on"):
        PrivacyConfig(secagg_mode="malicious")


class KeySwappingTransport:
    """A server in the middle of key agreement: in round 0 it replaces ``victim``'s X25519
    keys, in the KEYS message to each of the victim's neighbours, by its own (keeping the
    victim's signature: it cannot make one)."""

    def __init__(self, inner: LocalTransport, victim: int) -> None:
        self.inner, self.victim = inner, victim
        self.swapped: list[int] = []
        self.replies: dict[str, dict[int, Payload]] = {}

    def node_ids(self):
        return self.inner.node_ids()

    def exchange(self, stage, messages, *, timeout):
        first = all(p.config.get("round") == 0 for p in messages.values())  # not evaluation
        if stage == "share" and first:
            messages = {n: self._swap(p) for n, p in messages.items()}
        replies = self.inner.exchange(stage, messages, timeout=timeout)
        if first:
            self.replies.setdefault(stage, {}).update(replies)
        return replies

    def _swap(self, payload: Payload) -> Payload:
        env = self.env
        mitm_c = X25519PrivateKey.generate().public_key().public_bytes_raw()
        mitm_s = X25519PrivateKey.generate().public_key().public_bytes_raw()
        out = {}
        for sid, msg in unpack_sids(payload.config).items():
            entries = wire.decode_signed_keys(env, msg, receiver=sid, n_clients=1 << 20)
            if any(c == self.victim for c, *_ in entries):
                self.swapped.append(sid)
                entries = [
                    (c, mitm_c, mitm_s, sig) if c == self.victim else (c, cp, sp, sig)
                    for c, cp, sp, sig in entries
                ]
            out[sid] = wire.encode_signed_keys(env, sid, entries)
        config = {k: v for k, v in payload.config.items() if not k.startswith("sid.")}
        return Payload(config={**config, **pack_sids(out)})


def test_a_server_that_swaps_a_public_key_is_detected_and_nobody_reveals_a_share(
    tmp_path, monkeypatch
):
    from securefed.flower import server as server_module

    cfg = _cfg(epsilon=None, noise_multiplier=1.0)
    transport, settings = _enrolled(tmp_path)
    mitm = KeySwappingTransport(transport, victim=0)
    envs = []
    original = server_module.SecAggServer

    def capture(*args, **kwargs):  # the round's envelope, to re-encode what is relayed
        s = original(*args, **kwargs)
        envs.append(s._env)
        mitm.env = s._env
        return s

    monkeypatch.setattr(server_module, "SecAggServer", capture)
    res = FederatedServer(
        dataclasses.replace(cfg, rounds=1),
        run_dir=tmp_path / "run",
        transport=mitm,
        settings=settings,
    ).run()
    assert mitm.swapped, "the victim had no neighbour"
    # The victim's neighbours refused at once: no share box for anyone came from them ...
    shares = {}
    for payload in mitm.replies.get("share", {}).values():
        shares.update(unpack_sids(payload.config))
    assert not set(mitm.swapped) & set(shares)
    # ... nothing was unmasked, nothing released or charged.
    assert not any(unpack_sids(p.config) for p in mitm.replies.get("unmask", {}).values())
    [record] = res.metrics
    assert record["contributors"] == 0 and "aborted" in record
    ledger = json.loads((tmp_path / "run" / runs.LEDGER_FILE).read_text())["events"]
    assert ledger == []


class EquivocatingServer(FederatedServer):
    """Round 3 played by a server that tells half of the users that user 0 survived and
    the other half that it dropped (to collect both kinds of its shares), then relays every
    signature it got."""

    def _consistency(self, server, survivors, r, node_of_sid, transcript):
        if r >= EVAL_ROUND_OFFSET:  # the evaluation round after it is played honestly
            return super()._consistency(server, survivors, r, node_of_sid, transcript)
        env = server._env
        full = sorted(server.u3)
        partial = [i for i in full if i != 0]
        shown = {sid: (full if sid % 2 == 0 else partial) for sid in survivors}
        outbox = {sid: wire.encode_survivors(env, sid, ids) for sid, ids in shown.items()}
        replies = self._send("consistency", r, outbox, node_of_sid, 60.0)
        sigs = {}
        for payload in replies.values():
            for sid, msg in unpack_sids(payload.config).items():
                sigs[sid] = wire.decode_survivors_signature(env, msg, sender=sid)
        self.signed = sorted(sigs)
        server.u4 = frozenset(sigs)
        server.stage = Stage.CONSISTENT  # its own bookkeeping: it goes on to ask for shares
        requests = {
            sid: wire.encode_signed_unmask_request(
                env, sid, [(j, sigs[j]) for j in sorted(sigs) if j != sid]
            )
            for sid in sigs
        }
        return requests


def test_a_server_that_shows_different_survivor_sets_gets_no_share(tmp_path):
    # Seven users on the complete graph, one dropout tolerated: k = 6, t = 4, and a set of 6
    # is not below the round's floor. No DP: under user-level DP a cohort is Poisson or
    # everyone, and a fixed 7 makes the graph complete.
    cfg = _cfg(
        epsilon=None,
        replay=False,
        secagg_neighbours=6,
        secagg_dropout=0.1,
        secagg_corrupt=0.0,
    )
    cfg = dataclasses.replace(cfg, rounds=1, clients_per_round=7)
    transport, settings = _enrolled(tmp_path)
    server = EquivocatingServer(
        cfg, run_dir=tmp_path / "run", transport=transport, settings=settings
    )
    res = server.run()
    assert len(server.signed) == 7  # every user signed the set it was shown
    stages = [stage for stage, _, _ in transport.seen]
    training = transport.seen[: stages.index("evaluate")]  # the evaluation round follows
    unmask = [r for stage, _, r in training if stage == "unmask"]
    assert unmask and not any(unpack_sids(p.config) for p in unmask)  # no share revealed
    [record] = res.metrics
    assert "aborted" in record and record["contributors"] == 0
    # The loss rides in the masked inputs: an aborted round releases none of it either.
    assert torch.isnan(torch.tensor(record["loss"])) and "clipped_fraction" not in record


def test_cli_enrollment_across_machines_feeds_a_malicious_mode_run(tmp_path):
    """The documented multi-machine steps: `flower enroll` on each node, `flower directory`
    by the operator, `flower app --enrollment`; the files they write run a round."""
    pytest.importorskip("flwr", reason="Flower is not installed")
    import tomllib

    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app

    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    cli = CliRunner()
    cfg = dataclasses.replace(_cfg(), rounds=1)
    config = tmp_path / "run.toml"
    config.write_text(runs.dumps_toml(cfg.to_dict()))
    state = tmp_path / "nodes"
    for p in range(3):
        args = ["flower", "enroll", "--config", str(config), "--state-dir"]
        args += [str(state / f"node-{p}"), "--partition-id", str(p), "--num-partitions", "3"]
        res = cli.invoke(root, [*args, "--out", str(tmp_path / f"keys-{p}.json")])
        assert res.exit_code == 0, res.output
        assert "enrolled 20 users" in " ".join(res.output.split())
    files = [str(tmp_path / f"keys-{p}.json") for p in range(3)]
    directory = tmp_path / "enrollment.json"
    res = cli.invoke(root, ["flower", "directory", *files, "--out", str(directory)])
    assert res.exit_code == 0 and "60 users" in res.output, res.output
    twice = cli.invoke(root, ["flower", "directory", files[0], files[0], "--out", "x.json"])
    assert twice.exit_code == 2 and "enrolled in" in twice.output
    app = tmp_path / "app"
    res = cli.invoke(root, ["flower", "app", str(app), "--config", str(config), "--out", "r"])
    assert res.exit_code == 2 and "--enrollment" in " ".join(res.output.split())
    res = cli.invoke(
        root,
        ["flower", "app", str(app), "--config", str(config), "--out", str(tmp_path / "r")]
        + ["--enrollment", str(directory)],
    )
    assert res.exit_code == 0, res.output
    run_config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert run_config["config"]["enrollment"] == str(directory.resolve())
    transport = LocalTransport(3, state_dir=state, node_extra={"enrollment": str(directory)})
    settings = ServerSettings(enrollment=run_config["config"]["enrollment"])
    out = FederatedServer(cfg, run_dir=tmp_path / "run", transport=transport, settings=settings)
    [record] = out.run().metrics
    assert record["contributors"] == 60 and "aborted" not in record


def test_a_malicious_mode_run_resumes_with_the_same_enrollment(tmp_path):
    from test_flower_resume import CrashingTransport, _Crash  # tests/ is on sys.path

    cfg = dataclasses.replace(_cfg(epsilon=None, noise_multiplier=1.0), rounds=3)
    ref_nodes, ref_settings = _enrolled(tmp_path / "ref")
    ref = FederatedServer(
        cfg, run_dir=tmp_path / "ref" / "run", transport=ref_nodes, settings=ref_settings
    ).run()
    nodes, settings = _enrolled(tmp_path / "b")
    with pytest.raises(_Crash):
        FederatedServer(
            cfg,
            run_dir=tmp_path / "b" / "run",
            transport=CrashingTransport(nodes, "consistency", round_index=1),
            settings=settings,
        ).run()
    res = FederatedServer.resume(tmp_path / "b" / "run", transport=nodes, settings=settings).run()
    for a, b in zip(ref.metrics, res.metrics, strict=True):
        for key in ("test_hr@10", "contributors", "loss"):
            assert b[key] == a[key], key


def test_an_enrolled_node_refuses_a_server_that_asks_for_semi_honest_mode(tmp_path):
    """Found in review: the run's config reaches a node with every message, from the server;
    an enrolled node followed a server that sent secagg_mode = "semi-honest", sent unsigned
    keys, skipped the consistency round, and a server lying about survivors recovered an
    input exactly. The enrollment now pins the mode: nothing is trained or sent."""
    from securefed.errors import ProtocolError

    transport, _ = _enrolled(tmp_path)
    downgraded = _cfg(secagg_mode="semi-honest")
    server = FederatedServer(
        downgraded, run_dir=tmp_path / "run", transport=transport, settings=ServerSettings()
    )
    with pytest.raises(ProtocolError, match="enrolled for malicious-mode"):
        server.run()
    assert {stage for stage, _, _ in transport.seen} == {"hello"}


def test_a_node_with_a_pinned_config_refuses_other_privacy_settings(tmp_path):
    """Found in review: the server could also raise epsilon (the nodes then add smaller noise
    shares) or lower the corruption bound (and with it t). A node given the operator's copy of
    the config (--node-config pin-config=...) refuses any [privacy] setting that differs from
    it; an honest server's run goes through."""
    from securefed.errors import ProtocolError
    from securefed.training import load_config_file

    honest = _cfg()
    pinned = tmp_path / "run.toml"
    pinned.write_text(runs.dumps_toml(honest.to_dict()))
    assert load_config_file(pinned)["privacy"]["epsilon"] == 8.0
    transport, settings = _enrolled(tmp_path)
    for node_config in transport.node_configs.values():
        node_config["pin-config"] = str(pinned)
    # ... and the cohort's rate or the planned rounds, which size the noise and amplify
    # the nodes' own release count (found in review: 201 releases at sigma 0.66 where the
    # pinned config allowed 20 at 2.85).
    changes = [
        dataclasses.replace(honest, privacy=dataclasses.replace(honest.privacy, **change))
        for change in ({"epsilon": 1000.0}, {"secagg_corrupt": 0.0})
    ]
    changes += [
        dataclasses.replace(honest, client_fraction=0.5),
        dataclasses.replace(honest, rounds=honest.rounds + 8),
    ]
    for cfg, name in zip(
        changes, ("epsilon", "secagg_corrupt", "client_fraction", "rounds"), strict=True
    ):
        server = FederatedServer(
            cfg, run_dir=tmp_path / f"run-{name}", transport=transport, settings=settings
        )
        with pytest.raises(ProtocolError, match=f"pinned config .* {name} = "):
            server.run()
    out = FederatedServer(
        honest, run_dir=tmp_path / "honest", transport=transport, settings=settings
    ).run()
    assert len(out.metrics) == honest.rounds


def test_the_pin_resolves_the_file_as_a_run_does(tmp_path):
    """Found in review: the pin compared only the keys its file names, and files written by
    `flower init` leave out what is None (noise_multiplier among them), so a server adding a
    smaller noise_multiplier beside the same epsilon was accepted; and a run directory's
    legacy `secure` key made every node refuse its resume."""
    from securefed.errors import ProtocolError
    from securefed.flower.messages import check_pinned

    honest = _cfg()
    pinned = tmp_path / "run.toml"
    pinned.write_text(runs.dumps_toml(honest.to_dict()))
    assert "noise_multiplier" not in pinned.read_text()
    check_pinned(honest, pinned)  # the honest server's run
    smaller = dataclasses.replace(
        honest, privacy=dataclasses.replace(honest.privacy, noise_multiplier=0.649)
    )
    with pytest.raises(ProtocolError, match="noise_multiplier = 0.649"):
        check_pinned(smaller, pinned)
    legacy = tmp_path / "legacy.toml"  # a run directory written before replay existed
    legacy.write_text(
        pinned.read_text().replace("replay = true", "secure = false"), encoding="utf-8"
    )
    assert "secure = false" in legacy.read_text()
    check_pinned(honest, legacy)


def test_flower_local_pins_every_node_to_the_config_it_wrote(tmp_path, monkeypatch):
    """Found in review: only the simulation engine passed pin-config; the local deployment's
    SuperNodes got the enrollment alone."""
    import contextlib

    from securefed.flower import deploy

    seen: dict = {}

    @contextlib.contextmanager
    def capture(work, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("captured")
        yield

    monkeypatch.setattr(deploy, "local_deployment", capture)
    cfg = TrainConfig(
        synthetic_users=60,
        synthetic_items=400,
        rounds=1,
        privacy=PrivacyConfig(epsilon=8.0, secagg=True),
    )
    with pytest.raises(RuntimeError, match="captured"):
        deploy.run_local_deployment(
            cfg, run_dir=tmp_path / "run", nodes=3, work_dir=tmp_path / "work"
        )
    extra = seen["node_extra"]
    assert sorted(extra) == [0, 1, 2]
    assert all("pin-config" in e and "securefed.toml" in e["pin-config"] for e in extra.values())
