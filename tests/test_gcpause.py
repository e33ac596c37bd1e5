"""latencylab.gcpause: the load generator's run freezes the heap and counts the collections it still takes."""

from __future__ import annotations

import gc
import threading

from latencylab import gcpause


def test_frozen_moves_the_heap_out_of_collections_and_back() -> None:
    # Frozen objects that die (another thread's, a worker's) leave the count, so it is compared with slack, never
    # for equality: a refreeze would add every object allocated since (5,000 here); a unfreeze would drop to 0.
    assert gc.get_freeze_count() == 0
    keep = [[i] for i in range(10_000)]  # tracked objects that survive the collection
    with gcpause.frozen():
        inside = gc.get_freeze_count()
        assert inside >= len(keep)
        more = [[i] for i in range(5_000)]  # allocated after the freeze
        with gcpause.frozen():  # a second user (another generator in this process) does not refreeze
            assert gc.get_freeze_count() < inside + len(more)
        assert gc.get_freeze_count() >= len(keep)  # still frozen: the outer user is running
    assert gc.get_freeze_count() == 0  # the last user out unfreezes
    assert keep and more


def test_frozen_counts_users_across_threads() -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with gcpause.frozen():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(5)
    with gcpause.frozen():
        pass
    assert gc.get_freeze_count() > 0  # this thread left; the other still holds it
    release.set()
    t.join(5)
    assert gc.get_freeze_count() == 0


def test_pause_meter_counts_collections() -> None:
    with gcpause.PauseMeter() as m:
        gc.collect()
        gc.collect(0)
    assert m.count == 2 and m.max_ns > 0 and m.total_ns >= m.max_ns
    gc.collect()
    assert m.count == 2  # detached after the block
