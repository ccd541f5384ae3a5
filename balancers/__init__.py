"""Load-balancing policies for streamlb.

Each policy depends only on streamlb's balancer interface and is registered under the
entry-point group ``streamlb.balancers`` in ``setup.cfg``, exactly as a third party would
register its own. The interface and the built-in policies arrive with the balancer plugin
milestone; until then the group is declared and empty.
"""
