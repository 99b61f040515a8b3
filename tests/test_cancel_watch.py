"""serving/cancel_watch.py: clients' cancellations asked off the engine's thread, never after a final response."""

from __future__ import annotations

import threading
import time

from serving.cancel_watch import CancelWatch
from tests.triton_helpers import wait_for


class FakeSender:
    """A response sender whose is_cancelled() takes ``delay_s`` (the IPC round trip) and counts its calls."""

    def __init__(self, cancelled: bool = False, delay_s: float = 0.0):
        self.cancelled, self.delay_s, self.asked = cancelled, delay_s, 0
        self.asking = threading.Event()

    def is_cancelled(self) -> bool:
        self.asking.set()
        self.asked += 1
        time.sleep(self.delay_s)
        return self.cancelled


def test_a_cancelled_request_is_seen_and_then_not_asked_again():
    watch = CancelWatch(every_s=0.005).start()
    try:
        live, gone = FakeSender(), FakeSender(cancelled=True)
        watch.watch("live", live)
        watch.watch("gone", gone)
        wait_for(lambda: watch.is_cancelled("gone"), timeout=5, what="the cancellation seen")
        wait_for(lambda: live.asked >= 3, timeout=5, what="the live request asked again")
        assert not watch.is_cancelled("live")
        assert gone.asked == 1  # a cancellation is final: one answer is enough
    finally:
        watch.close()


def test_forget_waits_for_a_question_in_flight_and_the_sender_is_never_asked_after_it():
    watch = CancelWatch(every_s=0.005).start()
    try:
        slow = FakeSender(delay_s=0.2)
        watch.watch("r", slow)
        assert slow.asking.wait(5)
        started = time.monotonic()
        watch.forget("r")  # what the llm model does before the final response
        assert time.monotonic() - started > 0.1  # it waited for the answer tritonserver was giving
        asked = slow.asked
        time.sleep(0.1)
        assert slow.asked == asked and not watch.is_cancelled("r")
    finally:
        watch.close()


def test_forget_clears_a_cancellation_so_a_reused_id_starts_clean():
    watch = CancelWatch(every_s=0.005).start()
    try:
        watch.watch("r", FakeSender(cancelled=True))
        wait_for(lambda: watch.is_cancelled("r"), timeout=5, what="the cancellation seen")
        watch.forget("r")
        assert not watch.is_cancelled("r")
    finally:
        watch.close()


class BrokenSender(FakeSender):
    def is_cancelled(self) -> bool:
        self.asked += 1
        raise RuntimeError("shared memory pool is full")


def test_a_sender_that_fails_ends_its_request_and_the_watch_goes_on():
    watch = CancelWatch(every_s=0.005).start()
    try:
        live = FakeSender()
        watch.watch("broken", BrokenSender())
        watch.watch("live", live)
        wait_for(lambda: watch.is_cancelled("broken"), timeout=5, what="the broken request ended")
        asked = live.asked
        wait_for(lambda: live.asked > asked + 2, timeout=5, what="the other request still asked")
        assert not watch.is_cancelled("live")
    finally:
        watch.close()


class BlockedSender(FakeSender):
    """A round trip that lasts until the test lets it end."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def is_cancelled(self) -> bool:
        self.asking.set()
        self.release.wait(10)
        return False


def test_one_requests_question_in_flight_does_not_hold_up_anothers_forget():
    watch = CancelWatch(every_s=0.005).start()
    blocked = BlockedSender()
    try:
        watch.watch("blocked", blocked)
        watch.watch("other", FakeSender())
        assert blocked.asking.wait(5)
        forgot = threading.Thread(target=watch.forget, args=("other",))
        forgot.start()
        forgot.join(5)  # a final response for "other" is not kept waiting for "blocked"'s round trip
        assert not forgot.is_alive() and not blocked.release.is_set()
    finally:
        blocked.release.set()
        watch.close()
