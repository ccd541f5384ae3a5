"""An instance's lifecycle: one phase, one table of transitions (streamlb._worker._lifecycle)."""
import asyncio

import pytest

from streamlb._worker._lifecycle import TRANSITIONS, Lifecycle, Phase
from streamlb.exceptions import StreamlbError


def test_every_phase_has_its_row_and_the_driver_sees_the_statuses_it_always_saw():
    assert set(TRANSITIONS) == set(Phase)
    assert {p.status for p in Phase} == {"created", "ready", "running", "done", "failed", "stopped", "retired"}
    assert [p for p in Phase if p.status == "running"] == [Phase.RUNNING, Phase.FINISHING, Phase.CLOSING,
                                                           Phase.DRAINING]
    assert all(Phase.FAILED in TRANSITIONS[p] for p in Phase if p is not Phase.FAILED)
    assert not TRANSITIONS[Phase.FAILED]


def test_a_transition_the_table_does_not_list_is_refused():
    life = Lifecycle("agg[0]")
    with pytest.raises(StreamlbError, match="agg\\[0\\] cannot go from CREATED to RUNNING"):
        life.move_to(Phase.RUNNING)
    for p in (Phase.READY, Phase.RUNNING, Phase.FINISHING, Phase.CLOSING, Phase.DRAINING, Phase.DONE):
        life.move_to(p)
    assert life.status == "done" and not life.may(Phase.STOPPED) and life.may(Phase.RETIRED)
    with pytest.raises(StreamlbError):
        life.move_to(Phase.RUNNING)


def test_a_held_poll_answers_once_the_instance_ends():
    async def go():
        life = Lifecycle("agg[0]")
        life.move_to(Phase.READY)
        life.move_to(Phase.RUNNING)
        assert await life.settled(0.01) == "running"
        held = asyncio.ensure_future(life.settled(30))
        await asyncio.sleep(0.01)
        life.move_to(Phase.FINISHING)
        await asyncio.sleep(0.01)
        assert not held.done()
        life.move_to(Phase.RETIRED)
        assert await asyncio.wait_for(held, 1) == "retired"
    asyncio.run(go())
