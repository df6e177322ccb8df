"""securefed on Flower's engines: a local deployment on 127.0.0.1 and the simulation engine.

Each test starts real processes (a SuperLink, SuperNodes, ``flwr run``), bound to loopback
only, bounded in time, and stopped on success or failure. Flower 1.42 starts a fresh ClientApp
process per message unless the SuperNode runs in ``process`` isolation with securefed's
long-lived ClientApp process beside it (the default here); a 2-round run still takes a minute
or more on a loaded 2-core machine: these tests are marked ``slow`` (run with ``-m slow``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'securefed[flower]')")

from protocols.secagg import wire  # noqa: E402
from protocols.secagg.wire import ring_dtype  # noqa: E402
from securefed import runs  # noqa: E402
from securefed.errors import ConfigError  # noqa: E402
from securefed.evaluation import evaluate_splits  # noqa: E402
from securefed.flower import deploy  # noqa: E402
from securefed.training import PrivacyConfig, TrainConfig, train  # noqa: E402

KEYS = ("val_hr@10", "val_ndcg@10", "test_hr@10", "test_full_hr@10", "test_full_ndcg@10")


def _metric_tol(key: str) -> float:
    """How far a deployed round's metric may be from the in-process one: hits are summed
    exactly by the secure evaluation round, a user's NDCG to 2^-16."""
    return 2.0**-16 if "ndcg" in key else 1e-12


def _cfg(**privacy) -> TrainConfig:
    return TrainConfig(
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        checkpoint_every=1,
        # Replay: the deployment is compared with the seeded in-process simulation.
        privacy=PrivacyConfig(secagg=True, epsilon=8.0, replay=True, **privacy),
    )


@contextlib.contextmanager
def _run_until_stalled(
    cfg: TrainConfig, work, run_dir, *, partition: int, at: str
) -> Iterator[tuple[deploy.LocalDeployment, subprocess.Popen]]:
    """A local deployment of 3 nodes running ``cfg`` until node ``partition`` hangs on the
    message ``at`` (``"<stage>:<round>"``, the ClientApp's stall hook); yields the deployment
    and the ``flwr run`` process; leaving kills that process and stops every other."""
    config_file = deploy._prepare(cfg, run_dir, work)
    app = deploy.write_app(work / "app", config_file=config_file, run_dir=run_dir, stage_timeout=90)
    stall = {partition: {"fault-stall-at": f'"{at}"'}}
    with deploy.local_deployment(work, nodes=3, node_extra=stall) as dep:
        log = (work / "logs" / "flwr-run.log").open("ab")
        proc = subprocess.Popen(
            [deploy._bin("flwr"), "run", str(app), "local-deployment", "--stream"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dep.env,
        )
        try:
            marker = dep.node_state_dir(partition) / "stalled"
            deadline = time.monotonic() + 600
            while not marker.exists():
                assert time.monotonic() < deadline, f"node {partition} never reached {at}"
                assert proc.poll() is None, f"the run ended before {at}"
                time.sleep(0.5)
            yield dep, proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.slow
def test_local_deployment_matches_in_process_and_server_sees_only_masked_inputs(tmp_path):
    from test_flower_protocol import _replay_ring  # tests/ is on sys.path under pytest

    cfg = _cfg()
    ref = train(cfg, out=tmp_path / "ref")
    shown: list[int] = []
    summary = deploy.run_local_deployment(
        cfg,
        run_dir=tmp_path / "run",
        nodes=3,
        work_dir=tmp_path / "work",
        stage_timeout=120,
        timeout=900,
        transcript=True,
        progress=lambda rec: shown.append(rec.round),
    )
    assert summary["engine"] == "flower" and summary["rounds"] == 2
    assert shown == [1, 2]  # a line per round while the ServerApp (another process) ran
    # The server holds no data; the operator's deployment added the in-process yardsticks.
    for key in ("baseline_mostpop_test_hr@10", "baseline_dp_mostpop_test_full_hr@10"):
        assert summary[key] == ref.summary[key], key
    assert summary["verdict"] == ref.summary["verdict"] and "yardsticks" not in summary
    got = runs.read_metrics(tmp_path / "run")
    for a, b in zip(ref.metrics, got, strict=True):
        assert a["contributors"] == b["contributors"] == 60
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key
    # The server process received only wire messages; every masked input differs from the
    # user's encoded input (recomputed here by replaying the seeded round).
    inputs, params, _, _ = _replay_ring(cfg, tmp_path)
    bits = params.codec.modulus_bits
    dtype = ring_dtype(bits)
    dim = next(iter(inputs.values())).size
    lines = [json.loads(x) for x in (tmp_path / "run" / "flower_transcript.jsonl").open()]
    # eager masking without a fallback: the masked inputs came with the shares ("eager")
    assert {x["stage"] for x in lines} == {"advertise", "share", "eager", "unmask"}
    masked = [x for x in lines if x["stage"] == "eager" and x["round"] == 0]
    assert len(masked) == 60
    for x in masked:
        raw = (tmp_path / "run" / "transcript" / f"r0-eager-{x['sid']}.bin").read_bytes()
        y = wire.unpack_ring(raw[-wire.packed_bytes(dim, bits) :], bits, dim)
        assert np.mean(y == inputs[x["sid"]].astype(dtype)) < 0.01
    # No leftover processes hold the ports: everything was stopped.
    assert not (tmp_path / "work" / "nodes" / "node-0" / "stalled").exists()
    # Secure by default: the SuperLink served TLS with node authentication, the flwr CLI
    # trusted the run's own CA, and every node used its own registered key.
    work = tmp_path / "work"
    assert "running on https://" in (work / "logs" / "superlink.log").read_text()
    connection = (work / "flwr-home" / "config.toml").read_text()
    assert "insecure" not in connection and str(work / "tls" / "ca.crt") in connection
    assert (work / "logs" / "register.log").read_text().count("registered successfully") == 3


@pytest.mark.slow
def test_each_node_serves_every_message_from_one_long_lived_process(tmp_path):
    """Issue 16 item 1: per SuperNode one ClientApp process (securefed.flower.worker) serves
    every message of a 2-round run, and Flower starts no ClientApp process of its own."""
    import re

    cfg = _cfg()
    work, run_dir = tmp_path / "work", tmp_path / "run"
    app = deploy.write_app(
        work / "app",
        config_file=deploy._prepare(cfg, run_dir, work),
        run_dir=run_dir,
        stage_timeout=120,
    )
    with deploy.local_deployment(work, nodes=3) as dep:
        workers = [w.pid for w in dep.workers if w is not None]
        assert len(workers) == 3
        assert deploy.submit(dep, app, timeout=900).returncode == 0
        assert all(w is not None and w.poll() is None for w in dep.workers)  # still serving
    assert len(runs.read_metrics(run_dir)) == 2
    for p, pid in enumerate(workers):
        log = (work / "logs" / f"worker-{p}.log").read_text()
        started = re.findall(r"securefed worker pid=(\d+) for the SuperNode", log)
        served = re.findall(r"securefed worker pid=(\d+) served (\S+) message", log)
        assert started == [str(pid)]
        # hello, then per round train, share, masked, unmask, and each evaluation round's
        # evaluate, share, unmask.
        kinds = [k for _, k in served]
        assert kinds.count("train") == kinds.count("evaluate") == 2, kinds
        assert kinds.count("query.unmask") == 4, kinds
        assert {q for q, _ in served} == {str(pid)}
        assert "(failed)" not in log
        supernode = (work / "logs" / f"supernode-{p}.log").read_text()
        assert "flwr-clientapp" not in supernode  # no per-message process was started


def _nodes(dep: deploy.LocalDeployment) -> list[dict]:
    out = subprocess.run(
        [deploy._bin("flwr"), "supernode", "ls", "local-deployment", "--format", "json"],
        capture_output=True,
        text=True,
        env=dep.env,
        timeout=120,
        check=True,
    ).stdout
    return json.loads(out[out.index("{") :])["nodes"]


@pytest.mark.slow
def test_supernode_with_unregistered_key_is_refused(tmp_path):
    """Issue 16 item 2: a SuperNode whose public key was not registered is refused by the
    SuperLink (Flower exit code 305, no node id), so no message can ever be addressed to it;
    the registered node on the same SuperLink is online."""
    with deploy.local_deployment(tmp_path / "work", nodes=2, unregistered={1}) as dep:
        assert dep.tls and dep.authenticated
        outsider = dep.supernodes[1]
        assert outsider.wait(timeout=180) != 0
        log = (tmp_path / "work" / "logs" / "supernode-1.log").read_text()
        assert "Exit Code: 305" in log and "Failed to activate SuperNode" in log
        assert "SuperNode ID" not in log
        deadline = time.monotonic() + 180
        while "SuperNode ID" not in (tmp_path / "work" / "logs" / "supernode-0.log").read_text():
            assert time.monotonic() < deadline, "the registered node never connected"
            assert dep.supernodes[0].poll() is None, "the registered node exited"
            time.sleep(0.5)
        nodes = _nodes(dep)
        assert [n["status"] for n in nodes] == ["online"]  # one key registered, one node


@pytest.mark.slow
def test_insecure_deployment_is_plain_and_unauthenticated(tmp_path):
    with deploy.local_deployment(tmp_path / "work", nodes=1, insecure=True) as dep:
        assert not dep.tls and not dep.authenticated
        deadline = time.monotonic() + 180
        while "SuperNode ID" not in (tmp_path / "work" / "logs" / "supernode-0.log").read_text():
            assert time.monotonic() < deadline, "the node never connected"
            time.sleep(0.5)
        assert [n["status"] for n in _nodes(dep)] == ["online"]
    work = tmp_path / "work"
    assert "insecure = true" in (work / "flwr-home" / "config.toml").read_text()
    assert "running on http://" in (work / "logs" / "superlink.log").read_text()
    assert not (work / "tls").exists() and not (work / "keys").exists()


def test_unregistered_partitions_are_checked_before_anything_starts(tmp_path):
    with (
        pytest.raises(ConfigError, match="unregistered partitions"),
        deploy.local_deployment(tmp_path, nodes=2, unregistered={2}),
    ):
        pass
    with (
        pytest.raises(ConfigError, match="node authentication"),
        deploy.local_deployment(tmp_path, nodes=2, unregistered={1}, insecure=True),
    ):
        pass


@pytest.mark.slow
def test_supernode_killed_after_masked_input_round_completes_with_survivors(tmp_path):
    cfg = _cfg(secagg_dropout=0.4)  # one of three nodes is a third of the users
    work, run_dir = tmp_path / "work", tmp_path / "run"
    with _run_until_stalled(cfg, work, run_dir, partition=1, at="unmask:0") as (dep, proc):
        dep.kill_node(1)  # SIGKILL the SuperNode and its ClientApp mid-round
        proc.wait(timeout=600)
    got = runs.read_metrics(run_dir)
    assert len(got) == 2
    first, second = got
    # Killed after sending its masked inputs: its users are survivors (in the sum) and
    # their self-mask seeds are reconstructed from the other nodes' shares.
    assert "aborted" not in first
    assert first["contributors"] == first["secagg_survivors"] == 60
    # Next round the node is gone: its 20 users never advertise; the others' sum is used.
    assert "aborted" not in second
    assert second["contributors"] == second["secagg_survivors"] == 40
    assert second["eval_users"] == 40
    # Same first-round model as the in-process run (every input was summed): its metrics over
    # the 40 users still reachable equal the in-process model's over the same users.
    survivors = np.array([u for u in range(60) if u % 3 != 1])
    seen = {}

    def observe(view):
        if view.round_index == 0:
            res = evaluate_splits(view.model, view.model.split, k=10, full=True, per_user=True)
            seen.update({w: np.asarray(r.ranks)[survivors] for w, r in res.items()})

    train(_cfg(secagg_dropout=0.4), out=tmp_path / "ref", observer=observe)
    for which in ("val", "test"):
        assert first[f"{which}_hr@10"] == pytest.approx(float((seen[which] < 10).mean()))


@pytest.mark.slow
def test_supernode_killed_at_the_share_stage_falls_back_to_the_masked_stage(tmp_path):
    """Eager masking across real processes: a node killed before its share reply leaves its
    users out of the round; the server discards the eager masked inputs (masked towards them
    too) and runs the ``masked`` stage, and the round sums the other 40 users."""
    cfg = _cfg(secagg_dropout=0.4)
    work, run_dir = tmp_path / "work", tmp_path / "run"
    with _run_until_stalled(cfg, work, run_dir, partition=1, at="share:0") as (dep, proc):
        dep.kill_node(1)
        proc.wait(timeout=600)
    first, second = runs.read_metrics(run_dir)
    for rec in (first, second):
        assert "aborted" not in rec
        assert rec["contributors"] == rec["secagg_survivors"] == 40
    assert first["secagg_eager"] is False and first["flower_masked_seconds"] > 0  # the fallback
    assert second["secagg_eager"] is True  # the node is gone: nobody missing, three exchanges
    # (That the fallback's sum is exactly the survivors' is checked against a replay of their
    # inputs in tests/test_flower_protocol.py; here: it runs across real processes.)


@pytest.mark.slow
def test_deployment_stopped_mid_round_resumes_to_the_uninterrupted_result(tmp_path):
    """Issue 16 item 4: every process of a local deployment (SuperLink, SuperNodes, their
    ClientApp processes, ``flwr run``) is stopped in the middle of round 3, after the
    checkpoint of round 2; a fresh deployment on the same work directory resumes the run and
    ends where an uninterrupted run ends."""
    cfg = TrainConfig(
        synthetic_users=60,
        synthetic_items=400,
        rounds=4,
        checkpoint_every=2,
        privacy=PrivacyConfig(secagg=True, noise_multiplier=1.0, replay=True),
    )
    ref = train(cfg, out=tmp_path / "ref")
    work, run_dir = tmp_path / "work", tmp_path / "run"
    with _run_until_stalled(cfg, work, run_dir, partition=0, at="train:2"):
        pass  # node 0 hangs in round 3; leaving stops every process
    # Everything is stopped; the run directory holds the checkpoint of round 2.
    assert runs.load_checkpoint(run_dir)["round"] == 2
    assert [m["round"] for m in runs.read_metrics(run_dir)] == [1, 2]
    summary = deploy.run_local_deployment(
        cfg, run_dir=run_dir, nodes=3, work_dir=work, stage_timeout=120, timeout=900, resume=True
    )
    assert summary["rounds"] == 4
    got = runs.read_metrics(run_dir)
    assert [m["round"] for m in got] == [1, 2, 3, 4]
    for a, b in zip(ref.metrics, got, strict=True):
        assert a["contributors"] == b["contributors"] == 60
        for key in KEYS:
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), (a["round"], key)
    # Round 3 was never unmasked before the stop: four releases, none counted twice.
    ledger = json.loads((run_dir / runs.LEDGER_FILE).read_text())["events"]
    assert len(ledger) == 4


@pytest.mark.slow
def test_malicious_mode_deployment_enrolls_signs_and_matches_in_process(tmp_path):
    """Issue 16 item 3 across real processes: the local deployment enrolls every node's
    users (keys in each node's state directory, the public directory beside them), every
    round runs the signed consistency stage, and the result is the in-process run's."""
    cfg = _cfg(secagg_mode="malicious")
    ref = train(cfg, out=tmp_path / "ref")
    work = tmp_path / "work"
    summary = deploy.run_local_deployment(
        cfg, run_dir=tmp_path / "run", nodes=3, work_dir=work, stage_timeout=120, timeout=900
    )
    assert summary["rounds"] == 2
    got = runs.read_metrics(tmp_path / "run")
    for a, b in zip(ref.metrics, got, strict=True):
        assert a["contributors"] == b["contributors"] == 60
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key
    assert (work / "enrollment.json").exists()
    for p in range(3):
        keys = work / "nodes" / f"node-{p}" / "identity-keys.json"
        assert keys.stat().st_mode & 0o777 == 0o600
    log = (work / "logs" / "superlink.log").read_text() + "".join(
        (work / "logs" / f"worker-{p}.log").read_text() for p in range(3)
    )
    assert "Traceback" not in log


@pytest.mark.slow
def test_simulation_engine_matches_in_process(tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray")
    cfg = _cfg()
    ref = train(cfg, out=tmp_path / "ref")
    shown: list[int] = []
    summary = deploy.run_simulation(
        cfg,
        run_dir=tmp_path / "run",
        nodes=3,
        work_dir=tmp_path / "work",
        stage_timeout=120,
        progress=lambda rec: shown.append(rec.round),
    )
    assert shown == [1, 2] and "yardsticks" not in summary
    assert summary["baseline_mostpop_test_hr@10"] == ref.summary["baseline_mostpop_test_hr@10"]
    for key in KEYS:
        assert summary[f"final_{key}"] == pytest.approx(
            ref.summary[f"final_{key}"], abs=_metric_tol(key)
        )


def test_flower_deprecation_notices_are_filtered_and_other_lines_kept(monkeypatch):
    """Issue 18 point 5: ``flower simulate`` calls Flower's deprecated Python
    ``run_simulation``, whose notice (and Ray's DeprecationWarnings) filled the output."""
    import logging
    import os
    import warnings

    from flwr.common.logger import log, warn_deprecated_feature

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage().split("\n")[0])

    handler = Keep()
    logging.getLogger("flwr").addHandler(handler)
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # as Ray's import sets "once", before
            with deploy.quiet_flower_deprecations():
                warn_deprecated_feature("The `run_simulation` function is deprecated")
                log(logging.WARNING, "a node failed")
                warnings.warn("old", DeprecationWarning, stacklevel=1)
                warnings.warn("kept", UserWarning, stacklevel=1)
                warnings.warn("Tip: In future versions of Ray, ...", FutureWarning, stacklevel=1)
                assert not logging.getLogger("flwr").propagate  # not again via the root
                assert "ignore::DeprecationWarning" in os.environ["PYTHONWARNINGS"]
        warn_deprecated_feature("after the context")
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    assert seen == ["a node failed", "DEPRECATED FEATURE: after the context"]
    assert [str(w.message) for w in caught] == ["kept"]
    assert "PYTHONWARNINGS" not in os.environ
    assert logging.getLogger("flwr").propagate


def test_stopping_a_deployment_leaves_no_process_of_its_groups(tmp_path):
    """A process that outlives its group's leader or ignores SIGTERM (Flower's serverapp,
    started by the SuperLink, was once found retrying a dead SuperLink 1.5 h later) is
    killed when the deployment stops."""
    from securefed.flower import guard

    pid_file = tmp_path / "straggler.pid"
    # The straggler runs in a session of its own (as Flower's serverapp does) and ignores
    # SIGTERM; the group has a second TERM-ignoring member.
    inner = f'trap "" TERM; echo $$ > {pid_file}; sleep 300'
    script = f"setsid sh -c '{inner}' & sh -c 'trap \"\" TERM; sleep 300' & sleep 300"
    leader = deploy._spawn(["sh", "-c", script], tmp_path / "log", dict(os.environ))
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    straggler = int(pid_file.read_text())
    dep = deploy.LocalDeployment(tmp_path, port=0, superlink=leader)
    try:
        dep.stop()
        assert leader.poll() is not None
        deadline = time.monotonic() + 5
        while guard._group_members(leader.pid) or guard._start_time(straggler) is not None:
            assert time.monotonic() < deadline, f"{straggler} or a group member survived"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(straggler, signal.SIGKILL)


def test_the_guard_stops_a_deployment_whose_command_was_killed(tmp_path):
    """Found in a deployment walkthrough: `kill -9` of `securefed flower local` left the
    SuperLink, its ServerApp, the SuperNodes and their workers running (in sessions of their
    own); they finished the run without yardsticks and stayed up. The guard, in a session of
    its own, stops every recorded group (and what it started) once the command is gone."""
    import sys

    from securefed.flower import guard

    command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    pid_file = tmp_path / "straggler.pid"
    inner = f'trap "" TERM; echo $$ > {pid_file}; sleep 300'
    script = f"setsid sh -c '{inner}' & sleep 300"
    leader = deploy._spawn(["sh", "-c", script], tmp_path / "log", dict(os.environ))
    record = tmp_path / guard.GUARD_FILE.format(pid=command.pid)
    record.write_text("")
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    straggler = int(pid_file.read_text())
    guard.record_process(record, leader.pid)
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "securefed.flower.guard",
            "--parent",
            str(command.pid),
            "--parent-start",
            str(guard._start_time(command.pid)),
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        time.sleep(1.5)
        assert watcher.poll() is None and leader.poll() is None  # the command lives: nothing
        command.kill()
        command.wait()
        out, _ = watcher.communicate(timeout=30)
        assert "stopping 1 process group(s)" in out and not record.exists()
        deadline = time.monotonic() + 10
        while guard._group_members(leader.pid) or guard._start_time(straggler) is not None:
            assert time.monotonic() < deadline, f"{straggler} or a group member survived"
            time.sleep(0.05)
    finally:
        for pid in (leader.pid,):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(straggler, signal.SIGKILL)
        command.kill()
        watcher.kill()


def test_a_deployment_stopped_normally_stops_its_guard(tmp_path):
    from securefed.flower import guard

    (tmp_path / "logs").mkdir()
    leader = deploy._spawn(["sleep", "300"], tmp_path / "log", dict(os.environ))
    dep = deploy.LocalDeployment(tmp_path, port=0)
    started = guard.start_guard(tmp_path, dict(os.environ))
    assert started is not None
    dep.guard, dep.guard_record = started
    assert dep.guard_record == tmp_path / f"deployment-{os.getpid()}.pids"  # one per command
    dep.superlink = dep.track(leader)
    assert dep.guard_record.read_text().startswith(f"{leader.pid} ")
    dep.stop()
    assert dep.guard.poll() is not None and leader.poll() is not None
    assert not dep.guard_record.exists()


def test_a_group_whose_leader_is_gone_is_still_stopped(tmp_path):
    """The guard and stop() share stop_recorded: a group whose leader has exited (or is a
    zombie) but which still has members is still the deployment's (its number is not reused
    while it has members), so its members are killed; the guard had skipped such a group."""
    from securefed.flower import guard

    pid_file, go = tmp_path / "member.pid", tmp_path / "go"
    script = f'trap "" TERM; sleep 300 & echo $! > {pid_file}; '
    script += f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0"  # exits once recorded
    leader = deploy._spawn(["sh", "-c", script], tmp_path / "log", dict(os.environ))
    recorded = guard._start_time(leader.pid)
    go.touch()
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip() or leader.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    member = int(pid_file.read_text())
    try:
        assert recorded is not None and guard._group_members(leader.pid) == [member]
        guard.stop_recorded({leader.pid: recorded}, grace=1.0)
        deadline = time.monotonic() + 5
        while guard._start_time(member) is not None:
            assert time.monotonic() < deadline, "the leaderless group's member survived"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
