"""The device filter language: a small, parsed (never eval'd) expression over device facts.

Grammar (keywords are case-insensitive)::

    expr       := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | "(" expr ")" | comparison
    comparison := field OP value                     OP: == != < <= > >=
                | field "in" "[" value ("," value)* "]"
                | field "has" value                  comma-separated list attribute contains value
                | field "matches" value              semver range, e.g. ">=1.2.0,<2.0.0"
                | field "exists"
    field      := name | "labels." name | "attributes." name
    value      := "double-quoted string" | number | bare word

A plain ``name`` reads the device attribute, then the label of that name. A comparison
on a missing field is false (so ``region != "eu"`` does not pick devices without a
region; write ``not region == "eu"`` for that). ``<``/``>`` compare numbers when both
sides are numbers, and semver versions when both sides are versions, else they are
false. Example::

    hardware == "rpi4" and ram_mb >= 2048 and cpu_features has neon
        and app_version matches ">=2.1.0,<3" and (region in [eu-west, eu-north] or labels.site == lab)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import semantic_version

from deploy.errors import PolicyError

MAX_LENGTH = 4000
MAX_DEPTH = 32
COMPARISONS = ("==", "!=", "<=", ">=", "<", ">")
KEYWORDS = frozenset({"and", "or", "not", "in", "has", "matches", "exists"})
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<op>==|!=|<=|>=|<|>)
  | (?P<punct>[()\[\],])
  | (?P<word>[A-Za-z0-9_.:/*+~^-]+)
    """,
    re.VERBOSE,
)
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?$")
_FIELD = re.compile(r"((labels|attributes)\.)?[A-Za-z_][A-Za-z0-9_.-]*$")
_BARE = re.compile(r"[A-Za-z0-9_.:/+-]+$")


class FilterSyntaxError(PolicyError):
    """A filter expression that does not parse; the message points at the bad token."""

    def __init__(self, text: str, position: int, message: str) -> None:
        self.text, self.position, self.reason = text, position, message
        pointer = " " * position + "^"
        super().__init__(f"{message} at column {position + 1}\n  {text}\n  {pointer}")


# --- The syntax tree: frozen dataclasses, so equal expressions compare equal -------------


@dataclass(frozen=True)
class Field:
    scope: str  # "any" (attribute, then label), "labels" or "attributes"
    name: str

    def text(self) -> str:
        return self.name if self.scope == "any" else f"{self.scope}.{self.name}"


@dataclass(frozen=True)
class Compare:
    field: Field
    op: str  # one of COMPARISONS, "in", "has", "matches", "exists"
    values: tuple[str | int | float, ...] = ()


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class And:
    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Node, ...]


Node = Compare | Not | And | Or


# --- Parsing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "string", "op", "punct", "word", "end"
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            char = text[position]
            hint = " (strings use double quotes)" if char == "'" else ""
            raise FilterSyntaxError(text, position, f"unexpected character {char!r}{hint}")
        if match.lastgroup != "space":
            tokens.append(_Token(match.lastgroup, match.group(), position))
        position = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0
        self.depth = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.index]

    def fail(self, message: str, token: _Token | None = None) -> FilterSyntaxError:
        token = token or self.token
        found = "the end of the expression" if token.kind == "end" else repr(token.text)
        return FilterSyntaxError(self.text, token.position, f"{message}, found {found}")

    def keyword(self, word: str) -> bool:
        if self.token.kind == "word" and self.token.text.lower() == word:
            self.index += 1
            return True
        return False

    def punct(self, char: str) -> bool:
        if self.token.kind == "punct" and self.token.text == char:
            self.index += 1
            return True
        return False

    def parse(self) -> Node:
        node = self.expr()
        if self.token.kind != "end":
            raise self.fail("expected 'and', 'or' or the end of the expression")
        return node

    def expr(self) -> Node:
        operands = [self.and_expr()]
        while self.keyword("or"):
            operands.append(self.and_expr())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def and_expr(self) -> Node:
        operands = [self.not_expr()]
        while self.keyword("and"):
            operands.append(self.not_expr())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def not_expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"expression nested deeper than {MAX_DEPTH} levels")
        try:
            if self.keyword("not"):
                return Not(self.not_expr())
            if self.punct("("):
                node = self.expr()
                if not self.punct(")"):
                    raise self.fail("expected ')'")
                return node
            return self.comparison()
        finally:
            self.depth -= 1

    def field(self) -> Field:
        token = self.token
        if token.kind != "word" or token.text.lower() in KEYWORDS or not _FIELD.match(token.text):
            raise self.fail("expected a field name such as hardware, labels.site or app_version")
        self.index += 1
        scope, dot, name = token.text.partition(".")
        if dot and scope in ("labels", "attributes"):
            return Field(scope, name)
        return Field("any", token.text)

    def value(self) -> str | int | float:
        token = self.token
        if token.kind == "string":
            self.index += 1
            return re.sub(r"\\(.)", r"\1", token.text[1:-1])
        if token.kind == "word" and token.text.lower() not in KEYWORDS:
            self.index += 1
            if _NUMBER.match(token.text):
                is_integer = not any(c in token.text for c in ".eE")
                return int(token.text) if is_integer else float(token.text)
            return token.text
        raise self.fail('expected a value (a number, a word or a "quoted string")')

    def comparison(self) -> Compare:
        field = self.field()
        token = self.token
        if token.kind == "op":
            self.index += 1
            return Compare(field, token.text, (self.value(),))
        if self.keyword("in"):
            if not self.punct("["):
                raise self.fail("expected '[' after 'in'")
            values = [self.value()]
            while self.punct(","):
                values.append(self.value())
            if not self.punct("]"):
                raise self.fail("expected ',' or ']'")
            return Compare(field, "in", tuple(values))
        if self.keyword("has"):
            return Compare(field, "has", (self.value(),))
        if self.keyword("matches"):
            value_token = self.token
            spec = self.value()
            try:
                semantic_version.SimpleSpec(str(spec))
            except ValueError:
                raise FilterSyntaxError(
                    self.text, value_token.position, f'{spec!r} is not a semver range such as ">=1.2,<2"'
                ) from None
            return Compare(field, "matches", (str(spec),))
        if self.keyword("exists"):
            return Compare(field, "exists")
        raise self.fail("expected an operator (==, !=, <, <=, >, >=, in, has, matches, exists)")


def parse(text: str) -> Node:
    """The syntax tree of a filter expression; FilterSyntaxError (a PolicyError) if it is malformed."""
    if not isinstance(text, str):
        raise PolicyError(f"a filter must be a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise FilterSyntaxError(text[:60] + "...", 0, f"filter longer than {MAX_LENGTH} characters")
    if not text.strip():
        raise FilterSyntaxError(text, 0, "empty filter")
    return _Parser(text).parse()


# --- Printing: the canonical text, which parses back to the same tree ------------------------


def _value_text(value: str | int | float) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if _BARE.match(value) and value.lower() not in KEYWORDS and not _NUMBER.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unparse(node: Node) -> str:
    if isinstance(node, Or):
        return " or ".join(_child(o, Or) for o in node.operands)
    if isinstance(node, And):
        return " and ".join(_child(o, And) for o in node.operands)
    if isinstance(node, Not):
        return "not " + _child(node.operand, Not)
    field = node.field.text()
    if node.op == "exists":
        return f"{field} exists"
    if node.op == "in":
        return f"{field} in [{', '.join(_value_text(v) for v in node.values)}]"
    return f"{field} {node.op} {_value_text(node.values[0])}"


def _child(node: Node, parent: type) -> str:
    # parentheses only where precedence needs them: or inside and/not, and inside not,
    # and any same-kind nesting (which the parser would otherwise flatten)
    needs = isinstance(node, Or | And) and (parent is Not or isinstance(node, Or) or parent is And)
    return f"({unparse(node)})" if needs else unparse(node)


# --- Evaluation: compiled once into closures (a release's filter runs on every check-in) ----

Facts = tuple[Mapping[str, str], Mapping[str, str]]  # (attributes, labels)
Predicate = Callable[[Mapping[str, str], Mapping[str, str]], bool]


def _getter(field: Field) -> Callable[[Mapping[str, str], Mapping[str, str]], str | None]:
    name = field.name
    if field.scope == "labels":
        return lambda attributes, labels: labels.get(name)
    if field.scope == "attributes":
        return lambda attributes, labels: attributes.get(name)

    def either(attributes: Mapping[str, str], labels: Mapping[str, str]) -> str | None:
        found = attributes.get(name)
        return labels.get(name) if found is None else found

    return either


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


@lru_cache(maxsize=4096)  # a fleet reports few distinct versions; parsing them is the slow part
def _as_version(text: str) -> semantic_version.Version | None:
    try:
        return semantic_version.Version.coerce(str(text))
    except ValueError:
        return None


def _equal(actual: str, expected: str | int | float) -> bool:
    if isinstance(expected, str):
        return actual == expected
    return _as_number(actual) == expected


_ORDER = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _ordered(op: str, actual: str, expected: str | int | float) -> bool:
    compare = _ORDER[op]
    left, right = _as_number(actual), _as_number(expected) if isinstance(expected, str) else expected
    if left is not None and right is not None:
        return compare(left, right)
    left_v, right_v = _as_version(actual), _as_version(str(expected))
    if left_v is not None and right_v is not None:
        return compare(left_v, right_v)
    return False


def _compile_compare(node: Compare) -> Predicate:
    get = _getter(node.field)
    op, values = node.op, node.values
    if op == "exists":
        return lambda a, lab: get(a, lab) is not None
    if op == "==" or op == "in":
        strings = frozenset(v for v in values if isinstance(v, str))
        numbers = frozenset(v for v in values if not isinstance(v, str))

        def member(a: Mapping[str, str], lab: Mapping[str, str]) -> bool:
            actual = get(a, lab)
            if actual is None:
                return False
            return actual in strings or (bool(numbers) and _as_number(actual) in numbers)

        return member
    if op == "!=":
        expected = values[0]
        return lambda a, lab: (actual := get(a, lab)) is not None and not _equal(actual, expected)
    if op == "has":
        wanted = str(values[0])
        return lambda a, lab: (
            (actual := get(a, lab)) is not None and wanted in {part.strip() for part in actual.split(",")}
        )
    if op == "matches":
        spec = semantic_version.SimpleSpec(str(values[0]))

        def in_range(a: Mapping[str, str], lab: Mapping[str, str]) -> bool:
            version = _as_version(get(a, lab)) if get(a, lab) is not None else None
            return version is not None and version in spec

        return in_range
    expected = values[0]
    return lambda a, lab: (actual := get(a, lab)) is not None and _ordered(op, actual, expected)


def compile_node(node: Node) -> Predicate:
    if isinstance(node, Compare):
        return _compile_compare(node)
    if isinstance(node, Not):
        inner = compile_node(node.operand)
        return lambda a, lab: not inner(a, lab)
    parts = tuple(compile_node(o) for o in node.operands)
    if isinstance(node, And):
        return lambda a, lab: all(p(a, lab) for p in parts)
    return lambda a, lab: any(p(a, lab) for p in parts)


@dataclass(frozen=True)
class Filter:
    """A parsed, compiled filter; ``Filter.parse(text)`` raises FilterSyntaxError on bad input."""

    text: str
    node: Node
    predicate: Predicate

    @classmethod
    def parse(cls, text: str) -> Filter:
        node = parse(text)
        return cls(text=unparse(node), node=node, predicate=compile_node(node))

    def __call__(self, attributes: Mapping[str, str], labels: Mapping[str, str]) -> bool:
        return self.predicate(attributes, labels)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Filter) and other.node == self.node

    def __hash__(self) -> int:
        return hash(self.node)
