"""The keyed router without a cluster: rows go to the owner of their key group with the
groups computed once, and a downstream instance can be removed and added while running."""
import asyncio

import numpy as np
import pandas as pd

from streamlb.keygroups import assign_to_key_group
from streamlb.routing import RoutingTable
from streamlb._worker._channels import OutChannel
from streamlb._worker._exchange import make_exchange
from streamlb._worker._messages import Batch, EndOfStream, ExchangeSpec
from streamlb._sinks import DeadLetters


class _Owner:
    key, address = "owner", "tcp://owner:1"

    def __init__(self):
        self.got = []

    async def call(self, method, env):
        self.got.append(env.msg)


def test_rows_reach_the_owner_of_their_group_with_their_groups_and_peers_come_and_go():
    G = 64
    df = pd.DataFrame({"k": np.arange(1000) * 7, "v": np.arange(1000.0)})
    truth = assign_to_key_group(df.k.to_numpy(), G)
    table = RoutingTable.initial(G, 2)

    async def go():
        owners = [_Owner(), _Owner()]
        chan = {i: OutChannel(o, sender=0, credits=2) for i, o in enumerate(owners)}
        router = make_exchange(ExchangeSpec("keyed", "agg", key="k", key_name="k"), "src", dict(chan), table,
                               index=0, dead=DeadLetters(0), spawn=None, lazy_asked=10)
        await router.send(df, 1.0)
        await router.drain()
        for i, o in enumerate(owners):
            (b,) = o.got
            assert isinstance(b, Batch) and b.need is None and b.emitted == 1.0
            mine = table.owners[truth] == i
            pd.testing.assert_frame_equal(b.frame, df[mine])                      # batch order kept
            np.testing.assert_array_equal(b.groups.astype(np.int64), truth[mine])  # groups travel
        await router.remove_peer(1)                # retired: nothing more goes to it
        newcomer = _Owner()
        await router.add_peer(1, OutChannel(newcomer, sender=0, credits=2))
        await router.send(df, 2.0)
        await router.end()
        await router.drain()
        assert len(owners[1].got) == 1
        assert [type(m) for m in newcomer.got] == [Batch, EndOfStream]
        assert len(newcomer.got[0].frame) + len(owners[0].got[1].frame) == len(df)

    asyncio.run(go())
