"""Run the `specroute` command as `python -m specroute`."""

from specroute.cli import main

raise SystemExit(main())
