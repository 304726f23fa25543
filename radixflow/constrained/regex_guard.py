"""Builds a regex's DFA in a child process that is killed past a time limit, before the
outlines backend compiles it against the model's vocabulary.

Some regexes have exponentially large DFAs (`(a|b)*a(a|b){24}`): outlines-core then runs
for hours and cannot be interrupted, so a compile thread that started one would be lost
to every later grammar. The byte-level DFA (the same regex engine over a 256-token
vocabulary) shows the blow-up first; building it in a child process lets the limit end it:

    check_regex_dfa(regex, timeout_s)   # "", or outlines-core's message; GrammarError: too large to build in time
    regex_dfa_size(regex, timeout_s)    # (that message, the byte-level DFA's state count)

Children (child_process.py's pattern) import only outlines_core, say they are ready (their start does not count against
the limit), take one regex per line and stay alive between checks (a few are kept idle);
a child that runs past its limit, or past its memory limit, is killed.
"""

from __future__ import annotations

import json
import select
import subprocess
import threading
import time

from radixflow.constrained.child_process import READY, spawn, stop, wait_ready
from radixflow.errors import GrammarError

MEMORY_LIMIT_BYTES = 2 << 30
IDLE_CHILDREN = 2
START_TIMEOUT_S = 60.0  # a child's start (python + outlines_core) does not count against the check's limit

_CHILD = f"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT_BYTES}, {MEMORY_LIMIT_BYTES}))
from outlines_core import Index, Vocabulary
vocab = Vocabulary(256, {{bytes([b]): [b] for b in range(256)}})
sys.stdout.write({READY.decode()!r})
sys.stdout.flush()
for line in sys.stdin:
    try:
        out = ["", len(Index(json.loads(line), vocab).get_transitions())]
    except ValueError as e:
        out = [str(e) or "cannot be compiled", 0]
    sys.stdout.write(json.dumps(out) + "\\n")
    sys.stdout.flush()
"""

_idle: list = []
_lock = threading.Lock()


def check_regex_dfa(regex: str, timeout_s: float) -> str:
    """outlines-core's error message for `regex` ("" when it compiles). Raises
    GrammarError when its DFA is not built within `timeout_s` seconds or the memory limit."""
    return regex_dfa_size(regex, timeout_s)[0]


def regex_dfa_size(regex: str, timeout_s: float) -> tuple[str, int]:
    """(check_regex_dfa's message, the byte-level DFA's state count: the token index's states
    and compile time grow with it, so auto's background compile refuses large ones up front)."""
    child = _take()
    deadline = time.monotonic() + timeout_s
    ready: list = []
    try:
        child.stdin.write(json.dumps(regex) + "\n")
        child.stdin.flush()
        ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = child.stdout.readline() if ready else ""
    except (BrokenPipeError, OSError):
        line = ""
    if not line:
        stop(child)
        why = f"within the {timeout_s:g} s limit (--grammar-compile-timeout-s)" if not ready else "within the memory limit"
        raise GrammarError(
            f"this regex's automaton is too large to build {why}: long counted repeats (a JSON schema's minLength / "
            "maxItems of tens, x{30,}) multiply its states, and a repeat after an alternation, such as (a|b)*a(a|b){24}, "
            "grows it exponentially; make the counts smaller, or use --grammar-backend llguidance (no automaton)"
        )
    _give_back(child)
    error, states = json.loads(line)
    return error, states


def _take() -> subprocess.Popen:
    with _lock:
        while _idle:
            child = _idle.pop()
            if child.poll() is None:
                return child
    child = spawn(_CHILD, text=True)
    if not wait_ready(child, START_TIMEOUT_S):
        stop(child)
        raise GrammarError("the regex checker process did not start; retry the request")
    return child


def _give_back(child: subprocess.Popen) -> None:
    with _lock:
        if len(_idle) < IDLE_CHILDREN:
            _idle.append(child)
            return
    stop(child)
