"""The model-guided tuner on the simulated job (``bench.tuner_sim``): it reaches 95 % of the
surface's optimum within 20 windows in at least 9 of 10 seeds; TPE's counts on the same seeds
are reported by ``python -m bench.tuner_sim``."""

from __future__ import annotations

import json

from bench import tuner_sim


def test_the_model_tuner_reaches_95_percent_of_the_optimum_in_20_windows(tmp_path):
    doc = tuner_sim.run(seeds=10, windows=20, samplers=("model",))
    reached = [w for w in doc["samplers"]["model"]["windows_to_95"] if w is not None]
    assert len(reached) >= 9, doc["samplers"]["model"]


def test_the_script_writes_both_samplers_figures(tmp_path):
    out = tmp_path / "sim.json"
    assert tuner_sim.main(["--json", str(out), "--seeds", "1", "--windows", "3"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["samplers"]) == {"model", "tpe"} and doc["optimum"] > 0
    for r in doc["samplers"].values():
        assert len(r["windows_to_95"]) == 1 and len(r["regret"]) == 1


def test_the_model_sampler_moves_inside_a_trust_region_around_its_incumbent():
    """With nothing measured, the model's uncertainty is equal everywhere and the best guess
    is a far jump (here an 8x batch); the trust region keeps a plan within 4x of the incumbent
    in each knob and changes at most two knobs besides the actor count."""
    import optuna

    from autotune.tuning.model_sampler import ModelSampler
    from autotune.tuning.sizing import size_run

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = tuner_sim.build_space(tuner_sim.Machine(16, 1), tuner_sim.SPACE)
    online = {k.name: k for k in space.values() if k.online}
    fixed = {k.name: k.choices[0] for k in space.values() if not k.online}
    sized = size_run(tuner_sim.PROBED, 1, fixed, 4).values
    defaults = {**fixed, **{n: sized.get(n, k.choices[0]) for n, k in online.items()}}
    args = (
        tuner_sim.PROBED,
        {k.name: k.choices for k in online.values()},
        defaults,
        {k.name: k.apply for k in online.values()},
    )
    plans = {}
    for name, trust in (("free", (99, 1e9)), ("trusted", (2, 4.0))):
        s = ModelSampler(*args, seed=0, trust_knobs=trust[0], trust_factor=trust[1])
        plans[name] = s.plan(optuna.create_study(direction="maximize", sampler=s))
    assert plans["free"]["batch_size"] >= 8 * defaults["batch_size"]
    moved = {k: v for k, v in plans["trusted"].items() if v != defaults.get(k) and k != "actors"}
    assert moved and len(moved) <= 2
    for k, v in moved.items():
        if isinstance(v, int) and defaults.get(k):
            assert max(v / defaults[k], defaults[k] / v) <= 4


def test_a_cuda_trainers_thread_count_is_never_tuned():
    """A CUDA trainer's threads enter no rate, and changing them hands the GMIs over: planning
    on the simulated job with the trainer on CUDA, the model sampler keeps the start's count
    in every plan, and sees configs that differ only in it as one (their identity, their
    distance to what was measured)."""
    import optuna

    from autotune.tuning.model_sampler import ModelSampler
    from autotune.tuning.perf_model import features

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    choices = {
        "actors": (8, 12, 14, 15),
        "envs_per_actor": (8, 16, 32),
        "batch_size": (4096, 8192, 16384, 32768),
        "trainer_device": ("cuda",),
        "mps_pct": (25, 50, 100),
        "trainer_threads": (1, 2, 4),
    }
    start = {"actors": 14, "envs_per_actor": 16, "batch_size": 8192, "trainer_device": "cuda"}
    start |= {"mps_pct": 50, "trainer_threads": 1, "trainers": 1, "rollout_len": 32}
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    for seed in range(3):
        s = ModelSampler(tuner_sim.PROBED, choices, start, {}, seed=seed)
        study = optuna.create_study(direction="maximize", sampler=s)
        values = dict(start)
        for _ in range(8):
            sps, gpu_w, cpu_w, lag = tuner_sim.true_rates(values)
            attrs = {"steps_per_s": sps, "window_s": 10.0, "gpu_j": 10 * gpu_w}
            attrs |= {"cpu_j": 10 * cpu_w, "policy_lag": lag}
            params = {k: values[k] for k in choices}
            study.add_trial(
                optuna.trial.create_trial(
                    params=params,
                    distributions=dists,
                    value=sps / (gpu_w + cpu_w),
                    user_attrs=attrs,
                )
            )
            values = {**start, **s.plan(study)}
            assert values["trainer_threads"] == 1, (seed, values)
    one, two = ({**start, "trainer_threads": h} for h in (1, 2))
    x = features([one, two, {**one, "trainer_device": "cpu"}, {**two, "trainer_device": "cpu"}], {})
    assert list(x["threads"]) == [1.0, 1.0, 1.0, 2.0]
    s = ModelSampler(tuner_sim.PROBED, {"trainer_threads": (1, 2)}, one, {})
    assert s._key(one) == s._key(two) != s._key({**two, "trainer_device": "cpu"})
