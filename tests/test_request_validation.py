"""One validation for every route (issue 27). Here: SGLang's own top-level fields are
accepted at values that change nothing (sglang-router adds them), any other unknown field
is refused."""

from __future__ import annotations

import pytest

from radixflow.errors import RadixflowError


def test_unknown_top_level_fields_are_refused(server, engine):
    with server.client() as c:
        answers = {
            "/generate": c.post("/generate", json={"text": "hi", "return_logprobs": True}),
            "/v1/completions": c.post("/v1/completions", json={"prompt": "hi", "return_logprobs": True}),
            "/v1/chat/completions": c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                         "return_logprobs": True}),  # fmt: skip
        }
    for route, r in answers.items():
        assert r.status_code == 400, (route, r.text)
        assert "unknown field" in r.json()["error"]["message"], (route, r.text)
    with pytest.raises(RadixflowError, match="return_logprobs"):
        engine.generate("hi", {"max_new_tokens": 1}, return_logprobs=True)


def test_sglang_fields_are_accepted_when_they_change_nothing(server, engine):
    router_extras = {"return_hidden_states": False, "data_parallel_rank": 0, "bootstrap_room": None, "priority": 3,
                     "lora_path": [None], "log_metrics": True}  # fmt: skip
    chat_extras = {"continue_final_message": False, "return_hidden_states": False, "separate_reasoning": True,
                   "bootstrap_host": None, "routed_dp_rank": 1}  # fmt: skip
    want = engine.generate("The capital of France is", {"max_new_tokens": 3, "temperature": 0})
    with server.client() as c:
        native = c.post("/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                                           **router_extras})  # fmt: skip
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                    **chat_extras})  # fmt: skip
        hidden = c.post("/generate", json={"text": "hi", "return_hidden_states": True})
        lora = c.post("/v1/completions", json={"prompt": "hi", "lora_path": "my-adapter"})
    assert native.status_code == 200 and native.json()["output_ids"] == want["output_ids"]
    assert chat.status_code == 200, chat.text
    assert engine.generate("The capital of France is", {"max_new_tokens": 3, "temperature": 0},
                           return_hidden_states=False)["output_ids"] == want["output_ids"]  # fmt: skip
    for r, field in ((hidden, "return_hidden_states"), (lora, "lora_path")):
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    with pytest.raises(RadixflowError, match="return_hidden_states"):
        engine.generate("hi", return_hidden_states="last")


def test_continue_final_message_continues_the_assistant_turn(server, engine):
    from radixflow.runtime.tokenizer import apply_chat_template

    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"}]  # fmt: skip
    prompt = apply_chat_template(engine.tokenizer, messages, add_generation_prompt=False, continue_final_message=True)
    assert prompt.rstrip().endswith("The capital of France is")
    want = engine.generate(input_ids=engine.tokenizer.encode(prompt, add_special_tokens=False),
                           sampling_params={"max_new_tokens": 4, "temperature": 0})  # fmt: skip
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0,
                                                 "continue_final_message": True})  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want["text"]
