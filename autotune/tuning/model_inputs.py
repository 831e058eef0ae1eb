"""What the model sampler (``autotune.tuning.model_sampler``) reads besides a study's windows:
the machine model of a run's sizing, as the result document and a daemon registration carry it,
and each candidate's statistical efficiency at the newest gradient noise scale measured (the
goodput objective's factor)."""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.tuning.node_model import NodeModel
from autotune.tuning.perf_model import MachineModel


def machine_from_doc(doc: dict[str, Any]) -> MachineModel:
    """A ``MachineModel`` from its plain-data form (the ``sizing`` section's ``model``).

    Raises:
        ValueError: a malformed document.
    """
    try:
        fields = dict(doc)
        fields["learner"] = {d: (float(a), float(b)) for d, (a, b) in doc["learner"].items()}
        fields["nodes"] = tuple(NodeModel.from_doc(n) for n in doc.get("nodes", ()))
        return MachineModel(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed machine model: {exc}") from None


def newest_noise_scale(study: optuna.Study) -> float | None:
    """The gradient noise scale the newest finished window reported (None: none did)."""
    for t in reversed(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))):
        noise = t.user_attrs.get("noise_scale")
        if noise and noise > 0:
            return float(noise)
    return None


def update_samples(values: dict[str, Any]) -> int | None:
    """The samples one learner update of knob ``values`` trains: ``batch_size`` for each of its
    ``trainers`` GMIs, which train in lockstep with their gradients averaged (per GPU: a job on
    several GPUs has that many times more); None without a batch size."""
    batch = values.get("batch_size")
    return int(batch) * int(values.get("trainers") or 1) if batch else None


def goodput_factor(
    study: optuna.Study, cands: list[dict[str, Any]], defaults: dict[str, Any]
) -> np.ndarray:
    """Each candidate's statistical efficiency (``policies.noise_scale.efficiency``) at the
    newest measured noise scale, for the samples an update of it trains (``update_samples``: a
    learner update is the step the noise scale is weighed against). Ones where nothing says
    (no noise scale measured yet, or no batch size): every candidate alike."""
    from policies.noise_scale import efficiency

    noise = newest_noise_scale(study)
    sizes = [update_samples({**defaults, **c}) for c in cands]
    if noise is None or not all(sizes):
        return np.ones(len(cands))
    return np.array([efficiency(noise, size) or 0.0 for size in sizes])
