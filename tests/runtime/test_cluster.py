"""Actors on a Ray cluster's nodes (``runtime.cluster``), on a local multi-node Ray cluster
(``--cluster local:N``: ``ray.cluster_utils.Cluster`` nodes on this machine): learning with
actors on two nodes, a node removed mid-run, a client without the run's keys refused, and the
result's per-node energy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import zmq

from runtime import wire
from runtime.cluster import parse_cluster
from runtime.config import TrainConfig


def test_cluster_addresses_are_parsed_and_bad_ones_say_what_is_allowed():
    assert parse_cluster("local:3").nodes == 3 and parse_cluster("auto").kind == "auto"
    assert str(parse_cluster("ray://10.0.0.5:10001")) == "ray://10.0.0.5:10001"
    for bad in ("", "local:0", "local:x", "ray://host", "http://h:1", "ray://h:99999"):
        with pytest.raises(ValueError, match=r"allowed auto, ray://HOST:PORT or local:N|1 to 64"):
            parse_cluster(bad)
    problems = TrainConfig(cluster="local:2").problems()  # the links must be tcp
    assert any("actors on other nodes reach the run over tcp only" in p for p in problems)
    assert TrainConfig(cluster="local:2", transport="tcp").problems() == []


def test_a_remote_actor_gets_the_client_keys_only():
    from runtime.curve import CurveError
    from runtime.topology import Endpoints

    ep = Endpoints.tcp()
    remote = ep.for_clients()
    assert remote.keys.server_secret == b"" and remote.keys.client_secret == ep.keys.client_secret
    ctx = zmq.Context()
    try:
        with pytest.raises(CurveError, match="cannot serve"):
            remote.keys.serve(ctx.socket(zmq.PULL))
    finally:
        ctx.destroy(linger=0)


def _train(*flags: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--env", "CartPole-v1", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def test_a_cluster_that_cannot_be_reached_is_an_error_saying_why_not_a_traceback():
    pytest.importorskip("ray")
    proc = _train("--cluster", "ray://127.0.0.1:9", "--quiet", timeout_s=180)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--cluster ray://127.0.0.1:9: Ray could not connect" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_local_cluster_cpus_are_this_machines_cores_shared_out():
    from runtime.cluster import cluster_cpus

    cores = len(os.sched_getaffinity(0))
    assert cluster_cpus("local:1") == (cores, 0)  # none on another host
    assert cluster_cpus("local:64")[0] == 64 * max(1, cores // 64)
    from autotune.workflows.auto_size import cluster_model_nodes

    nodes = cluster_model_nodes(TrainConfig(cluster="local:2", transport="tcp"))
    assert [n.cpus for n in nodes] == [max(1, cores // 2)] * 2  # as the sizing's model sees them
    assert all(n.here and n.rtt_s == 0 for n in nodes)
    assert cluster_model_nodes(TrainConfig()) == ()


ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_cartpole_with_actors_on_two_nodes_learns_and_counts_every_node(tmp_path):
    out = tmp_path / "r.json"
    proc = _train(
        *("--cluster", "local:2", "--envs-per-actor", "32"),  # --actors auto: one per CPU
        *("--batch-size", "2048", "--trainers", "1", "--trainer-device", "cpu"),
        *("--target-return", "400", "--steps", "600000"),  # ends once it learned to 400
        *("--quiet", "--json", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    from runtime.cluster import cluster_cpus

    assert r["config"]["transport"] == "tcp" and r["config"]["cluster"] == "local:2"
    assert r["config"]["actors"] == cluster_cpus("local:2")[0]
    assert r["target"]["reached"], r["target"]  # a 100-episode mean of at least 400
    assert r["target"]["return_then"] >= 400 and r["target"]["steps"] < 600_000
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"] + r["lost_steps"]
    assert r["lost_steps"] == 0 and r["auth_refused"] == 0
    nodes = r["energy"]["nodes"]
    with_actors = [n for n in nodes.values() if n["actors"]]
    assert len(with_actors) == 2  # actors on each of the two nodes that offer CPUs
    assert all(n["stepped"] > 0 for n in with_actors)  # what each node's actors sampled
    assert sum(n["stepped"] for n in nodes.values()) == r["sampled_steps"]
    for n in nodes.values():  # a local cluster's nodes share this host: counted once, here
        assert n["host"] == "head" and n["host_counted_in"] == "head" and not n["lost"]
        assert n["cpu_source"] in ("rapl", "model") and n["cpu_j"] > 0
    assert all(n["processes_cpu_j"] > 0 for n in with_actors)
    assert r["energy"]["other_hosts_j"] == 0
    assert "steps_per_joule_busy_only" not in r  # the other hosts' meters give no idle part


@pytest.mark.slow
def test_a_node_lost_a_node_joining_and_an_intruder_leave_the_run_going_and_the_count_exact():
    """Two nodes, an actor on every CPU they offer. Once training is under way the node of
    actor 0 is removed (its incarnation dies with it) and a client with its own CURVE key
    pushes at the experience link (refused, counted). Actor 0's next incarnation finds no CPU
    free and waits, left to Ray, until a node joins; it starts there and steps. The run trains
    on throughout, and every sampled step is trained or counted as lost."""
    from runtime.runner import Runner

    cfg = TrainConfig(
        steps=10_000_000,  # it ends once the actor that waited for the new node has stepped
        max_wall_s=600,
        actors=cluster_cpus_local(2),
        envs_per_actor=8,
        rollout_len=32,
        batch_size=1024,
        trainer_device="cpu",
        transport="tcp",
        cluster="local:2",
    )
    ctx = zmq.Context()
    done: dict[str, object] = {}
    runner: Runner

    def disturb(state) -> None:
        local = runner.actors.launcher.cluster.local if runner.actors.launcher else None
        if not done and state.trained_steps >= 4096:
            slot = next(s for s in runner.slots if s.index == 0)
            assert slot.process.started()
            node = next(n for n in local.list_all_nodes() if n.node_id == slot.process.node_id)
            local.remove_node(node)
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.curve_serverkey = runner.endpoints.keys.server_public
            sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
            sock.connect(runner.endpoints.experience)
            wire.send_msg(sock, wire.MsgType.STATS, {"src": "forged", "c": {}}, flags=zmq.NOBLOCK)
            done.update(lost=slot.process.node_id, trained=state.trained_steps, sock=sock)
        elif done and "joined" not in done:
            again = [s for s in runner.slots if s.index == 0 and s.incarnation > 0]
            if again and not again[0].process.started():  # waiting: no node has a CPU free
                done["joined"] = local.add_node(num_cpus=1).node_id
        elif "joined" in done:
            tel = runner.telemetry
            refused = tel.source("compressor").get("auth_refused", 0) >= 1
            if refused and tel.source("actor-0.1").get("stepped", 0) > 0:
                runner.stop_requested = True  # drains: everything in flight is trained

    runner = Runner(cfg, cfg.validate(), on_progress=disturb)
    try:
        r = runner.run()
    finally:
        ctx.destroy(linger=0)
    assert "joined" in done, f"the run ended before a node joined: {done}"
    assert not r.get("failure") and r["env_steps"] > done["trained"]
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"] + r["lost_steps"]
    assert r["lost_steps"] >= 0 and r["actor_restarts"] >= 1
    assert r["auth_refused"] >= 1
    assert sum(r["malformed"].values()) == 0  # nothing forged got through
    nodes = r["energy"]["nodes"]
    assert nodes[done["lost"]]["lost"] and nodes[done["lost"]]["actors"] >= 1
    assert nodes[done["joined"]]["actors"] == 1 and not nodes[done["joined"]]["lost"]


def test_each_node_is_described_with_its_cpus_and_a_measured_round_trip():
    from runtime.cluster.latency import node_facts, round_trip_s
    from runtime.cluster.ray_cluster import RayCluster

    cluster = RayCluster(parse_cluster("local:2"))
    try:
        facts = node_facts(cluster)
        live = [n for n in cluster.nodes() if n.cpus]
        trips = [round_trip_s(n.node_id, tries=3) for n in live]
    finally:
        cluster.close()
    assert sorted(f["cpus"] for f in facts) == sorted(n.cpus for n in live) and len(facts) == 2
    assert all(f["here"] and f["rtt_s"] == 0.0 for f in facts)  # this host: no network
    assert {f["name"] for f in facts} == {n.node_id[:12] for n in live}
    assert all(t is not None and 0 < t < 10 for t in trips)  # a no-op task there and back


def test_a_remote_incarnation_that_died_counts_what_it_reported_or_sent_whole():
    """What the run knows of a remote actor's steps: its last report or its whole rollouts at
    the compressor, whichever is higher; at the end, a died incarnation's count is raised to
    its final whole rollouts, and the rest of what it reported is lost."""
    from runtime.actor_pool import Incarnations
    from runtime.cluster.launcher import RemoteStepped

    class Telemetry:
        def __init__(self):
            self.latest = {
                "actor-0.1": {"stepped": 700},
                "compressor": {"complete_steps": {"0:1": 512}},
            }

        def source(self, name):
            return self.latest.get(name, {})

    class Proc:
        final_steps = None

    tel, proc = Telemetry(), Proc()
    stepped = RemoteStepped(tel, proc, 0, 1)
    assert stepped.value == 700  # reported; 188 of them not (yet) whole at the compressor
    tel.latest["compressor"]["complete_steps"]["0:1"] = 768  # sent after its last report
    assert stepped.value == 768
    proc.final_steps = 1024  # a clean exit says exactly
    assert stepped.value == 1024

    ended = Incarnations(stepped={"0:1": 700, "1:0": 300}, died={"0:1"}, clean={"1:0": 300})
    ended.settle({"0:1": 768, "1:0": 300})
    assert ended.stepped == {"0:1": 768, "1:0": 300}
    ended.settle({"0:1": 512})  # never lowered
    assert ended.stepped["0:1"] == 768


def test_reported_nodes_are_checked_field_by_field():
    from autotune.control.status import valid_nodes

    good = [{"node": "ab12", "ip": "10.0.0.5", "cpus": 4, "actors": 3, "stepped": 9, "lost": False}]
    assert valid_nodes(good) == good and valid_nodes(None) is None
    for bad, says in [
        ("x", "allowed a list"),
        ([{**good[0], "extra": 1}], "each node has exactly"),
        ([{**good[0], "cpus": True}], "cpus=True is not a int"),
        ([{**good[0], "actors": -1}], "actors=-1"),
        ([{**good[0], "stepped": 1.5}], "stepped=1.5"),
        ([{**good[0], "ip": "x" * 65}], "is not a str"),
    ]:
        with pytest.raises(ValueError, match=says):
            valid_nodes(bad)


def cluster_cpus_local(n: int) -> int:
    from runtime.cluster import cluster_cpus

    return cluster_cpus(f"local:{n}")[0]
