"""A streamed request's reports carry what its lists gained since the last one (runtime/output_delta.py): the
receiver's lists equal the sender's after every report, also where outputs were cut back, and a report's size does not
grow with the output."""

from __future__ import annotations

import pickle

from radixflow.runtime.output_delta import Assembly, Sent, as_delta
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import LogprobOptions, Req


def _grow(req: Req, n: int) -> None:
    for _ in range(n):
        tok = 100 + len(req.output_ids)
        req.output_ids.append(tok)
        req.output_token_logprobs.append((-0.5, tok))
        req.output_top_logprobs.append([(-0.5, tok), (-1.5, 7)])
        req.output_token_ids_logprobs.append([(-3.0, 5), (-0.5 - len(req.output_ids), 9)])


def _whole(out) -> list:
    return [out.output_ids, out.new_output_token_logprobs, out.new_output_top_logprobs,
            out.new_output_token_ids_logprobs, out.input_token_logprobs, out.input_top_logprobs,
            out.input_token_ids_logprobs]  # fmt: skip


def test_reports_put_back_together_equal_the_whole_lists_through_cuts():
    req = Req("r", [1, 2, 3], SamplingParams.from_dict({}), LogprobOptions(True, 0, 2))
    req.input_token_logprobs.extend([(None, 1), (-2.0, 2)])
    sent, assembly, sizes = Sent(), Assembly(), []
    for step, (grow, cut) in enumerate([(5, None), (1, None), (3, 7), (0, 2), (4, None)] + [(1, None)] * 40):
        _grow(req, grow)
        if cut is not None:  # a stop or a grammar cut the outputs back, with their logprobs
            req.drop_output_logprobs(len(req.output_ids) - cut)
            req.cut_outputs(cut)
        if step == 1:
            req.input_token_logprobs.append((-1.0, 3))  # the prompt's last chunk
            req.input_token_ids_logprobs.append([(-4.0, 5), (-2.0, 9)])
        delta = as_delta(req.to_output(), sent)
        sizes.append(len(pickle.dumps(delta)))
        assert _whole(assembly.apply(delta)) == _whole(req.to_output())
    assert sizes[-1] == sizes[-2] < sizes[0]  # one token's entries, not the whole lists


def test_a_report_without_starts_is_taken_whole():
    req = Req("r", [1], SamplingParams.from_dict({}))
    _grow(req, 3)
    out = req.to_output()
    assert Assembly().apply(out) is out


def test_the_detokenizer_decodes_a_stream_from_its_deltas_through_a_cut(tokenizer):
    """The detokenizer's text of each report equals the text of the whole ids so far, also after outputs were cut
    back and grew other tokens, with reports skipped between (--stream-interval 2)."""
    from radixflow.runtime.server.detokenizer import Detokenizer
    from radixflow.runtime.server.server_messages import DecodeParams

    first = tokenizer.encode(" The quick brown fox jumps over the lazy dog, café ünd 東京.", add_special_tokens=False)
    other = tokenizer.encode(" A slow green turtle walks under the busy bridge.", add_special_tokens=False)
    req = Req("r", [1], SamplingParams.from_dict({}))
    detok, sent = Detokenizer(tokenizer), Sent()
    detok.register({"r": DecodeParams()})
    for step, tok in enumerate(first[:12] + other):
        if step == 12:  # a grammar cut the last 5 back
            req.cut_outputs(7)
        req.output_ids.append(tok)
        if step % 2:
            text, whole = detok.text_of(as_delta(req.to_output(), sent)), tokenizer.decode(req.output_ids)
            assert whole.startswith(text) and (text == whole or whole.endswith("\ufffd"))  # a split character waits
    req.finish({"type": "length", "length": len(req.output_ids)})
    assert detok.text_of(as_delta(req.to_output(), sent)) == tokenizer.decode(req.output_ids)
    assert "r" not in detok.states


def test_an_assembly_with_a_converter_turns_each_logprob_entry_into_a_triple_once():
    """The TokenizerManager's: entries converted as they arrive (a whole report too), so a result copies the lists
    instead of converting every entry of a long stream again (review, session 29)."""
    from radixflow.runtime.generate_request import build_result

    calls = []
    convert = lambda pairs: calls.append(len(pairs)) or [[lp, tid, f"t{tid}"] for lp, tid in pairs]  # noqa: E731
    req = Req("r", [1, 2, 3], SamplingParams.from_dict({}), LogprobOptions(True, 0, 2, True))
    sent, assembly = Sent(), Assembly(convert=convert)
    for _ in range(3):
        _grow(req, 2)
        result = build_result(assembly.apply(as_delta(req.to_output(), sent)), "", req.logprob, False, 0.0)
    assert result["meta_info"]["output_token_logprobs"] == [[-0.5, t, f"t{t}"] for t in req.output_ids]
    assert result["meta_info"]["output_top_logprobs"][-1] == [[-0.5, 105, "t105"], [-1.5, 7, "t7"]]
    assert sum(calls) == 6 + 6 * 2 + 6 * 2  # each pair converted once: 6 outputs, 2 top pairs and 2 asked ids each
    again = Assembly(convert=convert).apply(req.to_output())  # a non-streamed request's one whole report
    assert again.new_output_token_logprobs == result["meta_info"]["output_token_logprobs"]


def test_an_engine_stream_view_starts_its_text_over_after_a_cut(engine, tokenizer):
    """Engine._result for a stream: text decoded a window at a time and lists from deltas; after the outputs were cut
    back and grew other tokens, the text is the new tokens' (decoded again), not the cut ones' (review, session 29)."""
    from radixflow.runtime.engine import _StreamView

    req = Req("r", [1], SamplingParams.from_dict({}), LogprobOptions(True, -1, 0, True))
    view = _StreamView.of(req, engine.scheduler.logprobs.with_text)
    first = tokenizer.encode(" one two three four five", add_special_tokens=False)
    other = tokenizer.encode(" six seven", add_special_tokens=False)
    for tok in first:
        req.output_ids.append(tok)
        req.output_token_logprobs.append((-0.1, tok))
        engine._result(req, finished=False, view=view)
    req.drop_output_logprobs(3)
    req.cut_outputs(len(first) - 3)
    for tok in other:
        req.output_ids.append(tok)
        req.output_token_logprobs.append((-0.2, tok))
    out = engine._result(req, finished=False, view=view)
    assert out["text"] == tokenizer.decode(req.output_ids) and out["output_ids"] == req.output_ids
    assert [t[1] for t in out["meta_info"]["output_token_logprobs"]] == req.output_ids


def test_a_graph_strands_stream_follows_outputs_cut_back():
    """A request graph's stream decoded a gen's ids as if they only grew: after a cut back and other tokens, its
    kept decode was stale (review, session 29). It now decodes afresh after a cut (text already sent stays sent)
    and follows a gen's segment without copying the request's outputs at every token."""
    from radixflow.model_files import load_tokenizer, resolve_model
    from radixflow.runtime.programs.program_stream import StrandStream

    tok = load_tokenizer(resolve_model(None).path)
    sent = []
    stream = StrandStream(lambda var, text, meta: sent.append(text), tok)
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    req = Req("r", [1, 2], SamplingParams.from_dict({"max_new_tokens": 50}), output_ids=enc("Earlier gen."))
    req.segment_start = len(req.output_ids)
    req.output_ids += enc(" one two")
    stream.progress(req, "x")
    req.cut_outputs(req.segment_start + len(enc(" one")))
    req.output_ids += enc(" three four five")
    stream.progress(req, "x")
    assert "".join(sent) == " one two" + tok.decode(enc(" one three four five"))[len(" one two"):]
