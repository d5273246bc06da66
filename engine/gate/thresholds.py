"""Thresholds that belong to one model, kept with its name: a probability bar means something
only for the model that produced it. A named policy takes the served models' bars when listed
here, the :class:`~engine.gate.policy.Policy` defaults otherwise; a :class:`Policy` object and
per-request overrides always win.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from engine.gate.policy import Policy

__all__ = [
    "EMBEDDER_THRESHOLDS",
    "MODEL_THRESHOLDS",
    "ModelThresholds",
    "for_embedder",
    "for_model",
]


@dataclass(frozen=True)
class ModelThresholds:
    """One NLI model's values of the :class:`Policy` fields of the same names."""

    contradiction: float
    dated_contradiction: float
    duplicate_max_contradiction: float


MODEL_THRESHOLDS: dict[str, ModelThresholds] = {
    # Chosen on dev + heldout with this model (the figures the seed's policy was tuned with).
    "aegis-nli": ModelThresholds(0.95, 0.80, 0.50),
}
"""NLI artefact name (its manifest's ``name``) -> its thresholds. A model not listed runs with
the policy defaults: calibrate it on labelled cases before trusting them."""


def for_model(policy: Policy, model: str | None) -> Policy:
    """``policy`` with ``model``'s thresholds, when the table has them."""
    found = MODEL_THRESHOLDS.get(model or "")
    return policy if found is None else replace(policy, **asdict(found))


EMBEDDER_THRESHOLDS: dict[str, float] = {
    # 5-fold cross-validation over dev + heldout (grid 0-0.5 by 0.1): see policy.py.
    "minilm": 0.10,
}
"""Embedder artefact name -> the frame similarity that counts as one attribute
(``Policy.attribute_similarity``); a cosine means something only for the model that made it."""


def for_embedder(policy: Policy, model: str | None) -> Policy:
    """``policy`` with ``model``'s attribute-identity bar, when the table has it."""
    found = EMBEDDER_THRESHOLDS.get(model or "")
    return policy if found is None else replace(policy, attribute_similarity=found)
