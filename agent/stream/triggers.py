"""Triggers: many event sequences, one trie, one pass."""

from __future__ import annotations

from collections import deque
from typing import Any

from agent.stream.spec import PipelineError


class TriggerTrie:
    """Every trigger pattern is a path in one trie; matching runs them all in one pass.

    A pattern matches consecutive events of one key.  A key's state is the set of trie nodes
    its recent events reached; those sets are interned and their transitions memoised (the
    Aho-Corasick automaton, built lazily), so one event costs one dictionary lookup however
    many patterns there are.  ``within`` is checked on completion against the timestamp of
    the pattern's first event, from a short per-key history.
    """

    def __init__(self, triggers: list[dict[str, Any]]) -> None:
        self.children: list[dict[Any, int]] = [{}]
        self.fires: list[list[tuple[str, float | None, int]]] = [[]]
        fields = sorted({t["field"] for t in triggers})
        if len(fields) > 1:
            raise PipelineError(f"triggers must all match one field, not {', '.join(fields)}")
        self.field = fields[0] if fields else ""
        self.order: dict[str, int] = {}
        for index, trigger in enumerate(triggers):
            self.order.setdefault(trigger["name"], index)
            node = 0
            for symbol in trigger["sequence"]:
                nxt = self.children[node].get(symbol)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][symbol] = nxt
                    self.children.append({})
                    self.fires.append([])
                node = nxt
            self.fires[node].append((trigger["name"], trigger.get("within"), len(trigger["sequence"])))
        self.history = max((len(t["sequence"]) for t in triggers if t.get("within")), default=0)
        self._ids: dict[frozenset, int] = {frozenset(): 0}
        self._sets: list[frozenset] = [frozenset()]
        self._moves: list[dict[Any, tuple[int, tuple]]] = [{}]  # state -> symbol -> (next, completions)
        self.keys: dict[Any, int] = {}  # key -> automaton state
        self.times: dict[Any, deque] = {}  # key -> recent timestamps (only for `within`)

    def _move(self, state: int, symbol: Any) -> tuple[int, tuple]:
        children = self.children
        reached = {children[n][symbol] for n in self._sets[state] if symbol in children[n]}
        if symbol in children[0]:
            reached.add(children[0][symbol])
        # completions in the order the triggers are declared, whatever their trie nodes
        fired = tuple(sorted((f for n in reached for f in self.fires[n]), key=lambda f: self.order[f[0]]))
        alive = frozenset(n for n in reached if children[n])
        nxt = self._ids.get(alive)
        if nxt is None:
            nxt = self._ids[alive] = len(self._sets)
            self._sets.append(alive)
            self._moves.append({})
        self._moves[state][symbol] = (nxt, fired)
        return nxt, fired

    def step(self, key: Any, symbol: Any, ts: float) -> list[str]:
        """Advance the key by one event; return the names of the triggers it completed."""
        state = self.keys.get(key, 0)
        move = self._moves[state].get(symbol)
        if move is None:
            move = self._move(state, symbol)
        self.keys[key] = move[0]
        if self.history:
            times = self.times.get(key)
            if times is None:
                times = self.times[key] = deque(maxlen=self.history)
            times.append(ts)
        if not move[1]:
            return []
        fired = []
        for name, within, length in move[1]:
            if within is None or ts - self.times[key][-length] <= within:
                fired.append(name)
        return fired
