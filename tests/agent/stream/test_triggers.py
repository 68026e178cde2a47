"""Many trigger sequences in one pass, against a brute-force reference."""

from __future__ import annotations

import json
import random

import pytest

from agent.stream import Pipeline
from tests.agent.stream.specs import spec


def _reference_firings(events: list[dict], triggers: list[dict]) -> list[tuple]:
    """Brute force: at each event, does the key's recent history end with a pattern (within its time)?"""
    history: dict[str, list] = {}
    fired = []
    for e in events:
        h = history.setdefault(e["user"], [])
        h.append((e["kind"], e["ts"]))
        for t in triggers:
            n = len(t["sequence"])
            tail = h[-n:]
            matches = len(tail) == n and [k for k, _ in tail] == t["sequence"]
            if matches and (t.get("within") is None or e["ts"] - tail[0][1] <= t["within"]):
                fired.append((e["user"], t["name"], e["ts"]))
    return fired


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_many_triggers_in_one_pass_match_a_brute_force_reference(seed: int):
    rng = random.Random(seed)
    kinds = ["a", "b", "c", "d"]
    triggers = [
        {"name": f"t{i}", "field": "kind", "sequence": [rng.choice(kinds) for _ in range(rng.randint(1, 4))]}
        for i in range(40)
    ]
    for t in triggers[::3]:
        t["within"] = 2.5
    events, ts = [], 0.0
    for _ in range(3000):
        ts += rng.random()
        events.append({"ts": ts, "user": rng.choice(["u1", "u2", "u3"]), "kind": rng.choice(kinds)})
    pipeline = Pipeline(spec(triggers=triggers))
    fired = []
    for i in range(0, len(events), 256):
        fired += pipeline.feed([json.dumps(e) for e in events[i : i + 256]])
    assert [(f["key"], f["trigger"], f["ts"]) for f in fired] == _reference_firings(events, triggers)
