"""The SGLang paper's LLM-program workloads, with synthetic data made here (no downloads).

Each workload is a program and a generator of its inputs. Texts are made of words drawn
from a fixed list by a seeded generator, so they are real text for the tokenizer and
every run gets the same data. `size` scales the shared parts (few-shot examples, agent
memories, documents); the paper's sizes are size=1.0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import radixflow as rf

WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house service "
    "friend father power hour game line end member law car city community name president team minute idea kid body "
    "information back parent face others level office door health person art war history party result change morning "
    "reason research girl guy moment air teacher force education river mountain garden market window letter"
).split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


@dataclass
class Workload:
    name: str
    program: "rf.Function"
    inputs: Callable[[random.Random, int, float], list]  # (rng, n, size) -> run_batch kwargs
    traceable: bool = True  # False: data-dependent Python (runs eagerly in every mode)


# -- MMLU: 5-shot multiple choice, one token answered ------------------------------------------------
@rf.function
def mmlu(s, examples, question, max_answer=1):
    s += examples + question + "\nAnswer:" + rf.gen("answer", max_tokens=max_answer, temperature=0)


def _mc(rng: random.Random, stem: int) -> str:
    opts = "".join(f"\n{c}. {words(rng, 4)}" for c in "ABCD")
    return f"Question: {words(rng, stem)}?{opts}"


def mmlu_inputs(rng, n, size):
    subjects = [("".join(_mc(rng, int(40 * size)) + f"\nAnswer: {rng.choice('ABCD')}\n\n" for _ in range(5))) for _ in range(2)]
    return [{"examples": subjects[i % 2], "question": _mc(rng, int(40 * size))} for i in range(n)]


# -- HellaSwag: few-shot, pick one of four endings ----------------------------------------------------
@rf.function
def hellaswag(s, examples, context, endings):
    s += examples + context
    s += rf.select("ending", endings)


def hellaswag_inputs(rng, n, size):
    shots = "".join(f"{words(rng, int(30 * size))} {words(rng, 8)}.\n\n" for _ in range(20))
    return [{"examples": shots, "context": words(rng, 30), "endings": [" " + words(rng, 6) for _ in range(4)]} for _ in range(n)]


# -- ReAct agent: the loop depends on the model's choices (eager) ------------------------------------
@rf.function
def react(s, examples, question, max_tokens=8):
    s += examples + "Question: " + question + "\n"
    for i in range(1, 4):
        s += f"Thought {i}:" + rf.gen(f"thought_{i}", max_tokens=max_tokens, stop="\n") + "\n"
        s += f"Action {i}:" + rf.select(f"action_{i}", [" Search", " Finish"])
        if s[f"action_{i}"] == " Finish":
            s += " [" + rf.gen("answer", max_tokens=max_tokens, stop="]") + "]\n"
            return
        s += " [" + rf.gen(f"query_{i}", max_tokens=max_tokens, stop="]") + "]\n"
        s += f"Observation {i}: {words(random.Random(i), 12)}\n"


def react_inputs(rng, n, size):
    shots = "".join(
        f"Question: {words(rng, 10)}?\nThought 1: {words(rng, 12)}\nAction 1: Search [{words(rng, 3)}]\n"
        f"Observation 1: {words(rng, int(40 * size))}\nThought 2: {words(rng, 10)}\nAction 2: Finish [{words(rng, 2)}]\n\n"
        for _ in range(4)
    )
    return [{"examples": shots, "question": words(rng, 12) + "?"} for _ in range(n)]


# -- Generative agents: a long memory per agent, then several short decisions ------------------------
@rf.function
def generative_agent(s, memory, event, max_tokens=8):
    s += memory + "Now: " + event + "\n"
    s += "Reaction:" + rf.gen("reaction", max_tokens=max_tokens, stop="\n") + "\n"
    s += "Plan for the next hour:" + rf.gen("plan", max_tokens=max_tokens, stop="\n") + "\n"
    s += "What to say:" + rf.gen("say", max_tokens=max_tokens, stop="\n")


def agent_inputs(rng, n, size):
    memories = [f"Agent {a} remembers: " + "\n".join(words(rng, 20) for _ in range(int(20 * size))) + "\n" for a in range(3)]
    return [{"memory": memories[i % 3], "event": words(rng, 12)} for i in range(n)]


# -- Tree of thought: propose, then rate each proposal in its own branch -----------------------------
@rf.function
def tree_of_thought(s, problem, width=3, max_tokens=8):
    s += "Problem: " + problem + "\n"
    forks = s.fork(width)
    forks += lambda i: f"Idea {i + 1}:" + rf.gen("idea", max_tokens=max_tokens, stop="\n") + "\nIs it promising?"
    forks += rf.select("rating", [" yes", " no"])
    forks.join()
    s += "Best idea:" + rf.gen("best", max_tokens=max_tokens, stop="\n")


def tot_inputs(rng, n, size):
    return [{"problem": words(rng, int(60 * size))} for _ in range(n)]


# -- Skeleton of thought: outline, then expand every point in parallel -------------------------------
@rf.function
def skeleton_of_thought(s, question, points=3, max_tokens=8):
    s += "Question: " + question + "\nOutline:\n"
    for i in range(points):
        s += f"{i + 1}." + rf.gen(f"point_{i}", max_tokens=max_tokens, stop="\n") + "\n"
    forks = s.fork(points)
    forks += lambda i: f"Expand point {i + 1}:" + rf.gen("detail", max_tokens=2 * max_tokens, stop="\n\n")
    forks.join()


def sot_inputs(rng, n, size):
    return [{"question": words(rng, int(30 * size)) + "?"} for _ in range(n)]


# -- LLM judge: one answer, judged on several dimensions in parallel ---------------------------------
DIMENSIONS = ["helpfulness", "accuracy", "clarity", "depth"]


@rf.function
def llm_judge(s, rubric, answer, max_tokens=8):
    s += rubric + "Answer to judge: " + answer + "\n"
    forks = s.fork(len(DIMENSIONS))
    forks += lambda i: f"Judge its {DIMENSIONS[i]}:" + rf.gen("judgement", max_tokens=max_tokens, stop="\n")
    forks.join()
    s += "Overall score (1-10):" + rf.gen("score", max_tokens=3, stop="\n")


def judge_inputs(rng, n, size):
    rubric = "You are a strict judge. " + words(rng, int(200 * size)) + "\n"
    return [{"rubric": rubric, "answer": words(rng, int(60 * size))} for _ in range(n)]


# -- JSON decoding: fields constrained by a regex --------------------------------------------------------
CITY_REGEX = r'\{"name": "[a-z ]{1,12}", "population": [0-9]{1,7}, "river": "[a-z ]{1,12}"\}'


@rf.function
def json_decode(s, instructions, document, max_tokens=48):
    s += instructions + "Document: " + document + "\nJSON:"
    s += rf.gen("json", max_tokens=max_tokens, regex=CITY_REGEX)


def json_inputs(rng, n, size):
    instructions = "Extract the city as JSON with name, population and river. " + words(rng, int(100 * size)) + "\n"
    return [{"instructions": instructions, "document": words(rng, int(40 * size))} for _ in range(n)]


# -- Multi-turn chat ------------------------------------------------------------------------------------------
@rf.function
def multi_turn_chat(s, turns, max_tokens=8):
    s += rf.system("You are a helpful assistant.")
    for i, question in enumerate(turns):
        s += rf.user(question)
        s += rf.assistant(rf.gen(f"answer_{i}", max_tokens=max_tokens))


def chat_inputs(rng, n, size):
    return [{"turns": [words(rng, int(40 * size)) + "?" for _ in range(4)]} for _ in range(n)]


# -- DSPy-style RAG: retrieved passages (shared among questions), a query, then the answer ------------
@rf.function
def dspy_rag(s, passages, question, max_tokens=8):
    s += "Answer questions using the context.\n\nContext:\n" + passages + "\nQuestion: " + question + "\n"
    s += "Search query:" + rf.gen("query", max_tokens=max_tokens, stop="\n") + "\n"
    s += "Reasoning: Let's think step by step." + rf.gen("reasoning", max_tokens=2 * max_tokens, stop="\n") + "\n"
    s += "Answer:" + rf.gen("answer", max_tokens=max_tokens, stop="\n")


def rag_inputs(rng, n, size):
    corpus = [f"[{i}] " + words(rng, int(60 * size)) for i in range(6)]
    out = []
    for _ in range(n):
        first = rng.randrange(3)  # questions on one topic retrieve the same passages
        out.append({"passages": "\n".join(corpus[first * 2 : first * 2 + 2]), "question": words(rng, 10) + "?"})
    return out


WORKLOADS = [
    Workload("mmlu", mmlu, mmlu_inputs),
    Workload("hellaswag", hellaswag, hellaswag_inputs),
    Workload("react", react, react_inputs, traceable=False),
    Workload("generative_agents", generative_agent, agent_inputs),
    Workload("tree_of_thought", tree_of_thought, tot_inputs),
    Workload("skeleton_of_thought", skeleton_of_thought, sot_inputs),
    Workload("llm_judge", llm_judge, judge_inputs),
    Workload("json_decode", json_decode, json_inputs),
    Workload("multi_turn_chat", multi_turn_chat, chat_inputs),
    Workload("dspy_rag", dspy_rag, rag_inputs),
]
BY_NAME = {w.name: w for w in WORKLOADS}
