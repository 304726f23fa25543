"""Python calls on the engine thread in one profiled graph round a workload (after a warm-up), and
the calls of the functions this session changed: call counts do not depend on the machine's load
(the scheduler steps a round ran do, a little). host_profile.py's ThreadProfiles; tiny config, the
stand-in model, 64 programs, size 1.0. From a tree's root:

    PYTHONPATH=$PWD python <this file> out.json [workloads]
"""

from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf  # noqa: E402
from host_profile import ThreadProfiles  # noqa: E402
from run import run_mode  # noqa: E402
from step_timeline import stand_in_forward  # noqa: E402
from workloads import BY_NAME  # noqa: E402

WATCH = ("on_step", "_poll", "_wake", "<lambda>", "__call__", "finished", "match_prefix", "still_current", "fresh_enough")


def main() -> None:
    out_path = sys.argv[1]
    names = (sys.argv[2] if len(sys.argv) > 2 else "react,llm_judge,tree_of_thought,hellaswag,mmlu").split(",")
    sampling = {"max_new_tokens": 8, "temperature": 0}
    result = {}
    with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000) as engine:
        stand_in_forward(engine)
        for name in names:
            w = BY_NAME[name]
            inputs = w.inputs(random.Random(0), 64, 1.0)
            run_mode(engine, w, inputs, "graph", sampling)
            tp = ThreadProfiles(engine, w.program)
            try:
                steps = engine.stepper.steps
                run_mode(engine, w, inputs, "graph", sampling)
                steps = engine.stepper.steps - steps
            finally:
                tp.close()
            st = tp.stats("engine")
            calls = {}
            for (f, line, fn), (_, nc, _, _, _) in st.stats.items():
                if fn in WATCH and ("radixflow" in f or "programs" in f):
                    key = f"{os.path.basename(f)}:{fn}"
                    calls[key] = calls.get(key, 0) + nc
            result[name] = {"turns": steps, "engine_calls": st.total_calls, "engine_cpu_profiled_s": st.total_tt, "calls": calls}
            print(name, json.dumps(result[name]), flush=True)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
