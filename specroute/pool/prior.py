"""The pool's prior: a profile file (`specroute tune`, `specroute bench profile`; the format is
`specroute.profile_format`) read at start-up into the estimators, so the first requests route
with the fitted iteration times and acceptance instead of the built-in defaults."""

from __future__ import annotations

from pathlib import Path

import msgspec

from specroute.errors import ConfigError
from specroute.pool.telemetry import IterationCurve, IterationPrior, Telemetry
from specroute.profile_format import SCHEMA, ProfileFormatError, decode_profile, depth_curves
from specroute.speculation import PRIOR_ALPHA

__all__ = [
    "PRIOR_VERIFIES",
    "PROFILE_SCHEMA",
    "Prior",
    "load_prior",
    "load_profile_priors",
    "prior_from_profile",
    "priors_from_profile",
]

PROFILE_SCHEMA = SCHEMA
PRIOR_VERIFIES = 200.0
"""Verifies a prior's accept length counts as: a few requests' worth, so live traffic unlike
the profiled traffic takes over within seconds."""


class Prior(msgspec.Struct, frozen=True, kw_only=True):
    """What the pool takes from a profile: per depth T(b, k) (the line, and the measured
    points it was fitted to) and R(k), per sampling bucket the accept length per depth and
    alpha, and the model names its classes are keyed by."""

    source: str = ""
    iteration: dict[int, IterationPrior] = {}
    curves: dict[int, IterationCurve] = {}
    capacity: dict[int, int] = {}
    accept_length: dict[str, dict[int, float]] = {}
    alpha: dict[str, float] = {}
    models: tuple[str, ...] = ()

    def telemetry(self) -> Telemetry:
        """Estimators that start from this prior. Classes are the proxy's `model:bucket`, each
        accept length worth PRIOR_VERIFIES verifies; a class it has no figure for (another
        model name, a client's own class) starts at the sampled alpha, SGLang's default being
        sampling."""
        telemetry = Telemetry(prior_alpha=self.alpha.get("sampled", PRIOR_ALPHA))
        telemetry.seed(self.iteration.items(), self.curves.items())
        for model in self.models:
            for bucket, lengths in self.accept_length.items():
                for steps, length in sorted(lengths.items()):
                    telemetry.acceptance.observe(
                        f"{model}:{bucket}",
                        steps=steps,
                        accept_length=length,
                        verifies=PRIOR_VERIFIES,
                    )
        return telemetry


def prior_from_profile(data: bytes, *, source: str = "") -> Prior:
    """The prior in a profile's JSON; ProfileFormatError if it is not version 2."""
    profile = decode_profile(data, source=source)
    models = {t.model for t in profile.targets if t.model} | set(profile.models)
    return Prior(
        source=source,
        iteration={d.steps: (d.intercept_s, d.per_token_s) for d in profile.depths},
        curves=depth_curves(profile.targets),
        capacity={
            d.steps: d.max_running_requests for d in profile.depths if d.max_running_requests
        },
        accept_length={b: dict(f.accept_length) for b, f in profile.acceptance.items()},
        alpha={b: f.alpha for b, f in profile.acceptance.items()},
        models=tuple(sorted(models)),
    )


def load_prior(path: str | Path) -> Prior:
    """The prior in the file at `path`; ConfigError (exit status 2 at start-up) naming the file
    when it cannot be read or is not a profile this version reads."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read prior file {str(path)!r}: {exc.strerror}") from exc
    try:
        return prior_from_profile(data, source=str(path))
    except ProfileFormatError as exc:
        raise ConfigError(f"invalid prior: {exc}") from exc


def priors_from_profile(data: bytes) -> dict[int, IterationPrior]:
    """Iteration-time priors per depth from a profile's JSON."""
    return prior_from_profile(data).iteration


def load_profile_priors(path: str | Path) -> dict[int, IterationPrior]:
    return load_prior(path).iteration
