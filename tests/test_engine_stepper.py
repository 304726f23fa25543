"""EngineStepper on a stand-in scheduler: many threads' waits share one loop, the loop ends when the last
waiter leaves and a later wait starts another, a step's error reaches every waiter, and queued work runs before the step."""

import threading
import time

import pytest

from radixflow.runtime.engine_stepper import EngineStepper


class CountingScheduler:
    """Has work while `pending` > 0; each step takes one off (on the stepper's thread only)."""

    def __init__(self, fail_at: int = -1):
        self.open = threading.Event()  # no work until it is set
        self.open.set()
        self.pending = 0
        self.steps = 0
        self.fail_at = fail_at
        self.threads: set = set()

    def has_work(self) -> bool:
        return self.open.is_set() and self.pending > 0

    def step(self) -> None:
        self.threads.add(threading.get_ident())
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("step failed")
        self.pending -= 1


class NoPrograms:
    def on_step(self) -> None:
        pass


def test_many_threads_share_one_loop_and_a_later_wait_starts_another():
    sched = CountingScheduler()
    stepper = EngineStepper(sched, NoPrograms())
    targets = []

    def one(k: int) -> None:
        # done once every step queued so far has run, its own three included
        target = stepper.exclusive(lambda: (setattr(sched, "pending", sched.pending + 3), sched.steps + sched.pending)[1])
        targets.append(target)
        stepper.run_until(lambda: sched.steps >= target)

    for _ in range(2):  # the second round needs a new loop: the first ended with its last waiter
        threads = [threading.Thread(target=one, args=(k,)) for k in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a waiter was never woken"
        assert sched.pending == 0 and sched.steps >= max(targets)
        deadline = time.monotonic() + 5
        while stepper._looping and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not stepper._looping, "the loop must end once nobody waits"
    assert sched.steps == 2 * 40 * 3
    assert len(sched.threads) == 1, "every step runs on the stepper's one worker thread"
    stepper.close()


def test_a_steps_error_reaches_every_waiter_and_the_next_wait_recovers():
    sched = CountingScheduler(fail_at=2)
    stepper = EngineStepper(sched, NoPrograms())
    stepper.exclusive(lambda: setattr(sched, "pending", 5))
    sched.open.clear()  # every thread waits before the first step
    errors = []

    def wait() -> None:
        try:
            stepper.run_until(lambda: sched.pending == 0)
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=wait) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(stepper._waiters) < 8 and time.monotonic() < deadline:
        time.sleep(0.001)
    sched.open.set()
    for t in threads:
        t.join(timeout=30)
    assert errors == ["step failed"] * 8
    stepper.run_until(lambda: sched.pending == 0)  # a new loop finishes the work
    assert sched.pending == 0
    stepper.close()


def test_queued_work_runs_before_the_step_and_its_error_goes_to_its_caller():
    sched = CountingScheduler()
    stepper = EngineStepper(sched, NoPrograms())
    order = []
    stepper.call(lambda: order.append(("call", sched.steps)))
    stepper.call(lambda: setattr(sched, "pending", 1))
    stepper.run_until(lambda: sched.steps == 1)
    assert order == [("call", 0)]
    with pytest.raises(ZeroDivisionError):
        stepper.exclusive(lambda: 1 / 0)
    stepper.close()
