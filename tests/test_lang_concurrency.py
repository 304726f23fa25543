"""Concurrent programs on one in-process Engine share its scheduler steps: eager programs
driven from threads (run_batch) or from asyncio (run_async) batch like graph programs."""

from __future__ import annotations

import asyncio
import threading

import pytest

import radixflow as rf
from radixflow.runtime.generate_request import GenerateInput

from lang_programs import FEW_SHOT

GREEDY = {"temperature": 0}
COUNTRIES = ["France", "Italy", "Japan", "Egypt", "Peru", "Kenya"]


@rf.function
def checked_answer(s, country):
    """Data-dependent (cannot be traced): reads its first gen in Python."""
    s += FEW_SHOT + f"Q: What is the capital of {country}?\nA:" + rf.gen("answer", max_tokens=6, ignore_eos=True)
    s += f"\nThe answer has {len(s['answer'].split())} words. Next:" + rf.gen("more", max_tokens=6, ignore_eos=True)


def _prompt_input(text: str, params: dict) -> GenerateInput:
    return GenerateInput(text=text, sampling_params=params)


def sequential(engine):
    return [checked_answer.run(country=c, backend=engine, **GREEDY) for c in COUNTRIES]


def steps_of(engine, fn):
    before = engine.stepper.steps
    out = fn()
    return out, engine.stepper.steps - before


def test_eager_run_batch_shares_scheduler_steps(engine):
    one, one_steps = steps_of(engine, lambda: [checked_answer.run(country="France", backend=engine, **GREEDY)])
    ref = sequential(engine)
    states, steps = steps_of(engine, lambda: checked_answer.run_batch([{"country": c} for c in COUNTRIES], backend=engine, progress_bar=False, **GREEDY))
    assert [s.mode for s in states] == ["eager"] * len(COUNTRIES)
    assert [s.text() for s in states] == [s.text() for s in ref]  # same greedy tokens, batched or not
    # alone, each program needs one_steps driver turns; 6 of them one after another 6x that
    print(f"batched: {steps} driver turns; one program alone: {one_steps}")
    assert steps < 3 * one_steps, (steps, one_steps)


def test_run_async_drives_many_programs_from_one_event_loop(engine):
    ref = sequential(engine)

    async def main():
        return await asyncio.gather(*(checked_answer.run_async(country=c, backend=engine, **GREEDY) for c in COUNTRIES))

    (states, steps) = steps_of(engine, lambda: asyncio.run(main()))
    assert [s.text() for s in states] == [s.text() for s in ref]
    _, one_steps = steps_of(engine, lambda: checked_answer.run(country="Peru", backend=engine, **GREEDY))
    print(f"batched: {steps} driver turns; one program alone: {one_steps}")
    assert steps < 3 * one_steps, (steps, one_steps)


def test_run_batch_generator_style_shares_scheduler_steps(engine):
    """SGLang's generator_style: states come one by one in input order, and still batch."""
    ref = sequential(engine)
    kwargs = [{"country": c} for c in COUNTRIES]
    it, _ = steps_of(engine, lambda: checked_answer.run_batch(kwargs, backend=engine, progress_bar=False, generator_style=True, **GREEDY))
    states, steps = steps_of(engine, lambda: list(it))
    assert [s.text() for s in states] == [s.text() for s in ref]
    _, one_steps = steps_of(engine, lambda: checked_answer.run(country="Peru", backend=engine, **GREEDY))
    assert steps < 3 * one_steps, (steps, one_steps)


def test_engine_generate_from_threads_batches_and_stays_consistent(engine):
    prompts = [f"Count to {i}:" for i in range(2, 8)]
    params = {"max_new_tokens": 8, "ignore_eos": True, **GREEDY}
    want = engine.generate(prompts, params)
    got: dict = {}

    def one(i: int) -> None:
        got[i] = engine.generate(prompts[i], params)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    _, steps = steps_of(engine, lambda: [t.start() for t in threads] + [t.join() for t in threads])
    assert [got[i]["text"] for i in range(len(prompts))] == [w["text"] for w in want]
    assert steps < 3 * 8, steps  # sequential would take at least 6 x 8 decode steps
    assert not engine.scheduler.has_work()


def test_a_waiting_thread_is_woken_once_its_requests_are_done(engine):
    """The stepper's loop checks each waiter's condition itself and wakes it only when it holds:
    the waiting thread is not woken (and does not take the GIL) on every scheduler step."""
    caller, checks = threading.get_ident(), []
    reqs = engine.builder.build(_prompt_input("Count to ten:", {"max_new_tokens": 24, "ignore_eos": True, **GREEDY}))

    def done() -> bool:
        checks.append(threading.get_ident() == caller)
        return all(r.finished for r in reqs)

    before = engine.stepper.steps
    engine._submit(reqs)
    engine.stepper.run_until(done)
    assert all(r.finished for r in reqs) and engine.stepper.steps - before >= 24
    assert sum(checks) <= 2 < len(checks), checks  # the caller checked before waiting and maybe once after


@rf.function
def three_ideas(s, topic):
    s += f"Topic: {topic}\n"
    forks = s.fork(3)
    forks += lambda i: f"Idea {i + 1}:" + rf.gen("idea", max_tokens=8, ignore_eos=True)
    forks.join()


def test_eager_fork_branches_share_passes(engine):
    """An eager program's fork branches run at once (as a graph's do): 3 branches of 8 tokens
    take about 8 passes, not 3 x 8 one branch after another."""
    graph = three_ideas.run(topic="rain", backend=engine, **GREEDY)
    before = engine.scheduler.stats.forward_steps
    eager = three_ideas.run(topic="rain", backend=engine, mode="eager", **GREEDY)
    passes = engine.scheduler.stats.forward_steps - before
    assert (graph.mode, eager.mode) == ("graph", "eager")
    assert len(eager["idea"]) == 3 and eager["idea"] == graph["idea"]
    assert passes < 16, passes


def test_fork_exprs_are_made_in_branch_order_on_a_one_call_at_a_time_backend():
    """A backend that does not batch calls from many threads runs the branches one after another,
    and each branch's expr is made just before its own append (it may read earlier branches)."""
    from radixflow.lang.backends.base import Backend
    from radixflow.lang.chat_template import ChatTemplate
    from radixflow.lang.interpreter import GenResult

    class Counter(Backend):  # writes how many gens it has run so far
        calls = 0

        def chat_template(self):
            return ChatTemplate.plain()

        def generate(self, prompt, params, node=None):
            self.calls += 1
            return GenResult(str(self.calls), None, {})

    backend, seen = Counter(), []

    @rf.function
    def two_branches(s):
        forks = s.fork(2)
        forks += lambda i: seen.append(backend.calls) or rf.gen("x", max_tokens=1)
        forks.join()

    state = two_branches.run(backend=backend)
    assert state.mode == "eager" and state["x"] == ["1", "2"] and seen == [0, 1]


def test_a_streamed_program_finishes_after_a_step_raised_past_its_request(engine, monkeypatch):
    """A step that raises after a program's last request finished (its strand released, the
    executor not yet polled) fails the callers waiting then; the program's stream, read on
    afterwards, must still finish rather than wait for a poll that never comes."""
    params = {"max_new_tokens": 12, "ignore_eos": True, **GREEDY}
    program = {"ops": [{"op": "text", "text": "Count:"}, {"op": "gen", "id": 0, "name": "a", "sampling_params": params}]}
    sched, armed, raised = engine.scheduler, [], []
    step, cont = sched.step, sched.continue_request

    def continue_request(req) -> bool:
        if armed and not raised:
            raised.append(req)
        return cont(req)

    def failing_step():
        out = step()
        if len(raised) == 1:
            raised.append("raised")
            raise RuntimeError("a step failed")
        return out

    monkeypatch.setattr(sched, "continue_request", continue_request)
    monkeypatch.setattr(sched, "step", failing_step)
    stream = engine.run_program(program, stream=True)
    while next(stream).get("var") != "a":  # until gen a has started; nobody waits on the stepper then
        pass
    armed.append(True)
    before = engine.stepper.steps
    with pytest.raises(RuntimeError, match="a step failed"):  # a waiter that queues nothing after the error
        engine.stepper.run_until(lambda: engine.stepper.steps - before > 40)  # gen a finishes within 12
    events: list = []
    reader = threading.Thread(target=lambda: events.extend(stream), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "the program's stream waits for a poll that never comes"
    assert events[-1]["results"]["0"]["meta_info"]["completion_tokens"] == 12
