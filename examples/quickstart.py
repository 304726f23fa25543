"""Quickstart: a radixflow program on the embedded default model, in-process.

    python examples/quickstart.py
"""

from __future__ import annotations

import radixflow as rf


@rf.function
def qa(s, question):
    s += rf.system("You are a helpful assistant. Answer briefly.")
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=32))
    s += rf.user("Is that answer certain?")
    s += rf.assistant(rf.select("certain", ["Yes", "No"]))


def main() -> None:
    engine = rf.Engine()
    rf.set_default_backend(engine)

    print(qa.trace(question="What is the capital of France?"))  # the request graph

    state = qa.run(question="What is the capital of France?", temperature=0)
    print("ran as:", state.mode, "-", state.program_meta["num_requests"], "scheduler requests")
    print("answer:", state["answer"], "| certain:", state["certain"])
    for m in state.messages():
        print(f"  [{m['role']}] {m['content']}")

    print("streaming: ", end="")
    for delta in qa.run(question="Name a primary color.", temperature=0, stream=True).text_iter("answer"):
        print(delta, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
