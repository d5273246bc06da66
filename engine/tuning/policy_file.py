"""Policy files: a named policy plus validated overrides, with where the numbers came from.

``memgate calibrate`` writes one; ``memgate serve``, ``triage``, ``eval`` and ``backfill`` take
it with ``--policy-file PATH``. The format (JSON)::

    {"format": "memgate-policy/1",
     "base": "strict",                      # the named policy the overrides apply to
     "overrides": {"floor": 0.55, "contradiction": 0.9},
     "provenance": {...}}                   # cases sha256, models, date, chosen metrics (shown)

The overrides go through the same validation as per-request overrides
(:meth:`Policy.with_overrides`: unknown names are refused, every value range-checked), and each
value must have its field's type. Any problem is an :class:`~engine.errors.InvalidInput` naming
the file, so the commands exit 2 before they load a model.

On a server the file *redefines* its base policy: requests for that policy get the file's
settings (and their own overrides on top); requests for the other policy are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.errors import InvalidInput
from engine.gate.policy import Policy, policy_by_name

__all__ = [
    "FORMAT",
    "PolicyFile",
    "PolicyFileGate",
    "base_name",
    "dump_policy_file",
    "load_policy_file",
    "resolve_overrides",
]

FORMAT = "memgate-policy/1"
_FIXED = {"name", "mode"}
"""Fields a policy file cannot change: they are what its base policy is."""


def _check_types(base: Policy, overrides: dict[str, Any]) -> None:
    by_name = {f.name: f for f in fields(base)}
    for name, value in overrides.items():
        if name not in by_name or name in _FIXED:
            continue  # with_overrides refuses it with the project's one message
        default = getattr(base, name)
        if default is None:  # optional seconds (the per-kind TTLs)
            ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool))
        elif isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = isinstance(value, type(default))
        if not ok:
            raise InvalidInput(f"override {name} must be a {type(default).__name__}, got {value!r}")


@dataclass(frozen=True)
class PolicyFile:
    """A parsed, validated policy file."""

    base: str
    """``strict`` or ``review``."""
    overrides: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    """How the settings were chosen; recorded and shown, never used to decide."""

    def __post_init__(self) -> None:
        base = policy_by_name(self.base)
        if not isinstance(self.overrides, dict):
            raise InvalidInput("overrides must be a JSON object")
        _check_types(base, self.overrides)
        base.with_overrides(self.overrides)  # unknown names and ranges: InvalidInput

    @property
    def policy(self) -> Policy:
        return policy_by_name(self.base).with_overrides(self.overrides)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "base": self.base,
            "overrides": dict(self.overrides),
            "provenance": self.provenance,
        }

    def describe(self) -> str:
        sets = ", ".join(f"{k}={v}" for k, v in sorted(self.overrides.items())) or "no overrides"
        return f"{self.base} with {sets}"


def load_policy_file(path: str | Path) -> PolicyFile:
    """Read and validate a policy file; every problem is an ``InvalidInput`` naming it."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"policy file {path}: cannot read it ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"policy file {path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"policy file {path}: must be a JSON object")
    if raw.get("format") != FORMAT:
        raise InvalidInput(
            f"policy file {path}: format must be {FORMAT!r}, got {raw.get('format')!r}"
        )
    unknown = set(raw) - {"format", "base", "overrides", "provenance"}
    if unknown:
        raise InvalidInput(f"policy file {path}: unknown key(s) {sorted(unknown)}")
    provenance = raw.get("provenance", {})
    if not isinstance(provenance, dict):
        raise InvalidInput(f"policy file {path}: provenance must be a JSON object")
    try:
        return PolicyFile(str(raw.get("base")), raw.get("overrides", {}), provenance)
    except InvalidInput as exc:
        raise InvalidInput(f"policy file {path}: {exc}") from None


def dump_policy_file(path: str | Path, policy_file: PolicyFile) -> None:
    """Write ``policy_file`` atomically (the old file or the new one, never a torn one)."""
    from engine.backfill.checkpoint import atomic_write

    text = json.dumps(policy_file.to_json(), indent=2, sort_keys=False, allow_nan=False)
    atomic_write(Path(path), text + "\n")


def base_name(name: str | None, policy_file: PolicyFile | None) -> str:
    """The policy a command runs: ``--policy``, else the policy file's base, else strict. A
    file written for one policy is never silently applied to the other."""
    if policy_file is None:
        return name or "strict"
    if name is not None and name != policy_file.base:
        raise InvalidInput(
            f"--policy {name} does not match the policy file, which is for {policy_file.base}"
        )
    return policy_file.base


def resolve_overrides(name: str | None, path: str | Path | None) -> tuple[str, dict[str, Any]]:
    """``--policy NAME`` and/or ``--policy-file PATH`` as (base name, the file's validated
    overrides): what a gate turns into its policy with its models' settings
    (:meth:`engine.gate.gate.Gate.policy`)."""
    pf = load_policy_file(path) if path is not None else None
    return base_name(name, pf), {} if pf is None else dict(pf.overrides)


class PolicyFileGate:
    """A gate whose policy of the file's base name is the file's policy; everything else is the
    wrapped gate's. Handed to the server (or a backfill job) in place of the gate, which asks
    policies by name."""

    def __init__(self, gate: Any, policy_file: PolicyFile) -> None:
        self._gate = gate
        self.policy_file = policy_file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)

    def policy(self, policy: Policy | str, overrides: dict[str, Any] | None = None) -> Policy:
        """The gate's policy, the file's settings under it for the file's base name (what the
        engine core resolves once per request and hands to :meth:`triage` as it is)."""
        if policy == self.policy_file.base:
            overrides = {**self.policy_file.overrides, **(overrides or {})}
        resolved: Policy = self._gate.policy(policy, overrides)
        return resolved

    def triage(
        self,
        facts: Sequence[Any],
        policy: Policy | str = "strict",
        *,
        apply: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> Any:
        if policy == self.policy_file.base:  # the named policy, with the file's overrides
            overrides = {**self.policy_file.overrides, **(overrides or {})}
        return self._gate.triage(facts, policy, apply=apply, overrides=overrides)
