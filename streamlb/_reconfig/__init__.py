"""Live reconfiguration of a running job: rescale an operator, move an instance, drain a
retiring worker, update a function, autoscale (see docs/reconfiguration.md).

``_live`` orders the steps from the driver; the instances' side is
``streamlb._worker._reconfig``. ``_plan`` says which key groups move; ``_update`` finds and
switches user functions. Importers name the module they use: the package imports none of
them (no import cycle through this file).
"""
