"""The OpenAI-compatible proxy: ASGI app, relay, admission, auth and metrics."""

from specroute.proxy.app import ProxyApp, create_app
from specroute.proxy.state import ProxyState

__all__ = ["ProxyApp", "ProxyState", "create_app"]
