"""The aligner without a cluster: epochs aligned by markers and ends of stream, senders
added and removed while running."""
from hypothesis import given
from hypothesis import strategies as st

from streamlb._worker._align import Aligner


def test_an_epoch_is_aligned_once_every_sender_passed_it_by_marker_or_end():
    a = Aligner([0, 1, 2])
    told = []
    a.when_aligned(1, lambda: told.append(1))
    a.when_aligned(2, lambda: told.append(2))
    a.marker(0, 1)
    a.marker(1, 2)
    assert told == [] and not a.aligned(1)
    a.end(2)                                   # an ended sender sends no more old records
    assert told == [] and not a.ended_all
    a.marker(1, 1)
    assert told == [1]
    a.marker(0, 2)
    assert told == [1, 2]
    a.when_aligned(2, lambda: told.append("now"))     # already aligned: told at once
    assert told == [1, 2, "now"]


def test_removing_a_sender_releases_what_waited_for_it_and_adding_one_holds_epochs():
    a = Aligner([0, 1])
    told = []
    a.marker(0, 5)
    a.when_aligned(5, lambda: told.append(5))
    a.remove_sender(1)
    assert told == [5]
    a.add_sender(3)
    a.when_aligned(6, lambda: told.append(6))
    a.marker(0, 6)
    assert told == [5]                        # the new sender has not passed epoch 6
    a.end(3)
    a.end(0)
    assert told == [5, 6] and a.ended_all
    assert not Aligner().ended_all            # a source has no sender to end


def test_forget_drops_an_epochs_markers_and_subscribers():
    told = []
    a = Aligner([0, 1])
    a.when_aligned(4, told.append)        # never called: forgotten before it is aligned
    a.marker(0, 4)
    a.forget(4)
    a.marker(1, 4)
    assert told == [] and not a.aligned(4)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=30), st.sets(st.integers(0, 3)))
def test_aligned_means_every_sender_marked_or_ended(events, ended):
    a = Aligner(range(4))
    told = set()
    for e in range(1, 5):
        a.when_aligned(e, lambda e=e: told.add(e))
    for s, e in events:
        a.marker(s, e)
    for s in ended:
        a.end(s)
    for e in range(1, 5):
        marked = {s for s, ee in events if ee == e}
        expect = set(range(4)) <= marked | ended
        assert a.aligned(e) == expect and (e in told) == expect
