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


def _whole(out) -> list:
    return [out.output_ids, out.new_output_token_logprobs, out.new_output_top_logprobs, out.input_token_logprobs,
            out.input_top_logprobs]  # fmt: skip


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
        delta = as_delta(req, req.to_output(), sent)
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
            text, whole = detok.text_of(as_delta(req, req.to_output(), sent)), tokenizer.decode(req.output_ids)
            assert whole.startswith(text) and (text == whole or whole.endswith("\ufffd"))  # a split character waits
    req.finish({"type": "length", "length": len(req.output_ids)})
    assert detok.text_of(as_delta(req, req.to_output(), sent)) == tokenizer.decode(req.output_ids)
    assert "r" not in detok.states
