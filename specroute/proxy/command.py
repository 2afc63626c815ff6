"""`specroute serve`: run the proxy in front of a pool of SGLang servers."""

from __future__ import annotations

import argparse
import os
import sys

from specroute.children import is_socket
from specroute.cmdline import Subcommands
from specroute.config import Config, load_config, parse_backend
from specroute.errors import ConfigError
from specroute.exposure import keyless_proxy_warning
from specroute.logs import configure_logging
from specroute.policies import UnknownPolicyError, create

__all__ = ["register"]


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "serve",
        description=(
            "Serve an OpenAI-compatible API that routes each request across SGLang backends. "
            "Settings come from --config (TOML), then SPECROUTE_* environment variables "
            "(nested fields with __, e.g. SPECROUTE_TIMEOUTS__IDLE_S), then these flags."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--backend",
        action="append",
        metavar="[NAME=]URL",
        help="backend base URL, optionally named for headers, logs and metrics (repeatable)",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8000)")
    parser.add_argument(
        "--fd",
        type=int,
        metavar="N",
        help="listen on inherited socket N, bound by the parent (a supervisor or a test)",
    )
    parser.add_argument(
        "--policy", metavar="NAME", help="routing policy (default throughput; `specroute policies`)"
    )
    parser.add_argument(
        "--api-key", action="append", metavar="KEY", help="accepted client key (repeatable)"
    )
    parser.add_argument("--admin-key", metavar="KEY", help="key for PUT /policy")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--request-log-share", type=float, metavar="SHARE",
        help="share of successful requests logged as request_finished, 0 to 1 (failures always)",
    )  # fmt: skip
    parser.add_argument(
        "--prior", metavar="FILE", help="profile to start routing from (from `specroute tune`)"
    )
    parser.set_defaults(run=run)


def build_config(args: argparse.Namespace) -> Config:
    """Merge file, environment and flags; raise ConfigError naming the bad field."""
    overrides = {
        "backends": [parse_backend(given) for given in args.backend] if args.backend else None,
        "host": args.host,
        "port": args.port,
        "policy": args.policy,
        "api_keys": args.api_key,
        "admin_key": args.admin_key,
        "log_level": args.log_level,
        "request_log_share": args.request_log_share,
        "prior": {"path": args.prior} if args.prior else None,
    }
    config = load_config(args.config, environ=os.environ, overrides=overrides)
    if not config.backends:
        raise ConfigError(
            "invalid configuration: no backends - at `$.backends` (use --backend URL)"
        )
    try:
        create(config.policy)  # a name, or `name:key=value,...` with the policy's options
    except UnknownPolicyError as exc:
        raise ConfigError(f"invalid configuration: {exc} - at `$.policy`") from exc
    if config.prior.path is not None:
        from specroute.pool.prior import load_prior

        load_prior(config.prior.path)  # a bad file stops the start here, with its reason
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
    except (ConfigError, UnknownPolicyError) as exc:
        print(f"specroute serve: {exc}", file=sys.stderr)
        return 2
    if args.fd is not None and not is_socket(args.fd):
        print(f"specroute serve: --fd {args.fd} is not a socket this process inherited",
              file=sys.stderr)  # fmt: skip
        return 2
    from specroute.proxy.app import create_app  # keeps `--help` fast
    from specroute.proxy.server import serve

    if (keyless := keyless_proxy_warning(config.host, config.api_keys)) is not None:
        print(keyless, file=sys.stderr)
    configure_logging(config.log_level)
    serve(create_app(config), config, fd=args.fd)
    return 0
