"""The worker side of a job: the ``Instance`` actor and the parts it is made of.

``_instance`` holds the actor (its RPC surface, dispatching typed messages); the other
private modules hold one responsibility each (see docs/runtime.md). Importers name the
module they use (``._worker._instance``): the package imports none of them, so importing
one never runs another (no import cycle through this file).
"""
