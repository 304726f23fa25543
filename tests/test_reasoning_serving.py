"""Reasoning separated on the default model: a regex makes it write a thinking block, so the
real server (started with --reasoning-parser qwen3, conftest.py) and the DSL on the Engine see one."""

from __future__ import annotations

import json
import re

import pytest
from test_server_native import sse_events

import radixflow as rf

THINKING = r"<think>[a-z]{2,8}( [a-z]{2,8}){2,4}</think>[A-Z][a-z]{2,8}( [a-z]{2,8}){1,3}"
MESSAGES = [{"role": "user", "content": "Think first, then name a fruit."}]


def _chat(server, **body) -> dict:
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "default", "messages": MESSAGES, "max_tokens": 60,
                                                  "temperature": 0, "regex": THINKING, **body})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_message_has_reasoning_content_and_usage(server):
    whole = _chat(server, separate_reasoning=False)["choices"][0]["message"]
    assert whole["reasoning_content"] is None and whole["content"].startswith("<think>")
    r = _chat(server)
    msg = r["choices"][0]["message"]
    thinking, answer = whole["content"][len("<think>") :].split("</think>")
    assert (msg["reasoning_content"], msg["content"]) == (thinking, answer)
    spent = r["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert r["usage"]["reasoning_tokens"] == spent and 0 < spent < r["usage"]["completion_tokens"]


def test_chat_without_thinking_has_no_reasoning_content(server):
    r = _chat(server, regex="[A-Z][a-z]{2,8}")
    assert r["choices"][0]["message"]["reasoning_content"] is None and r["usage"]["reasoning_tokens"] == 0


def test_a_grammar_starts_after_the_thinking_block_the_prompt_opened(server):
    """A prompt that ends with `<think>` (as deepseek-r1's template writes it) puts the output inside the block. A
    grammar that does not write `</think>` itself starts after the block, as SGLang applies it with
    --reasoning-parser (before session 34 it covered the whole output, so a forced-thinking model did not think);
    the budget closes the block in time for the answer. The default model does not end its thinking on its own."""
    opened = MESSAGES + [{"role": "assistant", "content": "<think>"}]
    free = _chat(server, messages=opened, regex=None, max_tokens=5, continue_final_message=True)
    assert free["choices"][0]["message"]["reasoning_content"]  # no grammar: the block the prompt opened
    r = _chat(server, messages=opened, regex="[A-Z][a-z]{2,8}", continue_final_message=True)
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] and re.fullmatch("[A-Z][a-z]{2,8}", msg["content"])
    assert r["choices"][0]["finish_reason"] == "length" and r["choices"][0]["grammar_closed"]
    schema = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 12}}, "required": ["fruit"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "fruit", "schema": schema}}
    msg = _chat(server, messages=opened, regex=None, response_format=fmt, continue_final_message=True)["choices"][0]["message"]
    assert msg["reasoning_content"] and set(json.loads(msg["content"])) == {"fruit"}
    writes_end = _chat(server, messages=opened, regex="[a-z]{2,8}</think>[A-Z][a-z]{2,8}", continue_final_message=True)
    msg = writes_end["choices"][0]["message"]  # a grammar that closes the block writes the thinking before it
    assert msg["reasoning_content"] and msg["content"][:1].isupper() and "</think>" not in msg["content"]


def test_an_empty_thinking_block_has_no_reasoning_content_whole_or_streamed(server):
    """`<think></think>` then the answer: reasoning_content null in the whole response, as its stream sends no
    reasoning_content delta (the whole response said "" before: the two disagreed)."""
    regex = "<think></think>[A-Z][a-z]{2,8}"
    want = _chat(server, regex=regex)["choices"][0]["message"]
    assert want["reasoning_content"] is None and want["content"][:1].isupper() and "<think>" not in want["content"]
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 60, "temperature": 0, "regex": regex, "stream": True}
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        deltas = [e["choices"][0]["delta"] for e in sse_events(r.iter_lines())[:-1]]
    assert not any("reasoning_content" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == want["content"]


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_chat_stream_sends_reasoning_deltas(server, stream_reasoning):
    want = _chat(server)["choices"][0]["message"]
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 60, "temperature": 0, "regex": THINKING,
            "stream": True, "stream_reasoning": stream_reasoning}  # fmt: skip
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r.iter_lines())
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    thinking = [d["reasoning_content"] for d in deltas if d.get("reasoning_content")]
    assert "".join(thinking) == want["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == want["content"]
    assert len(thinking) == 1 if not stream_reasoning else len(thinking) > 1
    assert all("<think>" not in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)


def test_separate_reasoning_route(server):
    with server.client() as c:
        r = c.post("/separate_reasoning", json={"text": "plan</think>Paris", "reasoning_parser": "deepseek-r1"})
        assert r.json() == {"text": "Paris", "reasoning_text": "plan"}
        r = c.post("/separate_reasoning", json={"text": "<think>plan</think>Paris"})  # the server's qwen3
        assert r.json() == {"text": "Paris", "reasoning_text": "plan"}
        bad = c.post("/separate_reasoning", json={"text": "x", "reasoning_parser": "o1"})
        assert bad.status_code == 400 and "choose one of deepseek-r1" in bad.json()["error"]["message"]
        bad = c.post("/v1/chat/completions", json={"messages": MESSAGES, "separate_reasoning": "yes"})
        assert bad.status_code == 400 and "separate_reasoning must be true or false" in bad.text


# -- the DSL on the Engine ---------------------------------------------------------------------------------
@rf.function
def think_then_answer(s):
    s += rf.user("Think first, then name a fruit.")
    s += rf.assistant(rf.separate_reasoning(rf.gen("fruit", regex=THINKING, max_tokens=60), model_type="qwen3"))


@rf.function
def think_then_follow_up(s):
    s += rf.user("Think first, then name a fruit.")
    s += rf.assistant(rf.separate_reasoning(rf.gen("fruit", regex=THINKING, max_tokens=60), model_type="qwen3"))
    s += rf.user("Why?")
    s += rf.assistant(rf.gen("why", max_tokens=4))


@pytest.mark.parametrize("mode", ["auto", "eager"])
def test_program_separates_reasoning(engine, mode):
    st = think_then_answer.run(backend=engine, mode=mode, temperature=0)
    assert st.mode == ("graph" if mode == "auto" else "eager")
    assert st["fruit_reasoning_content"] and st["fruit"][0].isupper() and "<think>" not in st.text()
    assert st.text().endswith(st["fruit"] + "<|im_end|>\n")


def test_follow_up_after_separate_reasoning_runs_eagerly_without_the_thinking(engine):
    """A gen after the split must not see the thinking, so the program runs eagerly; the
    follow-up's prompt is the text without it, token for token."""
    st = think_then_follow_up.run(backend=engine, temperature=0)
    first = think_then_answer.run(backend=engine, temperature=0)
    assert st.mode == "eager" and st["fruit"] == first["fruit"]
    before_why = st.text()[: st.text().rindex(st["why"])]
    prompt_tokens = st.get_meta_info("why")["prompt_tokens"]
    assert prompt_tokens == len(engine.tokenizer.encode(before_why, add_special_tokens=False))
    assert "<think>" not in before_why
