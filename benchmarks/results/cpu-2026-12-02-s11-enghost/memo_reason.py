"""Why RadixCache.still_current said no to admission's kept matches in one graph round (after a warm-up):
not match_prefix's result, its node detached, or a child for its next tokens added since ("grown"); or a hit.
Tiny config, stand-in model, 64 programs, size 1.0. As run (new tree, 22:2x UTC): hellaswag {"grown": 200},
llm_judge {"grown": 204}.

    PYTHONPATH=$PWD python <this file> hellaswag,llm_judge
"""
import os, sys, random, collections
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf
from radixflow.radix_cache import radix_tree as rt
from run import run_mode
from step_timeline import stand_in_forward
from workloads import BY_NAME
why = collections.Counter()
orig = rt.RadixCache.still_current
def sc(self, m):
    node, nxt = m.node, m.next_key
    if nxt is rt._UNWALKED: why["unwalked"] += 1
    elif not self.is_attached(node): why["detached"] += 1
    elif nxt is not None and nxt in node.children:
        why["grown"] += 1

    else: why["hit"] += 1
    return orig(self, m)
rt.RadixCache.still_current = sc
with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000) as engine:
    stand_in_forward(engine)
    for name in sys.argv[1].split(","):
        w = BY_NAME[name]; inputs = w.inputs(random.Random(0), 64, 1.0)
        run_mode(engine, w, inputs, "graph", {"max_new_tokens": 8, "temperature": 0})
        why.clear()
        run_mode(engine, w, inputs, "graph", {"max_new_tokens": 8, "temperature": 0})
        print(name, dict(why), flush=True)
