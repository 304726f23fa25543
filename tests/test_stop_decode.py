"""The stop checker's decode of a request's tail: the tokenizers backend called directly where that
gives transformers' text, transformers' decode otherwise."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from radixflow.errors import RadixflowError
from radixflow.model_files import load_tokenizer, resolve_model
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.scheduler import Scheduler
from radixflow.runtime.scheduling.stop_checker import StopChecker, backend_decode


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model(None).path)


def test_the_default_tokenizer_decodes_through_its_backend_with_transformers_text(tok):
    rng = random.Random(0)
    special = sorted(set(tok.all_special_ids))
    decode = backend_decode(tok)
    tok.decode = lambda *a, **k: pytest.fail("the wrapper was called")  # the instance's: the fast path must not use it
    try:
        for _ in range(300):
            ids = [rng.choice(special) if rng.random() < 0.2 else rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 12))]
            for skip in (True, False):
                assert decode(ids, skip) == type(tok).decode(tok, ids, skip_special_tokens=skip)
    finally:
        del tok.decode


def test_tokenizers_that_change_the_backends_text_keep_transformers_decode(tok):
    calls = []

    class Cleaning(type(tok)):
        def _decode(self, *a, **k):  # a subclass's own decoding (as some models' tokenizers have)
            calls.append(1)
            return super()._decode(*a, **k)

    sub = Cleaning.__new__(Cleaning)
    sub.__dict__.update(tok.__dict__)
    backend_decode(sub)([1, 2], True)
    assert calls == [1]
    saved = tok.clean_up_tokenization_spaces
    tok.clean_up_tokenization_spaces = True
    try:
        seen = []
        tok.decode = lambda ids, skip_special_tokens: seen.append(ids) or ""  # a decode whose text differs
        backend_decode(tok)([3], False)
        assert seen[-1] == [3]
        seen.clear()
        cleaned = lambda ids, skip_special_tokens: tok.clean_up_tokenization(type(tok).decode(tok, ids, skip_special_tokens=skip_special_tokens))
        tok.decode = lambda ids, skip_special_tokens: seen.append(ids) or cleaned(ids, skip_special_tokens)
        backend_decode(tok)([3], False)  # a clean-up transformers applies: " ." becomes "."
        assert seen[-1] == [3]
    finally:
        tok.clean_up_tokenization_spaces = saved
        del tok.decode


def test_a_clean_up_transformers_skips_still_takes_the_backend_path(tok):
    """As for Llama-3: clean_up_tokenization_spaces is true, but transformers ignores it for a BPE
    tokenizer, so the backend's text is transformers' text."""
    saved = tok.clean_up_tokenization_spaces
    tok.clean_up_tokenization_spaces = True
    try:
        decode = backend_decode(tok)
        tok.decode = lambda *a, **k: pytest.fail("the wrapper was called")
        for ids in (tok.encode("it isn't here . Or , is it ?", add_special_tokens=False), [1, 2, 3]):
            for skip in (True, False):
                assert decode(ids, skip) == type(tok).decode(tok, ids, skip_special_tokens=skip)
    finally:
        tok.clean_up_tokenization_spaces = saved
        del tok.decode


def test_a_stop_string_inside_a_jumps_tokens_is_found(tok):
    """A jump appends many tokens at once, checked once: the decoded window must reach back to its first, and the
    output is cut back to the token that completes the stop, where a request that sampled them stops (session 28:
    the jump's tokens past it stayed in output_ids and in the usage count)."""
    cuts = []  # the scheduler's rewind (outputs and their KV), as the checker calls it

    def rewind(req, keep):
        cuts.append(keep)
        del req.output_ids[keep:]

    stops = StopChecker(tok, eos_ids=set(), rewind=rewind)
    req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 100, "stop": ["END"]}), output_ids=tok.encode("hello", add_special_tokens=False))
    forced = tok.encode(" END of the text that the grammar forces here and goes on", add_special_tokens=False)[:10]
    assert len(forced) == 10 and "END" in tok.decode(forced)
    scheduler = SimpleNamespace(jump_forward=lambda *a: forced, stops=stops, reserve=SimpleNamespace(seq_limit=10**6))
    Scheduler._apply_jump_forward(scheduler, req)
    k = next(i for i in range(1, 11) if "END" in tok.decode(forced[:i]))
    assert k < 10 and req.output_ids == tok.encode("hello", add_special_tokens=False) + forced[:k]
    assert cuts == [len(req.output_ids)]
    assert req.finish_reason == {"type": "stop", "matched": "END"}


def test_of_two_stops_one_token_completes_the_one_that_starts_first_is_cut(tok):
    """One token completing two stop strings: the output is cut where the first of them starts, whatever their order
    in the list (fuzzing: " open" completed ["n", "ope"]; cut at "n", the text still held "ope")."""
    ids = tok.encode("As the user clicks open", add_special_tokens=False)
    for stops in (["n", "ope"], ["ope", "n"]):
        req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 100, "stop": stops}))
        for token in ids:
            req.output_ids.append(token)
            StopChecker(tok, eos_ids=set()).check(req, seq_limit=10**6)
            if req.finish_reason is not None:
                break
        assert req.finish_reason == {"type": "stop", "matched": "ope"}, stops


@pytest.mark.parametrize("stop", [{"stop_regex": "cat$"}, {"stop_regex": "cat\\b"}, {"stop": "cat"}])
def test_a_jumps_output_is_cut_where_sampling_would_stop(tok, stop):
    """Outputs appended at once (a jump) and checked once end where the same tokens fed one at a time stop. A
    stop_regex anchored at the end or at a word boundary matches at some lengths only, so the first is searched
    for from the shortest (the review of session 28: `cat$` kept all 7 jumped tokens, sampling stopped at 1)."""
    pieces = (" cat", "s", " and", " dogs", " and", " a", " cat")
    ids = [t for piece in pieces for t in tok.encode(piece, add_special_tokens=False)]

    def run(at_once: bool):
        req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 100, **stop}))
        for chunk in ([ids] if at_once else [[t] for t in ids]):
            req.output_ids.extend(chunk)
            StopChecker(tok, eos_ids=set()).check(req, seq_limit=10**6)
            if req.finish_reason is not None:
                break
        return req.output_ids, req.finish_reason

    sampled, jumped = run(False), run(True)
    assert jumped == sampled and sampled[1]["type"] == "stop" and len(sampled[0]) < len(ids)


def test_a_cut_at_a_stop_drops_the_cut_outputs_logprob_entries(tok):
    """A budget repair can give a request with logprobs several unsampled tokens (entries with a null logprob); a
    stop inside them cuts the outputs, and their entries with them, so the lists still match output_ids."""
    from radixflow.runtime.scheduling.req import LogprobOptions

    ids = tok.encode(" the cat sat on the mat", add_special_tokens=False)
    req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 100, "stop": "cat"}),
              logprob=LogprobOptions(return_logprob=True, top_logprobs_num=2))
    req.output_ids.extend(ids)
    req.output_token_logprobs.extend((None, t) for t in ids)
    req.output_top_logprobs.extend([None] * len(ids))
    StopChecker(tok, eos_ids=set()).check(req, seq_limit=10**6)
    assert req.finish_reason == {"type": "stop", "matched": "cat"} and len(req.output_ids) < len(ids)
    assert [t for _, t in req.output_token_logprobs] == req.output_ids == ids[: len(req.output_ids)]
    assert len(req.output_top_logprobs) == len(req.output_ids)


@pytest.mark.parametrize("field", ["stop", "stop_regex"])
@pytest.mark.parametrize("text, stop", [("编辑，但是没有任何编辑工元", "编辑工"), ("A story: 😖😖 the end", "😖😖"),
                                        ("中文：编辑", "编辑")])
def test_a_multi_byte_stop_is_found_whichever_token_completes_it(tok, field, text, stop):
    """Byte-level vocabularies spell a CJK character or an emoji in up to 4 tokens: the decoded window is as many
    tokens as the stop has bytes, not characters (found by fuzzing: 12 of 13 such stop strings were missed). Fed a
    token at a time, the stop is found at the token that completes it, and not before (half a character decodes
    as U+FFFD, which is not matched)."""
    ids = tok.encode(text, add_special_tokens=False)
    end = next(i for i in range(1, len(ids) + 1) if stop in tok.decode(ids[:i]))
    assert len(tok.encode(stop, add_special_tokens=False)) > len(stop)  # the case this covers: bytes, not chars
    stops = StopChecker(tok, eos_ids=set())
    req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 100, field: [stop]}))
    for i, token in enumerate(ids, 1):
        req.output_ids.append(token)
        stops.check(req, seq_limit=10**6)
        assert (req.finish_reason is not None) == (i >= end), (i, end)
        if req.finish_reason is not None:
            break
    assert req.finish_reason == {"type": "stop", "matched": stop}


def test_a_stop_string_with_the_replacement_character_is_refused():
    from radixflow.errors import RadixflowError

    with pytest.raises(RadixflowError, match="must not contain U\\+FFFD"):
        SamplingParams.from_dict({"stop": ["a\ufffd"]})


def test_an_unbounded_stop_regex_sees_the_whole_gen_decoded_a_window_at_a_time(tok):
    """The kept text of a gen (settled text plus an incomplete character's pending text) equals the gen's
    whole decode after every token, through cuts back (rewind) and new segments, with multi-byte
    characters split across tokens and special tokens skipped or kept; a check decodes the whole gen only
    while its kept text is new (until that text first ends on a whole character), else a few tokens."""
    rng = random.Random(0)
    decode = backend_decode(tok)
    pieces = tok.encode("naïve café 東京 🙂 ünïcödé — text, more text\n", add_special_tokens=False)
    special = sorted(set(tok.all_special_ids))
    for skip in (True, False):
        stops = StopChecker(tok, eos_ids=set())
        windows = []
        stops._decode = lambda ids, sk: windows.append(len(ids)) or decode(ids, sk)
        params = SamplingParams.from_dict({"max_new_tokens": 10**4, "stop_regex": "NEVER.*MATCHED",
                                           "skip_special_tokens": skip})  # fmt: skip
        assert params.stop_patterns.width is None
        req, settled, whole = Req("r", [1], params, output_ids=[]), False, 0
        for _ in range(600):
            if rng.random() < 0.02 and len(req.output_ids) > req.segment_start + 3:
                Scheduler.rewind(SimpleNamespace(), req, len(req.output_ids) - rng.randint(1, 3))  # kv_len 0: no KV
            if rng.random() < 0.01:
                req.segment_start = len(req.output_ids)  # a request graph's next gen
            settled = settled and req.stop_text is not None and req.stop_text.segment_start == req.segment_start
            req.output_ids.append(rng.choice(special) if rng.random() < 0.05 else rng.choice(pieces))
            windows.clear()
            assert stops._gen_text(req) == decode(req.output_ids[req.segment_start :], skip)
            whole += max(windows) > 16
            assert not settled or max(windows) <= 16, windows  # 6 tokens of context and any pending ones
            settled = settled or not req.stop_text.text.pending
        assert not req.finished and whole < 60  # of 600 checks


def test_an_unbounded_stop_regex_searches_the_gens_last_characters_only(tok):
    """A search costs at most UNBOUNDED_WINDOW characters, whatever the pattern's search time grows with."""
    from radixflow.runtime.stop_regex import UNBOUNDED_WINDOW

    stops = StopChecker(tok, eos_ids=set())
    words = tok.encode(" word" * (UNBOUNDED_WINDOW // 4), add_special_tokens=False)
    params = SamplingParams.from_dict({"max_new_tokens": 10**5, "stop_regex": "START.*END"})
    req = Req("r", [1], params, output_ids=tok.encode("START", add_special_tokens=False) + words)
    stops.check(req, 10**6)
    req.output_ids += tok.encode(" END", add_special_tokens=False)
    stops.check(req, 10**6)
    assert not req.finished  # START is further back than the window
    assert len(stops._gen_text(req)) == UNBOUNDED_WINDOW
    req.output_ids += tok.encode(" START END", add_special_tokens=False)
    stops.check(req, 10**6)
    assert req.finish_reason == {"type": "stop", "matched": "START.*END"}
    req = Req("r2", [1], params, output_ids=[])
    for t in words * 3:  # past twice the window: the kept text is trimmed, not grown and copied per token
        req.output_ids.append(t)
        stops.check(req, 10**6)
    assert len(req.stop_text.text.text) <= 2 * UNBOUNDED_WINDOW and not req.finished
    assert stops._gen_text(req) == tok.decode(req.output_ids)[-UNBOUNDED_WINDOW:]


@pytest.mark.parametrize("ends_on_eos", [True, False])
def test_every_budget_closed_finish_has_one_shape(tok, ends_on_eos):
    """A budget-closed output that ended on EOS said matched 2 (the EOS id), one cut at max_new_tokens left
    matched out (found by fuzzing); both now read as docs/serving.md shows."""
    eos = tok.eos_token_id
    grammar = SimpleNamespace(budget_closed=True, undo=0, is_terminated=lambda: ends_on_eos, error=lambda: None)
    req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 3}), output_ids=[5, 6, eos if ends_on_eos else 7])
    req.grammar = grammar
    StopChecker(tok, eos_ids={eos}).check(req, seq_limit=10**6)
    assert req.finish_reason == {"type": "length", "length": 3, "grammar_closed": True, "matched": None}


@pytest.mark.parametrize("field,stop", [("stop_regex", "zq{1,500}"), ("stop", "zq" * 200)])
def test_a_long_stop_is_searched_in_the_kept_text_not_a_decoded_tail(tok, field, stop):
    """A stop_regex of width 500 decoded 2,000 tokens on every token, x{1,60000} the whole output (review): past
    TAIL_WIDTH characters a stop is searched for in the gen's kept text, a few tokens decoded a check."""
    stops = StopChecker(tok, eos_ids=set())
    windows: list = []
    decode = stops._decode
    stops._decode = lambda ids, sk: windows.append(len(ids)) or decode(ids, sk)
    params = SamplingParams.from_dict({"max_new_tokens": 10**4, field: [stop]})
    req = Req("r", [1], params, output_ids=[])
    for t in tok.encode(" word" * 300, add_special_tokens=False):
        req.output_ids.append(t)
        stops.check(req, 10**6)
    assert not req.finished and max(windows[-100:]) <= 16, max(windows[-100:])
    req.output_ids += tok.encode(" zqzq" + ("zq" * 200 if field == "stop" else ""), add_special_tokens=False)
    stops.check(req, 10**6)
    assert req.finish_reason == {"type": "stop", "matched": stop}


@pytest.mark.parametrize("field", ["stop", "stop_regex"])
def test_a_stop_with_a_lone_surrogate_is_refused_by_name(field):
    with pytest.raises(RadixflowError, match="lone surrogate"):
        SamplingParams.from_dict({field: ["ok", "a\udcff"]})


def test_a_stop_string_longer_than_the_searched_text_is_refused():
    with pytest.raises(RadixflowError, match="at most 4096 characters"):
        SamplingParams.from_dict({"stop": ["x" * 5000]})


GROWING_PATTERNS = [r"a+b", r"[A-Z]{2,}", r"a.*z", r"x\d+y", r"(?i)end\s*$", r"\bcat\b.*dog", r"(?<=q)r+",
                    r"ab|c+d", r"(a|b)*c", r"[[:digit:]]+!", r"a{2,}?b", r"(?=\w*z)\w+q", r"\n\d+\.", r"c(?!a)\w+",
                    r"\n\b\w+:", r"(a)\1+b", r"[^a]+\."]
WINDOW_SEARCHED = ("[:", "$", "\\b", "(?<", "(?=", "(?!", "\\1")  # read differently, or partial matches untrusted
GROWING_PIECES = ["a", "b", "c", "d", "z", "q", "r", "x", "y", " ", "\n", "\n1", "1", "9", ".", "!", "A", "BC", "end",
                  "END ", " cat ", "dog", ":", "[", "]", "\nUser", "aa"]


@pytest.mark.filterwarnings("ignore:Possible nested set:FutureWarning")  # re's, for [[:digit:]]
@pytest.mark.parametrize("pattern", GROWING_PATTERNS)
def test_an_unbounded_stop_regex_searched_from_where_a_match_can_start_finds_what_re_finds(pattern):
    """The incremental search (stop_regex_search.py: each check starts where a partial match, or none, left it)
    stops at the same character, on the same pattern, as `re` searching the whole text at every check, whatever
    the text arrives in (one character or several at a check). Characters stand for tokens here."""
    from radixflow.runtime.stop_regex import first_match, parse_stop_regex
    from radixflow.runtime.stop_regex_search import GrowingText

    stops = parse_stop_regex([pattern, r"ZZZ+"])
    assert stops.width is None and (stops.growing[0] is None) == any(m in pattern for m in WINDOW_SEARCHED)
    rng = random.Random(pattern)
    decode = lambda ids: "".join(map(chr, ids))  # noqa: E731
    for _ in range(200):
        pieces = rng.sample(GROWING_PIECES, 10)
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 150)))
        kept, ids, expected = GrowingText.at(0), [], None
        while len(ids) < len(text):
            ids += map(ord, text[len(ids) : len(ids) + rng.choice([1, 1, 1, 3])])
            got = kept.first_match(stops.patterns, stops.growing, kept.update(ids, decode))
            expected = first_match(stops, text[: len(ids)])
            assert got == expected, (text[: len(ids)], got, expected)
            if got is not None:
                break


def test_an_unbounded_stop_regex_check_does_not_search_the_whole_window_again():
    """Searched from its start, `[A-Z]{3,}` cost its whole 4,096-character window on every token (30 µs each on
    the CPU); from where a match could still start, a check reads only the newest characters: a pattern whose
    search counts the characters it is handed sees each of them a bounded number of times."""
    from radixflow.runtime.stop_regex import parse_stop_regex
    from radixflow.runtime.stop_regex_search import GrowingText

    stops = parse_stop_regex([r"[A-Z]{3,}"])
    seen = []

    class Counting:
        def search(self, text, pos, partial):
            seen.append(len(text) - pos)
            return stops.growing[0].search(text, pos, partial=partial)

    kept, ids = GrowingText.at(0), []
    for word in ["some", "Words", "AB", "and", "more", "Text"] * 500:
        ids += map(ord, " " + word)
        assert kept.first_match(stops.patterns, (Counting(),), kept.update(ids, lambda i: "".join(map(chr, i)))) is None
    assert max(seen) <= 8 and len(ids) > 4096


def test_a_gen_cut_by_the_context_reports_its_own_length(tok):
    """A request graph's later gen continues its request (segment_start > 0): cut by the context, its finish said
    `length` 17, the whole request's outputs, where eager mode and /generate say the gen's own 2 (fuzzing, session 30)."""
    req = Req("r", [1] * 4, SamplingParams.from_dict({"max_new_tokens": 20}), output_ids=list(range(10, 27)))
    req.segment_start = 15
    StopChecker(tok, eos_ids=set()).check(req, seq_limit=len(req.fill_ids))
    assert req.finish_reason == {"type": "length", "length": 2}


def test_an_unbounded_stop_regex_is_found_after_the_kept_text_was_trimmed():
    """Past twice the window the kept text is trimmed and the places where a match could start are counted from
    the gen's start (`dropped`): a review found no test where anything had been dropped."""
    from radixflow.runtime.stop_regex import parse_stop_regex
    from radixflow.runtime.stop_regex_search import GrowingText

    stops = parse_stop_regex([r"[A-Z]{3,}", r"\d+!"])
    decode = lambda ids: "".join(map(chr, ids))  # noqa: E731
    kept, ids = GrowingText.at(0), []
    for word in [" word"] * 3000 + [" 12", " AB", "CD"]:
        ids += map(ord, word)
        found = kept.first_match(stops.patterns, stops.growing, kept.update(ids, decode))
        assert found is None or word == "CD", word
    assert kept.dropped > 0 and found == r"[A-Z]{3,}"
