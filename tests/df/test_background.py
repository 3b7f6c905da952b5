"""dfmp2.df.background: the one read-ahead / write-behind thread of the run (the out-of-core reader
and writer, the host integral engine's producer): order, bounded depth, the same exception in
the caller, skipped calls after a failure, prompt stop (also on a real Ctrl-C)."""

import signal
import threading
import time

import pytest

from dfmp2.df.background import Background


def alive(name):
    return [t for t in threading.enumerate() if t.name.startswith(name) and t.is_alive()]


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_map_in_order_at_most_depth_ahead_of_the_held_result(depth):
    started = []

    def work(x):
        started.append(x)
        time.sleep(0.002)
        return x * x

    bg = Background("dfmp2-test", depth=depth)
    got = []
    for i, r in enumerate(bg.map(work, range(12))):
        time.sleep(0.01)  # let the thread run as far ahead as it may
        assert max(started) <= i + depth  # never more than depth calls ahead of the held one
        got.append(r)
    assert got == [x * x for x in range(12)] and started == list(range(12))
    assert alive("dfmp2-test") == []  # a finished map stops its thread


def test_map_error_is_the_same_object_in_its_place_and_later_calls_are_skipped():
    raised, calls = [], []

    def read(k):
        calls.append(k)
        if k == 2:
            raised.append(OSError("disk on fire"))
            raise raised[-1]
        return k

    it = Background("dfmp2-test", depth=2).map(read, range(50))
    assert next(it) == 0 and next(it) == 1
    with pytest.raises(OSError) as info:
        next(it)
    assert info.value is raised[0] and calls == [0, 1, 2] and alive("dfmp2-test") == []


def test_close_stops_at_once_though_calls_are_left():
    bg = Background("dfmp2-test", depth=2)
    it = bg.map(lambda k: time.sleep(0.05) or k, range(1000))
    next(it)
    t0 = time.perf_counter()
    it.close()  # a consumer leaving the loop
    assert time.perf_counter() - t0 < 1 and alive("dfmp2-test") == []


def fail():
    raise OSError("no space left")


def test_put_error_is_raised_at_the_next_call_and_stops_the_queue():
    ran, gate = [], threading.Event()
    bg = Background("dfmp2-writer-test", depth=3)
    bg.put(lambda: gate.wait() and fail())
    bg.put(ran.append, 1)  # queued behind a write that fails: skipped
    gate.set()
    with pytest.raises(OSError, match="no space"):
        bg.wait()
    bg.close()
    assert ran == [] and alive("dfmp2-writer-test") == []
    with Background("dfmp2-writer-test", depth=3) as bg:
        bg.put(fail)
        time.sleep(0.1)
        with pytest.raises(OSError, match="no space"):
            bg.put(ran.append, 2)  # a finished failure: reported at the next call
    assert ran == []


def test_put_keeps_order_and_bounds_what_is_queued():
    done, gate = [], threading.Event()
    with Background("dfmp2-writer-test", depth=2) as bg:
        bg.put(gate.wait)
        bg.put(done.append, 1)
        t = threading.Timer(0.2, gate.set)
        t.start()
        t0 = time.perf_counter()
        bg.put(done.append, 2)  # two outstanding: waits for the first
        assert time.perf_counter() - t0 > 0.1
        bg.wait()
        assert done == [1, 2]
        t.join()
    assert alive("dfmp2-writer-test") == []


def test_ctrl_c_while_waiting_for_a_result():
    """A real SIGINT while the caller waits: KeyboardInterrupt at once, the thread stops after
    its current call. SIGINT raises for the test's duration (a background job of a shell
    without job control inherits it ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    main_id = threading.get_ident()
    timer = threading.Timer(0.1, lambda: signal.pthread_kill(main_id, signal.SIGINT))
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in Background("dfmp2-test", depth=1).map(lambda k: time.sleep(0.3), range(100)):
                pass
    finally:
        signal.signal(signal.SIGINT, old)
        timer.join()
    assert time.perf_counter() - t0 < 3 and alive("dfmp2-test") == []
