"""Fan-out after ``key_by``: what an upstream instance spends routing one batch for each
keyed operator it feeds, and the part of it a shared exchange would do only once (taking
the key column, checking the keys, hashing them to key groups). See docs/user-guide.md,
"One keyed stream, several operators".

In process, no cluster: one router of a balanced job (it counts records per key group) to
INSTANCES instances over KEY_GROUPS key groups, its channels only taking the batches;
Zipf(1.2) keys over KEYS keys.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd

KEYS, KEY_GROUPS, INSTANCES = 20_000, 128, 3


class _Channel:
    async def send(self, msg, *args):
        pass


class FanOutRouting:
    params = [[5_000, 65_536]]
    param_names = ["rows"]

    def setup(self, rows):
        from streamlb._worker._exchange import KeyedRouter
        from streamlb._worker._messages import ExchangeSpec
        from streamlb._sinks import DeadLetters
        from streamlb.routing import RoutingTable

        rng = np.random.default_rng(7)
        self.batch = pd.DataFrame({"key": rng.zipf(1.2, rows) % KEYS, "value": rng.integers(0, 1000, rows) * 1.0})
        spec = ExchangeSpec("keyed", "agg", "key", "key", balanced=True)
        self.router = KeyedRouter(spec, "source", {i: _Channel() for i in range(INSTANCES)},
                                  RoutingTable.initial(KEY_GROUPS, INSTANCES), index=0,
                                  dead=DeadLetters(0), spawn=None, lazy_asked=0)
        self.loop = asyncio.new_event_loop()

    def teardown(self, rows):
        self.loop.close()

    def time_route_for_one_operator(self, rows):
        """Everything one operator's router does with a batch; n operators pay it n times."""
        self.loop.run_until_complete(self.router.send(self.batch, 0.0))

    def time_key_and_hash(self, rows):
        """What a shared exchange would do once instead of once per operator."""
        from streamlb.keygroups import assign_to_key_group

        _, keys = self.router._keys(self.batch)
        assign_to_key_group(keys, KEY_GROUPS, dtype=self.router.group_dtype)
