"""What the claim checks read: :class:`Results`, plain numbers per seed, and its JSON form.

The claims stage gathers a run's :class:`Results` from the other stages' outputs and writes them
as JSON beside the verdicts; a kept evidence record holds that JSON, so that the checks of any
later commit can judge the record again (:func:`results_from_json`). A field the record does not
have (it was kept before the field existed) is named in ``missing``: the checks that read it say
so instead of judging an empty result.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from learnable_sparsity.errors import LearnableSparsityError

Curve = list[tuple[float, float]]
# The version of the JSON form: a change of a field's meaning (not a new field) bumps it.
RESULTS_FORMAT = 1


@dataclass(frozen=True)
class Results:
    """Everything the checks read, per seed (lists are over seeds, in seed order).

    NMT: ``bleu``: corpus → variant → BLEU; ``valid_nll``: corpus → variant → validation NLL curves
    (step, nll) of the seeds; ``target_tokens``: corpus → variant → the target tokens each seed
    trained (the length the papers' numbers are comparable in); ``speed``: variant → ``train`` /
    ``inference`` → the ratio to softmax's tokens/s in each round; ``js``: variant → block → mean JS
    between the block's heads (None where the block has fewer than two heads); ``roles``: variant →
    role → number of heads with the role (None where the corpus cannot show it);
    ``role_confidence``: variant → role → the confidence of the variant's strongest head for the
    role (None: not measurable); ``density``: variant → {"heads": every head's mean attention
    density, "within_length_sd": every head's density spread between inputs of one length (None:
    undefined)}; ``final_alphas``: attention type → the learned α of every head, layer and seed;
    ``alpha_trajectories``: per seed, (step, every head's α) as training logged them.

    Latent variables: ``lvm``: experiment → method → the test metrics; ``lvm_curves`` and
    ``lvm_calls``: experiment → method → training-loss and decoder-calls curves.

    APE: ``ape``: "<regime>/<system>" → split → TER of each seed; ``ape_do_nothing``: split →
    TER of the MT output itself; ``ape_bleu`` and ``ape_do_nothing_bleu``: the same in
    tokenized BLEU; ``ape_valid_nll``: "<regime>/<system>" → validation NLL curves.

    ``missing``: result → why it is absent.
    """

    bleu: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    valid_nll: dict[str, dict[str, list[Curve]]] = field(default_factory=dict)
    target_tokens: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    speed: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    js: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    roles: dict[str, dict[str, list[int | None]]] = field(default_factory=dict)
    role_confidence: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    density: dict[str, list[dict[str, list[float | None]]]] = field(default_factory=dict)
    final_alphas: dict[str, list[float]] = field(default_factory=dict)
    alpha_trajectories: list[list[tuple[float, list[float]]]] = field(default_factory=list)
    lvm: dict[str, dict[str, list[dict[str, float]]]] = field(default_factory=dict)
    lvm_curves: dict[str, dict[str, list[Curve]]] = field(default_factory=dict)
    lvm_calls: dict[str, dict[str, list[Curve]]] = field(default_factory=dict)
    ape: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    ape_do_nothing: dict[str, float] = field(default_factory=dict)
    ape_bleu: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    ape_do_nothing_bleu: dict[str, float] = field(default_factory=dict)
    ape_valid_nll: dict[str, list[Curve]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


FIELDS = tuple(f.name for f in dataclasses.fields(Results) if f.name != "missing")


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity: a non-finite number (a diverged run's) becomes None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(item) for item in value]
    return value


def results_to_json(results: Results) -> dict[str, Any]:
    """The JSON form of ``results``: its fields as they are (tuples as lists, NaN as null) and
    the format version."""
    return {"format": RESULTS_FORMAT, **_finite_or_none(dataclasses.asdict(results))}


def results_from_json(data: dict[str, Any], source: str) -> Results:
    """:class:`Results` from :func:`results_to_json`'s form, read from ``source`` (named in
    errors). Fields the data lack are named in ``missing``; unknown fields and another format
    version are refused."""
    if data.get("format") != RESULTS_FORMAT:
        raise LearnableSparsityError(
            f"{source}: results format {data.get('format')!r}, this code reads {RESULTS_FORMAT}"
        )
    unknown = sorted(set(data) - {"format", "missing", *FIELDS})
    if unknown:
        raise LearnableSparsityError(f"{source}: unknown result fields {unknown}")
    absent = {name: f"not in {source} (kept before it was recorded)" for name in FIELDS}
    present = {name: data[name] for name in FIELDS if name in data}
    missing = {
        **{name: why for name, why in absent.items() if name not in present},
        **data.get("missing", {}),
    }
    return Results(**present, missing=missing)
