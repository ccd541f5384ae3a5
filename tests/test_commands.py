"""The epoch protocol's typed commands, carried out by an instance's EpochParticipant without
a cluster: each reaches the right step of the owner side, a router or the source."""
import asyncio
import pickle

import numpy as np
import pytest

from streamlb.exceptions import StreamlbError
from streamlb.routing import RoutingTable
from streamlb._worker._commands import (Abort, Arm, Command, Epochs, FetchKeys, Forget, GroupKeys, Idle, Pause,
                                        Prepare, Resume, SetTable, WaitEpoch)
from streamlb._worker._epochs import EpochParticipant
from streamlb._worker._lifecycle import Lifecycle, Phase


class _Owner:
    def __init__(self):
        self.calls, self.held = [], []

    def __getattr__(self, name):
        async def step(*args):
            self.calls.append((name, *args))

        def sync(*args):
            self.calls.append((name, *args))
        return step if name in ("fetch_keys", "wait_done") else sync

    def status(self):
        return {"done": [3]}


class _Watermarks:
    def __init__(self):
        self.frozen, self.thawed = [], []

    def freeze(self, epoch):
        self.frozen.append(epoch)

    async def thaw(self, epoch):
        self.thawed.append(epoch)


class _Router:
    def __init__(self):
        self.tables, self.forgot = [], []

    async def set_table(self, table, prefetch):
        self.tables.append((table, prefetch))
        return 12.5, True

    def forget(self, epoch):
        self.forgot.append(epoch)

    def in_flight(self):
        return False


class _Gate:
    def __init__(self):
        self.open = True

    def set(self):
        self.open = True

    def clear(self):
        self.open = False


class _Source:
    def __init__(self):
        self.gate, self.flush_due = _Gate(), _Gate()
        self.flush_due.clear()


class _Store:
    def keys_per_group(self, groups):
        return np.array([10 * g for g in groups])


def _participant(phase=Phase.RUNNING, finishing=False):
    wakes = []
    life = Lifecycle("agg[0]")
    life.phase = phase
    part = EpochParticipant(_Owner(), _Watermarks(), {7: _Router()}, _Source(), [], _Store(), life=life,
                            finishing=lambda: finishing, wake=lambda: wakes.append(1))
    return part, wakes


def test_each_command_reaches_its_step_and_answers_what_the_rpc_did():
    part, wakes = _participant()
    owner, wm, router, source = part.owner, part.watermarks, part.exchanges[7], part.source
    table = RoutingTable.initial(8, 2)

    async def go():
        assert await part.handle(SetTable(7, table, {1: 0}, flush=True)) == 12.5
        assert router.tables == [(table, {1: 0})] and source.flush_due.open
        await part.handle(Prepare(4, "fluid", {1: [2, 3]}, {}, armed=False))
        await part.handle(Prepare(5, "split", {}, {}, [1]))
        assert owner.calls == [("prepare", 4, "fluid", {1: [2, 3]}, {}, (), False),
                               ("prepare", 5, "split", {}, {}, [1], True)]
        assert wm.frozen == [4]         # a split epoch that moves no group leaves the watermark
        await part.handle(Arm(4))
        await part.handle(Abort(5))
        await part.handle(Forget(4))
        await part.handle(Forget(4, 7))
        assert owner.calls[2:] == [("arm", 4), ("abort", 5), ("forget", 4)] and router.forgot == [4]
        assert wm.thawed == [5, 4] and len(wakes) == 2
        assert await part.handle(Epochs()) == {"done": [3], "status": "running", "finishing": False}
        assert await part.handle(WaitEpoch(3, 0.5)) == {"done": [3], "status": "running", "finishing": False}
        assert owner.calls[-1] == ("wait_done", 3, 0.5)
        keys = np.array([1, 2])
        await part.handle(FetchKeys(4, 1, keys, keys, 0, 2))
        assert owner.calls[-1] == ("fetch_keys", 4, 1, keys, keys, 0, 2)
        assert await part.handle(GroupKeys([1, 2])) == [10, 20]
        await part.handle(Pause())
        assert not source.gate.open
        await part.handle(Resume())
        assert source.gate.open
        assert await part.handle(Idle()) is True

    asyncio.run(go())


@pytest.mark.parametrize("phase, finishing, said", [(Phase.FINISHING, True, "finishing"), (Phase.DONE, True, "done"),
                                                    (Phase.STOPPED, False, "stopped")])
def test_an_instance_that_ended_refuses_to_prepare(phase, finishing, said):
    part, _ = _participant(phase, finishing)
    with pytest.raises(StreamlbError, match=f"instance agg\\[0\\] is {said}; it cannot take part in epoch 9"):
        asyncio.run(part.handle(Prepare(9, "fluid", {}, {2: 1})))
    assert part.owner.calls == []


def test_commands_are_named_for_errors_travel_by_pickle_and_an_unknown_one_is_refused():
    assert [c.name for c in (SetTable, Prepare, WaitEpoch, GroupKeys, FetchKeys, Idle)] == [
        "set_table", "prepare", "wait_epoch", "group_keys", "fetch_keys", "idle"]
    cmd = Prepare(2, "lazy", {0: [1]}, {}, armed=False)
    assert pickle.loads(pickle.dumps(cmd)) == cmd
    with pytest.raises(AttributeError):
        cmd.epoch = 3        # frozen

    class Unknown(Command):
        pass

    part, _ = _participant()
    with pytest.raises(StreamlbError, match="agg\\[0\\] got an unknown command Unknown"):
        asyncio.run(part.handle(Unknown()))
