"""An outlines compile (token index, transitions, distances) in a child process, for auto's moves.

outlines-core's `get_transitions` is one call that holds the GIL for the whole transition table
(0.8 s for the benchmark schema on a 49k vocabulary), and the Python that flattens it competes for
the GIL too: run in the server's process, a move pauses the scheduler. Here a fresh child process
(child_process.py's pattern) does the whole compile under a hard wall-clock limit
(it is killed past it) and an address-space cap, and refuses arrays over a byte bound before sending
them. The parent waits on the pipe without the GIL; what it still holds the GIL for is unpickling the
result (outlines-core's index and the numpy arrays: tens of milliseconds for the benchmark schema).

    grammar = compile_isolated(regex, vocab, Limits(time_s=10, max_bytes=512 << 20, memory_bytes=4 << 30))
"""

from __future__ import annotations

import importlib
import pickle
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from radixflow.constrained.child_process import READY, read_exact, spawn, stop, wait_ready
from radixflow.errors import GrammarError

if TYPE_CHECKING:  # outlines-core behind them: imported where a compile runs, so ServerArgs and the engine load without it
    from radixflow.constrained.fsm import CompiledGrammar
    from radixflow.constrained.vocabulary import TokenVocab

# the default target's modules (fsm.py, vocabulary.py) need numpy and outlines-core only; the packages' __init__
# (radixflow's imports ServerArgs, and with it torch) would add seconds to every move's start
BARE_PACKAGES = [(name, list(importlib.import_module(name).__path__)) for name in ("radixflow", "radixflow.constrained")]
START_S = 60.0  # the child's start (python, numpy, outlines-core) is not counted against the compile's limit

# the parent's import path, and packages to import without their __init__
PRELUDE = """
import pickle, resource, sys, types
paths, bare = pickle.load(sys.stdin.buffer)
sys.path[:0] = paths
for name, path in bare:
    sys.modules[name] = module = types.ModuleType(name)
    module.__path__ = path
"""
_CHILD = PRELUDE + f"READY = {READY!r}\n" + """
target, regex, vocab, max_bytes, memory = pickle.load(sys.stdin.buffer)
sys.stdout.buffer.write(READY)  # imports done: the compile's clock starts
sys.stdout.buffer.flush()
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + memory, used + memory))
try:
    g = target(regex, vocab)
    size = g.tokens.nbytes + g.next_dist.nbytes
    g.vocab = None  # the parent has it
    out = ("ok", g) if size <= max_bytes else ("error", f"its arrays take {size >> 20} MiB, over the {max_bytes >> 20} MiB allowed")
except ValueError as e:
    out = ("refused", str(e))
except MemoryError:
    out = ("error", "its outlines compile ran out of the memory allowed")
except Exception as e:
    out = ("error", f"its outlines compile failed ({type(e).__name__}: {e})")
data = pickle.dumps(out, protocol=5)
sys.stdout.buffer.write(len(data).to_bytes(8, "little") + data)
"""


@dataclass(frozen=True)
class Limits:
    time_s: float  # wall clock of the compile, the child's start excluded
    max_bytes: int  # the grammar's token / next-distance arrays
    memory_bytes: int  # address space the child may add once started


def compile_isolated(regex: str, vocab: TokenVocab, limits: Limits,
                     target: Optional[Callable[[str, TokenVocab], CompiledGrammar]] = None) -> CompiledGrammar:
    """`target(regex, vocab)` (a module-level function: it is pickled by name; default fsm.compile_regex,
    in a child that skips radixflow's package imports) run in a child process. Raises GrammarError past the limits, ValueError with outlines-core's message when
    it refuses."""
    bare = []
    if target is None:
        from radixflow.constrained.fsm import compile_regex as target

        bare = BARE_PACKAGES
    child = spawn(_CHILD)
    try:
        child.stdin.write(pickle.dumps((list(sys.path), bare)) + pickle.dumps((target, regex, vocab, limits.max_bytes, limits.memory_bytes)))
        child.stdin.close()
        if not wait_ready(child, START_S):
            raise GrammarError("the outlines compile process did not start")
        fd, deadline = child.stdout.fileno(), time.monotonic() + limits.time_s
        size = int.from_bytes(read_exact(fd, deadline, 8) or b"\0", "little")
        out = read_exact(fd, deadline, size) if size else b""
    except TimeoutError:
        raise GrammarError(f"its outlines compile ran past {limits.time_s:g} s and was stopped") from None
    finally:
        stop(child)
    if not out:
        raise GrammarError("its outlines compile ran out of the memory allowed (the compile process died)")
    status, result = pickle.loads(out)
    if status == "refused":
        raise ValueError(result)
    if status != "ok":
        raise GrammarError(result)
    result.vocab = vocab
    return result

