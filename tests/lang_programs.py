"""Programs shared by the lang tests, examples and the benchmark-style checks."""

from __future__ import annotations

import radixflow as rf

FEW_SHOT = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of Spain?\nA: Madrid\n"


@rf.function
def few_shot_qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:" + rf.gen("answer", max_tokens=8, stop="\n")


@rf.function
def chat_two_turns(s, question):
    s += rf.system("You are a terse assistant.")
    s += rf.user(question)
    with s.assistant():
        s += rf.gen("first", max_tokens=8)
    s.user("And in one word?")
    s += rf.assistant(rf.gen("second", max_tokens=4))


@rf.function
def capital_select(s, country, method=None):
    s += f"The capital of {country} is"
    s += rf.select("capital", [" Paris", " a banana", " Rome"], choices_method=method)
    s += "." + rf.gen("after", max_tokens=4)


@rf.function
def tips(s, topic):
    s += f"Here are tips about {topic}.\n"
    forks = s.fork(3)
    forks += lambda i: f"Tip {i + 1}:" + rf.gen("tip", max_tokens=5, stop="\n")
    forks.join()
    s += "Summary:" + rf.gen("summary", max_tokens=4)


@rf.function
def concat_story(s, name):
    s += f"A short story about {name}.\n"
    forks = s.fork(2)
    forks += lambda i: ["Morning:", "Evening:"][i] + rf.gen("part", max_tokens=5, stop="\n") + "\n"
    forks.join("concate_and_append")
    s += "The end:" + rf.gen("ending", max_tokens=4)


@rf.function
def one_sentence(s, topic):
    s += f"Write one sentence about {topic}.\n" + rf.gen("sentence", max_tokens=16) + "\nDone."


@rf.function
def template_fill(s, name):
    """The benchmark's 5-gen template-filling program (gen length from run(max_new_tokens=...))."""
    s += f"Fill in a profile card for {name}.\n"
    for field in ("Job", "City", "Hobby", "Pet", "Motto"):
        s += f"{field}:" + rf.gen(field.lower(), stop="\n") + "\n"
