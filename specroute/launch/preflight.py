"""What stops a launch before anything starts: a server that cannot possibly start (its module
missing from its interpreter, its model path absent), an address another process already
answers on, and, with `--emulate`, what a real pool would refuse (GPU count, flags, SGLang's
resolver) and what the emulated one leaves out."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from specroute.launch.argv import LaunchOptions, LaunchPlan, build_plan

__all__ = ["answered_by_another", "cannot_start", "emulation_notes", "ports_taken", "real_plan"]

_PATH_FLAGS = ("--model-path", "--speculative-draft-model-path")


def _importable(python: str, module: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec(module) is not None
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        run = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


def _value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return None


def cannot_start(argv: Sequence[str]) -> list[str]:
    """Why the command `argv` cannot start, found without starting it: `python -m MODULE` whose
    package that interpreter lacks, a local `--model-path` (or draft) that does not exist. A
    name that is not a local path (a Hugging Face id) is left to the server."""
    problems = []
    if len(argv) >= 3 and argv[1] == "-m":
        package = argv[2].split(".")[0]
        if not _importable(argv[0], package):
            extra = " (pip install 'specroute[sglang]')" if package == "sglang" else ""
            problems.append(f"No module named '{package}' in {argv[0]}{extra}")
    for flag in _PATH_FLAGS:
        path = _value(argv, flag)
        if (
            path
            and path.startswith(("/", "./", "../", "~"))
            and not Path(path).expanduser().exists()
        ):
            problems.append(f"{flag} {path} does not exist")
    return problems


def _answers(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _address(url: str) -> tuple[str, int]:
    address = urlsplit(url)
    return address.hostname or "127.0.0.1", address.port or 80


def answered_by_another(url: str, flag: str) -> str | None:
    """Why a child about to start on `url` must not, when a process already listens there:
    it could not bind, and its readiness would be read from that process's answers. The
    launch checks every address before anything starts (`ports_taken`); this is asked again
    just before each child binds, which may be minutes later (the proxy starts once every
    server has loaded, a restarted server once the old one has drained)."""
    host, port = _address(url)
    if not _answers(host, port):
        return None
    return f"{url} already answers (another process listens on port {port}); stop it or pick {flag}"


def ports_taken(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(child, problem) for each child whose address is another's in the plan, or where a
    process already listens: the child could not bind it, and launch would take that other
    process's answers for its own (a proxy whose port an SGLang server held looked ready at
    once, and its clients' requests went to that server)."""
    children = [*plan.servers, plan.proxy]
    flags = {plan.proxy.name: "--port"}
    seen: dict[tuple[str, int], str] = {}
    problems = []
    for child in children:
        host, port = _address(child.url)
        flag = flags.get(child.name, "--base-port")
        if (host, port) in seen:
            problems.append((child.name, f"port {port} is {seen[host, port]}'s too; pick {flag}"))
        elif taken := answered_by_another(child.url, flag):
            problems.append((child.name, taken))
        seen[host, port] = child.name
    return problems


def real_plan(options: LaunchOptions) -> LaunchPlan:
    """The pool `--emulate` stands in for, planned as a real one: PlanError where a real launch
    would refuse (a draft model missing, fewer `--gpus` than servers x `--tp`). Without `--gpus`
    the GPU count is not checked: the machine that will run it is not this one."""
    real = msgspec.structs.replace(options, emulate=False)
    need = len(options.steps) * options.tp
    return build_plan(real, options.gpus if options.gpus is not None else tuple(range(need)))


def emulation_notes(options: LaunchOptions) -> list[str]:
    """What the emulated pool leaves out of what was asked, one line each."""
    notes = []
    if options.sglang_args or options.sglang_args_by_depth:
        notes.append("--sglang-arg is not passed to emulated servers (SGLang's resolver checks it "
                     "where sglang is installed)")  # fmt: skip
    if options.draft_model:
        notes.append("--draft-model is not loaded: the profile's acceptance stands in for it")
    if options.tp > 1:
        notes.append(f"--tp {options.tp} is not emulated: each emulated server is one engine")
    if options.gpus is not None:
        notes.append("--gpus is checked against servers x --tp, and no GPU is used")
    return notes
