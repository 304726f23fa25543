"""JSON extraction over a small bundled dataset with run_batch: each record becomes a
JSON object constrained by a JSON schema. The instructions are a shared prefix, so
their KV is computed once and reused by every program (radix cache).

    python examples/json_extraction.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse
import json
import os

import radixflow as rf

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer"},
        "job": {"type": "string", "maxLength": 20},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "job", "city"],
}
INSTRUCTIONS = (
    "Extract the person described in the text as JSON with the fields name, age, job and city.\n"
    'Text: Ana Silva, 30, is a chef in Lisbon.\nJSON: {"name":"Ana Silva","age":30,"job":"chef","city":"Lisbon"}\n'
)


@rf.function
def extract(s, text):
    s += INSTRUCTIONS + f"Text: {text}\nJSON: " + rf.gen("person", json_schema=SCHEMA, max_tokens=48)


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a radixflow server; default: an in-process Engine")
    args = ap.parse_args()
    rf.set_default_backend(rf.RuntimeEndpoint(args.url) if args.url else rf.Engine())
    records = load(os.path.join(os.path.dirname(__file__), "data", "people.jsonl"))
    states = extract.run_batch([{"text": r["text"]} for r in records], temperature=0)
    for r, s in zip(records, states):
        person = json.loads(s["person"])
        print(r["id"], person)
    print("cache hit rate:", f"{rf.get_server_info()['cache_hit_rate']:.2f}")


if __name__ == "__main__":
    main()
