"""The per-input-shape half of planning: plans cached by input-shape signature.

A plan is built on the second run with a new input-shape signature from what the first
run recorded (see ``engine/planner.py``) and reused by every later run with that signature.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine.planner import PlannedStep

Signature = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Plan:
    """What runs for one signature: the planned steps and the values folded for it."""

    signature: Signature
    steps: tuple[PlannedStep, ...]
    constants: dict[str, np.ndarray]
    team: bool = False  # its multi-thread runs share their GEMMs with engine/team.py's worker


class PlanCache:
    """Plans by signature, least recently used dropped first (dynamic shapes must not grow it forever)."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[Signature, Plan] = OrderedDict()

    def get(self, signature: Signature) -> Plan | None:
        plan = self._plans.get(signature)
        if plan is not None:
            self._plans.move_to_end(signature)
        return plan

    def put(self, plan: Plan) -> None:
        self._plans[plan.signature] = plan
        self._plans.move_to_end(plan.signature)
        while len(self._plans) > self.capacity:
            self._plans.popitem(last=False)

    def __len__(self) -> int:
        return len(self._plans)
