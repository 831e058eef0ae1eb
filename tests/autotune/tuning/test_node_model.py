"""Actors on a Ray cluster's nodes in the throughput model (``autotune.tuning.node_model``):
placement as the launcher places, each node's rate at its own cores and round trip, the nodes'
speeds fitted from windows, and sizing across the nodes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import mujoco_like_model

from autotune.tuning.counters import Counters, measure
from autotune.tuning.node_model import NodeModel, place
from autotune.tuning.perf_model import MachineModel, Window, evaluate, features, fit, prior_params
from autotune.tuning.sizing import fits_cores, size_run

CFG = {
    "envs_per_actor": 16,
    "batch_size": 8192,
    "trainer_device": "cuda",
    "trainers": 1,
    "mps_pct": 50,
    "trainer_threads": 1,
}


def machine(cores: int = 16, nodes: tuple[NodeModel, ...] = ()) -> MachineModel:
    return dataclasses.replace(mujoco_like_model(), cores=cores, nodes=nodes)


def configs(*actors: int) -> dict[str, np.ndarray]:
    return features([{**CFG, "actors": a} for a in actors], {})


def test_actors_fill_the_nodes_from_the_most_free_down_and_never_past_their_cpus():
    cpus = np.array([8.0, 4.0, 2.0])
    got = place(np.array([1.0, 4.0, 6.0, 11.0, 14.0, 30.0]), cpus)
    assert got.sum(axis=1) == pytest.approx([1, 4, 6, 11, 14, 14])  # 30 wanted, 14 CPUs
    assert (got <= cpus + 1e-9).all()
    assert got[1] == pytest.approx([4, 0, 0])  # the biggest node first, down to 4 free
    free = cpus - got[3]  # 11 placed: every node used keeps the same CPUs free
    assert free[got[3] > 0] == pytest.approx([1.0] * int((got[3] > 0).sum()))


def test_nodes_on_this_host_with_no_round_trip_predict_what_local_actors_do():
    here = (NodeModel("a", 8, True), NodeModel("b", 8, True))
    x = configs(2, 8, 15)
    flat = evaluate(machine(), prior_params(machine()), x)
    nodes = evaluate(machine(nodes=here), prior_params(machine()), x)
    for name in ("steps_per_s", "sample_rate", "cpu_w", "gpu_w", "lag"):
        assert getattr(nodes, name) == pytest.approx(getattr(flat, name), rel=1e-6), name
    assert nodes.node_sample.sum(axis=1) == pytest.approx(nodes.steps_per_s, rel=1e-6)


def test_a_node_on_another_host_adds_cores_and_its_round_trip_costs_rate_and_adds_lag():
    head = NodeModel("head", 4, True)
    near, far = NodeModel("away", 16, False), NodeModel("away", 16, False, rtt_s=0.05)
    x = configs(20)
    m_near, m_far = machine(4, (head, near)), machine(4, (head, far))
    p = prior_params(m_near)
    alone = evaluate(machine(4, (head,)), p, configs(20))  # 4 of the 20 run, on the head
    with_near, with_far = evaluate(m_near, p, x), evaluate(m_far, p, x)
    assert with_near.sample_rate[0] > 3 * alone.sample_rate[0]  # 20 actors run, not 4
    assert with_far.node_sample[0, 1] < with_near.node_sample[0, 1]  # latency costs rate
    share = [w.node_sample[0, 1] / w.node_sample[0].sum() for w in (with_near, with_far)]
    assert share[1] < share[0]  # of what is trained, less comes from the far node
    assert with_far.lag[0] > with_near.lag[0]  # steps on the wire
    assert with_near.cpu_w[0] > alone.cpu_w[0]  # the other host's busy cores count


def test_a_slow_node_is_found_from_the_windows_per_node_rates():
    nodes = (NodeModel("fast", 8, False), NodeModel("slow", 8, False))
    m = machine(4, nodes)
    windows = []
    for actors in (8, 12, 16):
        pred = evaluate(m, prior_params(m), configs(actors))
        per = pred.node_sample[0].copy()
        per[1] *= 0.5  # the slow node's actors sample half what the model says
        windows.append(
            Window(
                {**CFG, "actors": actors},
                float(per.sum()),
                float(pred.gpu_w[0]),
                float(pred.cpu_w[0]),
                float(pred.lag[0]),
                {"fast": float(per[0]), "slow": float(per[1])},
            )
        )
    params, _ = fit(m, windows, {})
    assert params.node_speed["slow"] < 0.8 < params.node_speed["fast"]
    fitted = evaluate(m, params, configs(16)).node_sample[0]
    assert fitted[1] / fitted.sum() < 0.45  # the slow node's share moves toward its third
    unseen = fit(m, windows[:0], {})[0]
    assert unseen.node_speed == {}  # no window: every node at the probe's speed


def test_sizing_spreads_actors_over_the_nodes_and_keeps_the_head_free_for_the_trainer():
    head, away = NodeModel("head", 4, True), NodeModel("away", 16, False)
    m = machine(4, (head, away))
    assert m.actor_cpus() == 20
    s = size_run(m, 1, {"trainer_device": "cpu", "trainers": 1, "trainer_threads": 2}, 4)
    assert s.values["actors"] > 4  # the other host's CPUs are used
    fits = fits_cores(m, configs(4, 19, 20, 21))
    assert list(fits) == [True, True, True, False]  # 21 actors: more than the nodes offer
    packed = machine(4, (head, NodeModel("away", 2, False)))
    x = features([{**CFG, "actors": 6, "trainer_device": "cpu", "trainer_threads": 2}], {})
    assert not fits_cores(packed, x)[0]  # 4 on the head beside 2 trainer threads


def test_a_window_measures_each_nodes_rate_and_bad_node_counts_are_refused():
    a = Counters(0.0, 0, 0.0, 0.0, 0.0, node_steps={"n1": 100, "n2": 0})
    b = dataclasses.replace(a, t_s=2.0, trained_steps=900, node_steps={"n1": 700, "n2": 400})
    assert measure(a, b).node_rates == {"n1": 300.0, "n2": 200.0}
    assert measure(dataclasses.replace(a, node_steps=None), b).node_rates is None
    assert Counters.from_wire(b.to_wire()) == b
    for bad in ({"n1": -1}, {"n1": 1.5}, {"n1": True}, [1]):
        with pytest.raises(ValueError, match="node_steps"):
            Counters.from_wire({**b.to_wire(), "node_steps": bad})
