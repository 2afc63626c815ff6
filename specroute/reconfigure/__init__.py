"""Depth follows load: the one depth loop. Read the proxy's `/pool` (`readings`), ask the pure
planner what to run (`specroute.planner`), carry it out one server at a time (`actuator`: drain,
restart through a `Restart` the caller gives, readmit), publish the plan (`loop`), and hold each
change to account (`accounts`: forecast against realized). `options` holds its flags; `advisor`
runs the same loop without restarts for Kubernetes. It never imports `launch`: the launcher
hands it the restart function."""

from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer, Restart

__all__ = ["Actuator", "ProxyLink", "ReconfigureOptions", "Reconfigurer", "Restart"]
