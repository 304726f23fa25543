"""A request graph's gen that the next gen continues (a `continuable` request) overlaps its decode
passes: the next pass is launched before the read-back that may continue the request (its text
appended, its outputs trimmed back to a stop string, the next gen's params), and sampled after it.
Outputs must be the non-overlapped path's, and the KV bookkeeping consistent."""

from __future__ import annotations

from test_overlap_schedule import _gen, _settle, overlap_on


def _graph(i: int) -> dict:
    return {"ops": [
        {"op": "text", "text": f"Q{i}: Count with me: 1, 2,"},
        _gen(1, max_new_tokens=9, stop=" 6"),  # a stop string: the outputs are trimmed back, KV rewound
        {"op": "text", "text": "\nQ: Name a color.\nA:"},  # several tokens: one extend pass, as without overlap
        _gen(2, max_new_tokens=5 + i % 3, ignore_eos=True),
        _gen(3, max_new_tokens=4, ignore_eos=True),  # no text between: the same request decodes on
        {"op": "text", "text": "."},  # one token: fed in a decode pass
        _gen(4, max_new_tokens=6, ignore_eos=True),
    ]}  # fmt: skip


def _texts(outs: list) -> list:
    return [{k: v["text"] for k, v in o["results"].items()} for o in outs]


def test_continuable_segments_overlap_with_the_same_outputs(engine):
    graphs = [_graph(i) for i in range(6)]
    ref = engine.run_program(graphs)
    sched = engine.scheduler
    chained_continuable = []
    chain = sched._chain_decode

    def counted():
        out = chain()
        if out is not None:
            chained_continuable.append(sum(r.continuable for r in sched.inflight.reqs))
        return out

    sched._chain_decode = counted
    continued = sched.stats.continued_rows
    try:
        with overlap_on(engine, cold_chunk=8):
            got = engine.run_program(graphs)
            _settle(sched)
    finally:
        del sched._chain_decode
    assert _texts(got) == _texts(ref)
    assert [o["meta_info"]["continued_segments"] for o in got] == [o["meta_info"]["continued_segments"] for o in ref]
    assert all(o["meta_info"]["continued_segments"] == 3 for o in got)
    assert sum(chained_continuable) > 0, "no pass of a continuable request was chained"
    assert sched.stats.continued_rows > continued  # rows whose sample the continuation dropped (not counted as fed)
