"""Shared fixtures: one default-model Engine and one transformers reference per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `import radixflow` does; torch is imported first here
import torch  # noqa: E402

# under pytest-xdist (`make test`) the workers share the machine's cores: one torch thread each, not two each
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 2) // _WORKERS)))
# Without CUDA the Triton kernels run in Triton's interpreter, which must be chosen before the
# first import of triton, and any test module (e.g. the FlashInfer backend's, through the Triton
# backend it extends) may be first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from triton_interpreter import skip_repeated_language_patching

    skip_repeated_language_patching()

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three colors:",
    "Translate to French: I love reading books in the garden on sunny afternoons.",
    "Q: What is 12 plus 30?\nA:",
    "The quick brown fox",
    "In 1969, the first humans landed on the Moon. The mission was called Apollo 11 and the astronauts were Neil Armstrong, Buzz Aldrin and Michael Collins. Afterwards,",
]


# The files that take longest (minutes on one worker), longest first: `make test` hands them out first
# (--no-loadscope-reorder: xdist would order the files by their number of tests), so that the other worker's
# files run beside them instead of after them. test_kernel_compile is ~2.5 min of sm_90 compiles with a cold cache.
LONG_FIRST = ("test_kernel_compile.py", "test_docs.py", "test_router.py", "test_tp_cpu.py", "test_overlap_schedule.py",
              "test_engine_behaviour.py", "test_kernels.py", "test_server_lifecycle.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def engine():
    from radixflow import Engine

    # llguidance, named (the server default, auto, is llguidance on a CPU): a test comparing two runs of one grammar
    # must not see it move to outlines in between, as it could under auto (which has its own tests, with backends of their own)
    e = Engine(grammar_backend="llguidance")
    yield e
    e.shutdown()


@pytest.fixture(scope="session")
def model_dir(engine) -> str:
    return engine.runner.model_dir


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="session")
def tokenizer(engine):
    return engine.tokenizer


# -- serving (issue 3): one real server for the whole session ---------------------------------------
SERVER_FAULT_PREFIX = "fault-"  # requests whose rid starts so make the scheduler raise (tests the 500 path)


@pytest.fixture(scope="session")
def server():
    from serving_helpers import start_server

    s = start_server(
        "--max-total-tokens", "32768", "--max-batch-size", "24", "--max-new-tokens-limit", "2048",
        "--max-body-bytes", "200000", "--stream-interval", "1", "--log-interval-s", "5", "--reasoning-parser", "qwen3",
        env={"RADIXFLOW_TEST_FAULT_RID_PREFIX": SERVER_FAULT_PREFIX},
    )  # fmt: skip
    yield s
    s.stop()
