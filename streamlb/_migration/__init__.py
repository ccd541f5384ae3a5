"""Live migration: the epoch protocol's coordinator, the balancer plugin that drives it,
the control a job reaches it through, and the instances' side of the protocol.

``_control`` holds what the coordinator knows of a job; ``_epochs`` moves key groups and
``_split`` splits keys, both over the steps in ``_protocol``; ``_reports`` merges load
reports; ``_plugin`` is the scheduler plugin; ``_driver`` the job's side. ``_owner``,
``_moves`` and ``_prefetch`` are what an instance does in an epoch (see docs/migration.md
and docs/runtime.md). Importers name the module they use: the package imports none of
them (no import cycle through this file).
"""
