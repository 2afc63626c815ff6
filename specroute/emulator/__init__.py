"""An SGLang-compatible server whose GPU is a calibrated model of speculative decoding."""

from specroute.emulator.engine import Emission, Engine, Iteration, Sequence
from specroute.emulator.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    Profile,
    get_profile,
    sampling_class,
)

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "Emission",
    "Engine",
    "Iteration",
    "Profile",
    "Sequence",
    "get_profile",
    "sampling_class",
]
