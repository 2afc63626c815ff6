"""An SGLang-compatible server whose GPU is a calibrated model of speculative decoding.

The HTTP app is `specroute.emulator.server.create_app(EmulatorOptions(...))` (imported on
demand: it pulls in Litestar); `specroute emulate` runs it.
"""

from specroute.emulator.engine import Emission, Engine, Iteration, Req
from specroute.emulator.options import EmulatorOptions
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
    "EmulatorOptions",
    "Engine",
    "Iteration",
    "Profile",
    "Req",
    "get_profile",
    "sampling_class",
]
