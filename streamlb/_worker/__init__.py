"""The worker side of a job: the ``Instance`` actor and the parts it is made of.

``_instance`` holds the actor (its RPC surface, dispatching typed messages); the other
private modules hold one responsibility each (see docs/runtime.md).
"""
from __future__ import annotations

from ._channels import call_actor
from ._instance import Instance
from ._messages import ExchangeSpec

__all__ = ["Instance", "ExchangeSpec", "call_actor"]
