"""Whether a wrap may go on with a study that exists: one made for the same run, or, with
``--resume``, for the same script with other settings, never a study of another kind.

Checked before the wrap writes anything to the study, so a refused run leaves it as it was.
"""

from __future__ import annotations

from typing import Any

from autotune.tuning.knobs import Knob
from autotune.tuning.storage import check_choices


def check_wrap_study(study: Any, made: dict[str, Any], space: list[Knob], resume: bool) -> None:
    """Refuses ``study`` for a wrap that would mix it up:

    * a study of autotune's own runtime (``autotune study`` or ``train --tune``), or one whose
      trials came from anything but a wrap;
    * a wrap study made for another mode, command, knobs or objective than ``made``, naming
      what differs, unless ``resume``;
    * even with ``resume``, another objective (its values would be in other units), or a tuned
      knob whose values differ from those its trials were drawn from: the study's sampler
      cannot change a parameter's choices.

    Raises:
        ValueError: saying what differs and what to do instead.
    """
    name = study.study_name
    before = study.user_attrs.get("wrap")
    meta = study.user_attrs.get("autotune")
    if isinstance(meta, dict) and meta.get("kind") == "script":
        raise ValueError(
            f"study {name!r} was made by 'autotune study -- CMD' (its trials and defaults are "
            "that command's); go on with it there, or give the wrap another --study name"
        )
    if "autotune" in study.user_attrs or (study.trials and not isinstance(before, dict)):
        raise ValueError(
            f"study {name!r} holds runs of autotune's own runtime, not of a wrapped script; "
            "give the wrap another --study name"
        )
    if not isinstance(before, dict):
        return
    changed = [k for k in made if before.get(k) != made[k]]
    if "objective" in changed and before.get("objective") is not None:
        raise ValueError(
            f"study {name!r} holds {before['objective']} values and this run's objective is "
            f"{made['objective']}: their values would sit side by side in other units, even "
            "with --resume; give --objective "
            f"{before['objective']} to go on with it, or a new --study name"
        )
    if changed and not resume:
        diff = "; ".join(f"{k}: {before.get(k)!r} then, {made[k]!r} now" for k in changed)
        raise ValueError(
            f"study {name!r} was made for another run ({diff}); give --resume to go "
            "on with it, or a new --study name"
        )
    check_choices(study, {k.name: k.choices for k in space})
