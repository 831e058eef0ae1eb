"""A job's machine model (``autotune.tuning.perf_model.MachineModel``) as its registration
sends it: checked field by field, and its rate tried once, before the daemon sizes any budget
with it (``claims.share_of``). A model that fails later would stop the share-out of every job."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from autotune.control.allocator import MIN_GMI_PCT
from autotune.tuning.perf_model import MachineModel
from runtime.learner_probe import GROUP_LEARNER

DEVICES = ("cpu", "cuda", GROUP_LEARNER)
"""The devices a learner's model is given for (a GPU machine's probes give all three)."""
NODE_FIELDS = {"name": str, "cpus": float, "here": bool, "rtt_s": float}
"""A Ray node's fields in a model's ``nodes`` (``node_model.NodeModel``), by type."""


def _number(value: Any) -> bool:
    """Whether ``value`` is a finite real number >= 0 (not a bool, a string or None)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return real and math.isfinite(value) and value >= 0


def _count(value: Any) -> bool:
    """Whether ``value`` is an integer >= 1 (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _field_problem(name: str, kind: str, value: Any) -> str | None:
    """What is wrong with the model field ``name`` (annotated ``kind``), or None."""
    if name == "learner":
        pairs = isinstance(value, dict) and bool(value) and set(value) <= set(DEVICES)
        pairs = pairs and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(map(_number, p))
            for p in value.values()
        )
        return None if pairs else f"a map of {' or '.join(DEVICES)} to two finite numbers >= 0"
    if name == "nodes":
        ok = isinstance(value, list | tuple) and all(
            isinstance(n, dict)
            and all(k in n for k in NODE_FIELDS)
            and all(
                _number(n[k]) if t is float else isinstance(n[k], t) for k, t in NODE_FIELDS.items()
            )
            for n in value
        )
        return None if ok else f"a list of maps of {', '.join(NODE_FIELDS)}"
    if kind == "int":
        return None if _count(value) else "an integer >= 1"
    return None if _number(value) else "a finite number >= 0"


def checked_model(doc: Any, gpus: int, total_cores: int, minibatches: int) -> MachineModel:
    """The ``MachineModel`` in a registration's ``machine`` field, its rate tried once on the
    least budget (a core of ``total_cores``, a GMI's least share of its GPU where ``gpus``):
    the quickest to size, and a model that sizes no budget fails there as anywhere.

    Raises:
        ValueError: a field missing, unknown or malformed (named, with what is allowed), or a
            rate that fails.
    """
    from autotune.control.rates import model_rate, rate_problem
    from autotune.tuning.model_inputs import machine_from_doc

    if not isinstance(doc, dict):
        raise ValueError(f"a machine model is a map of its fields; got {type(doc).__name__}")
    kinds = {f.name: str(f.type) for f in dataclasses.fields(MachineModel)}
    unknown = sorted(str(k) for k in set(doc) - set(kinds))
    if unknown:
        raise ValueError(f"machine model: unknown fields {unknown}; allowed: {sorted(kinds)}")
    for name, value in doc.items():
        allowed = _field_problem(name, kinds[name], value)
        if allowed is not None:
            raise ValueError(f"machine model: {name}={value!r:.80}; allowed: {allowed}")
    model = machine_from_doc(doc)  # a required field missing: ValueError
    try:
        value = model_rate(model, gpus, total_cores, minibatches)(1, MIN_GMI_PCT * gpus)
        why = rate_problem(value)
    except Exception as exc:  # what a malformed model makes the sizing raise
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        raise ValueError(f"machine model: its rate on this machine fails ({why})")
    return model
