"""An SGLang-compatible (or, with `engine="vllm"`, vLLM-compatible) server whose GPU is a
calibrated model of speculative decoding.

The HTTP app is `specroute.emulator.server.create_app(EmulatorOptions(...))`, or
`specroute.emulator.vllm_server.build_vllm(...)` for vLLM's dialect (imported on demand: they
pull in Litestar); `specroute emulate` runs them.
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
from specroute.emulator.vllm_schedule import DynamicSchedule

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "DynamicSchedule",
    "Emission",
    "EmulatorOptions",
    "Engine",
    "Iteration",
    "Profile",
    "Req",
    "get_profile",
    "sampling_class",
]
