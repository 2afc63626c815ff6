"""`specroute tune`: the seed's session unattended. Each depth is launched (through `launch`),
swept with the bench, stopped; the measurements become a report, plots and the prior that the
pool and the planner load.

`command` (the flags), `layout` (which servers, which sweep), `run` (the session), `progress`,
`report` / `recommend` / `render` (what was measured and what to run), `files` (writing it)."""
