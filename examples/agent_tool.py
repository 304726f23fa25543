"""A multi-turn agent with a tool call in Python: the model writes an arithmetic
expression, Python evaluates it (with a small parser of its own: model text is never
passed to eval), and the result goes back into the conversation.

Reading s["expression"] in Python makes the program data-dependent, so it runs eagerly
(one request per gen); the shared conversation prefix still comes from the radix cache.

    python examples/agent_tool.py
"""

from __future__ import annotations

import re

import radixflow as rf

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")
MAX_EXPRESSION_CHARS = 200


def evaluate_arithmetic(text: str) -> float:
    """+ - * / and parentheses over decimal numbers. Raises ValueError on anything else."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    tokens = [m.group(1) or m.group(2) for m in _TOKEN.finditer(text.strip())]
    value, rest = _sum(tokens)
    if rest:
        raise ValueError(f"unexpected {rest[0]!r}")
    return value


def _sum(tokens: list) -> tuple[float, list]:
    value, tokens = _product(tokens)
    while tokens and tokens[0] in "+-":
        op, (rhs, tokens) = tokens[0], _product(tokens[1:])
        value = value + rhs if op == "+" else value - rhs
    return value, tokens


def _product(tokens: list) -> tuple[float, list]:
    value, tokens = _atom(tokens)
    while tokens and tokens[0] in "*/":
        op, (rhs, tokens) = tokens[0], _atom(tokens[1:])
        if op == "/" and rhs == 0:
            raise ValueError("division by zero")
        value = value * rhs if op == "*" else value / rhs
    return value, tokens


def _atom(tokens: list) -> tuple[float, list]:
    if not tokens:
        raise ValueError("expression ends early")
    head, rest = tokens[0], tokens[1:]
    if head == "-":
        value, rest = _atom(rest)
        return -value, rest
    if head == "(":
        value, rest = _sum(rest)
        if not rest or rest[0] != ")":
            raise ValueError("missing )")
        return value, rest[1:]
    try:
        return float(head), rest
    except ValueError:
        raise ValueError(f"unexpected {head!r}") from None


def format_number(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.4g}"


@rf.function
def calculator_agent(s, question):
    s += rf.system("You turn word problems into arithmetic. Answer with an expression only, like 3 * (4 + 5).")
    s += rf.user("Tom has 3 bags with 4 apples each. How many apples?")
    s += rf.assistant("3 * 4")
    s += rf.user(question)
    with s.assistant():
        s += rf.gen("expression", max_tokens=16, stop=["\n", "="])
    try:  # the tool call, in Python
        s["result"] = format_number(evaluate_arithmetic(s["expression"]))
    except ValueError as e:
        s["result"] = f"error: {e}"
    s += rf.user(f"The calculator says {s['result']}. State the final answer in one sentence.")
    s += rf.assistant(rf.gen("answer", max_tokens=16))


def main() -> None:
    rf.set_default_backend(rf.Engine())
    s = calculator_agent.run(question="A box holds 12 eggs. How many eggs are in 7 boxes?", temperature=0)
    print("mode:", s.mode)
    print("expression:", s["expression"], "->", s["result"])
    for m in s.messages():
        print(f"[{m['role']}] {m['content']}")


if __name__ == "__main__":
    main()
