"""Which operator logic runs a stage: by its kind (a new operator registers here)."""
from __future__ import annotations

from ._operators import Aggregate, ByFeature, OperatorLogic, StatefulMap, Stateless
from ._join_op import JoinOperator
from ._process_batch_op import ProcessBatchOperator
from ._process_op import ProcessOperator
from ._window_op import WindowOperator

#: stage kind -> the logic of its instances (stateless stages: by their shuffle policy)
KINDS = {"aggregate": Aggregate, "stateful_map": StatefulMap, "window": WindowOperator, "join": JoinOperator,
         "process": ProcessOperator}


def make_operator(ctx) -> OperatorLogic:
    """The operator logic for the instance ``ctx``'s stage."""
    logic = KINDS.get(ctx.stage.kind)
    if logic is ProcessOperator and ctx.stage.process.get("batch"):
        logic = ProcessBatchOperator            # process(..., batch=True): once per batch
    if logic is not None:
        return logic(ctx)
    if (ctx.stage.shuffle or {}).get("policy") == "osg":
        return ByFeature(ctx)
    return Stateless(ctx)
