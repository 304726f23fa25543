"""SGLang 0.5.23's own frontend test programs (sglang/test/test_programs.py), loaded
unchanged except that `import sglang as sgl` becomes `import radixflow as sgl`.

    python tests/sglang_programs.py                    # all 19 on an in-process Engine
    python tests/sglang_programs.py runtime            # on rf.Runtime(), as SGLang's own runner does

Besides the plain count, it runs two checks that are counted apart, never as passing:
- the programs that fail on the default 135M model's answers, against `ScriptedBackend`, a
  stand-in model that writes what each program expects: the DSL's part (stops, run_batch,
  select, control flow, joins, speculation) works when the model answers well;
- test_gen_min_new_tokens with SGLang's tokenizer helper replaced by transformers'
  AutoTokenizer: the helper's module imports torchvision, which is not installed here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import os
import sys
import types
from typing import Optional

from radixflow.lang.backends.base import Backend, TokenUsage
from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.interpreter import GenResult, SelectResult

ARGS = {"test_select": {"check_answer": False}}  # what SGLang's own runner passes


def source_path() -> str:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "sglang is not installed"
    return os.path.join(os.path.dirname(spec.origin), "test", "test_programs.py")


def load() -> types.ModuleType:
    with open(source_path()) as f:
        src = f.read()
    assert src.count("import sglang as sgl") == 2, "test_programs.py changed upstream"
    mod = types.ModuleType("sglang_test_programs_on_radixflow")
    mod.__file__ = source_path()
    exec(compile(src.replace("import sglang as sgl", "import radixflow as sgl"), mod.__file__, "exec"), mod.__dict__)
    return mod


def programs(mod: types.ModuleType) -> list[str]:
    return [n for n, f in vars(mod).items() if n.startswith("test_") and inspect.isfunction(f)]


def run_all(names: Optional[list] = None) -> dict:
    """{program: "pass" | "<error>"} on the default backend already set."""
    mod = load()
    out = {}
    for name in names or programs(mod):
        try:
            getattr(mod, name)(**ARGS.get(name, {}))
            out[name] = "pass"
        except Exception as e:  # report every program, not only the first failure
            out[name] = f"{type(e).__name__}: {str(e).strip()[:200]}"
    return out


# -- a stand-in model for the programs whose checks the 135M model fails ------------------------------
class ScriptedBackend(Backend):
    """Continues a prompt with the text of the first script entry whose key the prompt ends
    with, cut at the gen's first stop string as a server would; select picks the scripted
    choice. Counts token_usage as whitespace-separated words; `prompts` lists every call's."""

    def __init__(self, script: list):
        self.script = script
        self.token_usage = TokenUsage()
        self.prompts: list = []

    def chat_template(self) -> ChatTemplate:
        return ChatTemplate.plain()

    def _answer(self, prompt_text: str) -> str:
        self.prompts.append(prompt_text)
        for suffix, text in self.script:
            if prompt_text.endswith(suffix):
                return text
        raise AssertionError(f"the script has no answer for a prompt ending {prompt_text[-60:]!r}")

    def generate(self, prompt, params, node=None):
        text = self._answer(prompt.text)
        stops = params.get("stop") or []
        cuts = [i for i in (text.find(s) for s in ([stops] if isinstance(stops, str) else stops)) if i >= 0]
        out = text[: min(cuts)] if cuts else text
        meta = {"prompt_tokens": len(prompt.text.split()), "completion_tokens": len(out.split()),
                "finish_reason": {"type": "stop"}}  # fmt: skip
        self.token_usage.add(meta)
        return GenResult(out, None, meta)

    def select(self, prompt, choices, method, node=None) -> SelectResult:
        return SelectResult(choices.index(self._answer(prompt.text)), None, {})


MICROSOFT = "Action 3: Finish [United States].\n\n"
SCRIPTS = {  # program -> [(prompt suffix, what the stand-in model writes)]
    "test_few_shot_qa": [
        ("United States?\nA:", " Washington, D.C.\nQ: What is"),
        ("Japan?\nA:", " Tokyo\n"),
        ("United Kingdom?\nA:", " London\n"),
        ("China?\nA:", " Beijing\nQ:"),
    ],
    "test_decode_int": [("in a day is ", "24\nThe number"), ("in a year is ", "365 days\n")],
    "test_expert_answer": [
        ("answer this question is", " a geographer. They know maps.\n"),
        ("would answer that ", "Paris is the capital of France. It is"),
    ],
    "test_react": [
        ("Thought 1:", " I need to find the creator of Linux.\n"),
        ("Action 1: ", "Search"),
        ("Action 1: Search [", "Creator of Linux].\n"),
        ("Observation 1:", " Linus Torvalds created Linux and lives in the United States.\n"),
        ("Thought 2:", " The answer is the United States.\n"),
        ("Action 2: ", "Finish"),
        ("Action 2: Finish [", "United States].\n"),
    ],
    "test_parallel_encoding": [("ASSISTANT:", " Noah is the father of Julian.")],
    "test_completion_speculative": [
        ("Name:", " Ada Lovelace\nBirthday: December 10, 1815\nJob: Mathematician\nName: x"),
        ("\nBirthday:", " December 10, 1815\nJob: Mathematician\n"),
        ("\nJob:", " Mathematician\n"),
    ],
}


def run_scripted(names: Optional[list] = None) -> dict:
    """{program: "pass" | "<error>"}, each on its own ScriptedBackend as the default backend."""
    import radixflow as rf
    from radixflow.lang.backends import get_default_backend

    before = get_default_backend()
    out = {}
    try:
        for name in names or list(SCRIPTS):
            rf.set_default_backend(ScriptedBackend(SCRIPTS[name]))
            out.update(run_all([name]))
    finally:
        rf.set_default_backend(before)
    return out


# -- test_gen_min_new_tokens without torchvision ---------------------------------------------------------
HELPER = "sglang.srt.utils.hf_transformers_utils"


@contextlib.contextmanager
def tokenizer_helper_without_torchvision():
    """While open, `from sglang.srt.utils.hf_transformers_utils import get_tokenizer` gives
    transformers' AutoTokenizer.from_pretrained if the real module cannot be imported for want of
    torchvision (it can load the server's model directory either way)."""
    try:
        importlib.import_module(HELPER)
        yield
        return
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            raise
    from transformers import AutoTokenizer

    shim = types.ModuleType(HELPER)
    shim.get_tokenizer = AutoTokenizer.from_pretrained
    saved = sys.modules.get(HELPER)
    sys.modules[HELPER] = shim
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(HELPER, None)
        else:
            sys.modules[HELPER] = saved


def main() -> None:
    import radixflow as rf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backend", nargs="?", choices=["engine", "runtime"], default="engine")
    args = ap.parse_args()
    backend = rf.Engine() if args.backend == "engine" else rf.Runtime()
    try:
        rf.set_default_backend(backend)
        results = run_all()
        if args.backend == "runtime":
            with tokenizer_helper_without_torchvision():
                helper = run_all(["test_gen_min_new_tokens"])["test_gen_min_new_tokens"]
    finally:
        backend.shutdown()
    for name, res in results.items():
        print(f"{name}: {res}")
    print(f"{sum(r == 'pass' for r in results.values())} of {len(results)} pass unchanged on {args.backend}")
    scripted = run_scripted([n for n in SCRIPTS if results.get(n) != "pass"])
    for name, res in scripted.items():
        print(f"scripted model, {name}: {res}")
    if args.backend == "runtime":
        print(f"test_gen_min_new_tokens with transformers' AutoTokenizer for SGLang's helper: {helper}")


if __name__ == "__main__":
    main()
