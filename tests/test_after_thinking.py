"""A grammar after a reasoning model's thinking block (constrained/after_thinking.py): the block's regex, the
compositions on both backends with the default model's tokenizer, llguidance's closing search through a block, and
when the chat route composes (openai_request._think_first)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixflow.constrained import Grammar
from radixflow.constrained.after_thinking import END_MARKERS, Composed, after_thinking, composed_parts, free_text_then
from radixflow.runtime.reasoning import FORMATS

ENDS = sorted({f.end for f in FORMATS.values()})
MARKERS = sorted({(f.start, f.end) for f in FORMATS.values()})
SCHEMA = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 12}}, "required": ["fruit"]}


def test_the_composition_knows_every_reasoning_formats_end_marker():
    assert sorted(END_MARKERS) == ENDS  # constrained/ keeps its own list: it does not import runtime/


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ENDS), st.data())
def test_the_block_is_any_text_up_to_the_first_end_marker(end, data):
    """Every format's end marker, against the definition, on texts built from the marker's own characters."""
    pieces = st.sampled_from([*end, end, end[:-1], "x", "\n", "é"])
    text = "".join(data.draw(st.lists(pieces, max_size=12)))
    first = text.find(end)
    assert bool(re.fullmatch(free_text_then(end), text)) == (first >= 0 and first == len(text) - len(end))


def test_a_regex_after_a_block_the_prompt_opened_or_an_optional_one():
    kind, inside = after_thinking("regex", "^[A-Z][a-z]+$", "<think>", "</think>", True, "llguidance")
    _, optional = after_thinking("regex", "[A-Z][a-z]+", "<think>", "</think>", False, "outlines")
    assert kind == "regex"
    for text, want_inside, want_optional in [
        ("plan</think>Paris", True, False), ("</think>Paris", True, False), ("a</think>b</think>Paris", False, False),
        ("<think>plan</think>Paris", True, True), ("Paris", False, True), ("plan</think>paris", False, False),
    ]:  # fmt: skip
        assert (bool(re.fullmatch(inside, text)), bool(re.fullmatch(optional, text))) == (want_inside, want_optional), text
    assert composed_parts("regex", inside) == Composed("</think>", "", "regex", "[A-Z][a-z]+")
    assert composed_parts("regex", optional).opening == "<think>"
    assert composed_parts("regex", "[A-Z][a-z]+") is None and composed_parts("json_schema", SCHEMA) is None


CASES = [("regex", "[A-Z][a-z]{2,8}", "Paris"), ("json_schema", SCHEMA, '{"fruit":"fig"}'),
         ("ebnf", 'start: "fruit: " /[a-z]+/', "fruit: fig"), ("ebnf", 'root ::= "fruit: " [a-z]+', "fruit: fig")]  # fmt: skip


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
@pytest.mark.parametrize("kind,spec,answer", CASES)
def test_each_composition_compiles_and_takes_thinking_then_the_answer(tokenizer, backend, kind, spec, answer):
    """With the default model's tokenizer (the end marker is several tokens there). An ebnf grammar on outlines is
    left as it is (outlines has no ebnf)."""
    if backend == "outlines" and kind == "ebnf":
        assert after_thinking(kind, spec, "<think>", "</think>", True, backend) == (kind, spec)
        return
    for inside, opened in ((True, ""), (False, "<think>")):
        new_kind, new_spec = after_thinking(kind, spec, "<think>", "</think>", inside, backend)
        g = Grammar.compile(new_kind, new_spec, tokenizer=tokenizer, backend=backend)
        assert g.accepts(f"{opened}I think a fig.</think>{answer}") and g.accepts(f"{opened}</think>{answer}")
        assert not g.accepts(f"{opened}I think</think>a fig</think>{answer}") and not g.accepts(f"{opened}I think")
        assert g.accepts(answer) == (not inside)  # an optional block: the answer alone
        assert composed_parts(new_kind, new_spec).end == "</think>"


@pytest.mark.parametrize("start,end", MARKERS)
def test_every_formats_markers_compose_on_llguidance(tokenizer, start, end):
    new_kind, new_spec = after_thinking("json_schema", SCHEMA, start, end, False, "llguidance")
    g = Grammar.compile(new_kind, new_spec, tokenizer=tokenizer, backend="llguidance")
    assert g.accepts(f'{start}a{start}b{end}{{"fruit":"fig"}}') and g.accepts('{"fruit":"fig"}')
    assert g.compiled.lead is not None and not g.accepts(f'a{end}{{"fruit":"fig"}}')


def _search(tokenizer, kind, spec, prefix: str, limit: int):
    new_kind, new_spec = after_thinking(kind, spec, "<think>", "</think>", True, "llguidance")
    g = Grammar.compile(new_kind, new_spec, tokenizer=tokenizer, backend="llguidance")
    m = g.compiled.compiled.deep_copy()
    assert m.consume_tokens(tokenizer.encode(prefix, add_special_tokens=False))
    path = g.backend.search.find(m, limit, g.compiled.hints, g.compiled.lead)
    assert path is not None and m.try_consume_tokens(path) == len(path) and m.is_accepting()
    return g, tokenizer.decode(path)


@pytest.mark.parametrize("kind,spec,answer", CASES[:3])
def test_llguidances_closing_search_ends_the_block_first(tokenizer, kind, spec, answer):
    """Free text shows the greedy walk no progress: without the end marker as its lead it found no completion, so a
    thinking output ran to max_new_tokens with no answer. From inside the block the completion is the marker, then
    the grammar's shortest answer; the grammar's own shortest output counts the marker too."""
    g, text = _search(tokenizer, kind, spec, "I think about fruit and", 32)
    assert g.min_tokens is not None and g.min_tokens > len(g.compiled.lead.tokens)
    assert text.startswith("</think>") and (kind != "json_schema" or json.loads(text[len("</think>") :]))


def test_the_lead_is_not_taken_inside_the_answer(tokenizer):
    """A JSON string allows the marker's text too; there the search closes the string (the lead would have put
    `</think>` into the answer's value, and under a tight budget left no room for the closing `"}`)."""
    _, text = _search(tokenizer, "json_schema", SCHEMA, 'plan</think>{"fruit":"fi', 3)
    assert "</think>" not in text and json.loads('{"fruit":"fi' + text)


def test_sample_strings_come_from_the_grammar_after_the_block(tokenizer):
    """A pattern's sample string (closing_hints.py) is found in the schema inside the composed llguidance request,
    whose own kind (ebnf) has none; a description with `::=` is not mistaken for GBNF there."""
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^x[0-9]{3}$", "description": "a ::= b"}},
              "required": ["id"]}  # fmt: skip
    new_kind, new_spec = after_thinking("json_schema", schema, "<think>", "</think>", True, "llguidance")
    g = Grammar.compile(new_kind, new_spec, tokenizer=tokenizer, backend="llguidance")
    assert new_kind == "ebnf" and g.compiled.hints and g.accepts('</think>{"id":"x123"}')


def _composes(tokenizer, sp: dict, prompt: str = "<think>", parser: str = "deepseek-r1") -> bool:
    from radixflow.runtime.server.openai_request import _think_first

    args = SimpleNamespace(reasoning_parser=parser, grammar_backend="llguidance", constrained_json_whitespace_pattern=None,
                           constrained_json_any_depth=2)  # fmt: skip
    grammar = next((str(sp[k]) for k in ("regex", "json_schema", "ebnf") if sp.get(k) is not None), None)
    return _think_first(SimpleNamespace(args=args, tokenizer=tokenizer), sp, prompt, grammar)


def test_when_the_chat_route_composes(tokenizer):
    sp = {"regex": "[A-Z][a-z]+", "max_new_tokens": 9}
    assert _composes(tokenizer, sp) and set(sp) == {"regex", "max_new_tokens"} and composed_parts("regex", sp["regex"])
    sp = {"json_schema": json.dumps(SCHEMA)}
    assert _composes(tokenizer, sp) and set(sp) == {"ebnf"}  # llguidance: the schema inside a two-grammar request
    assert not _composes(tokenizer, {"regex": "[A-Z]+", "ebnf": 'start: "x"'})  # two grammars: refused later, as before
    assert not _composes(tokenizer, {"regex": "[a-z]+</think>[A-Z]+"})  # the grammar writes the thinking itself
    assert not _composes(tokenizer, {"regex": r"[a-z]+\[/THINK\][A-Z]+"}, parser="mistral")  # escaped, too
    assert not _composes(tokenizer, {"max_new_tokens": 9})
    assert not _composes(tokenizer, {"json_schema": False}) and not _composes(tokenizer, {"regex": ""})  # the usual 400
