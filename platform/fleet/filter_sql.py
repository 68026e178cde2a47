"""Ferry's filter language (deploy/filters.py) as a SQL condition on fleet_device, where it can be.

The REST device list pages through 100,000 devices: a filter evaluated in Python reads every
device's facts and then names the matches in a list of ids; the same filter as a condition
in the page's own query lets PostgreSQL read devices in page order until the page is full.

Translated, with the Python evaluation's exact meaning: ``==``, ``!=`` and ``in`` with word or
string values, ``exists``, ``and``, ``or``, ``not``. A plain name reads the attribute, else the
label of that name; a value is compared as deploy.filters sees it, ``str()`` of the stored
JSON value (true/false/null read "True"/"False"/"None"; strings, as the gateway and the API
store every attribute and label, are themselves). Anything else (numbers as values, ``<``,
``>``, ``has``, ``matches``) is left to Python: :func:`condition` answers None.
"""

from __future__ import annotations

from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from deploy.filters import And, Compare, Field, Node, Not, Or, parse

TABLE = '"fleet_device"'


class Untranslatable(Exception):
    pass


def condition(text: str) -> RawSQL | None:
    """The filter as a boolean expression over fleet_device, or None when part of it is not
    translatable; PolicyError (FilterSyntaxError) when it does not parse."""
    try:
        sql, params = _node(parse(text))
    except Untranslatable:
        return None
    return RawSQL(sql, params, output_field=BooleanField())


def _as_python_str(column: str) -> str:
    """str() of the JSON value under the key (NULL when absent), as deploy/filters reads it."""
    value = f"{TABLE}.{column} -> %s"
    return (
        f"(CASE jsonb_typeof({value}) WHEN 'boolean' THEN (CASE WHEN {value} = 'true'::jsonb "
        f"THEN 'True' ELSE 'False' END) WHEN 'null' THEN 'None' ELSE {TABLE}.{column} ->> %s END)"
    )


def _actual(field: Field) -> tuple[str, list]:
    if field.scope in ("attributes", "labels"):
        return _as_python_str(field.scope), [field.name] * 3
    attribute, label = _as_python_str("attributes"), _as_python_str("labels")
    sql = f"(CASE WHEN jsonb_exists({TABLE}.attributes, %s) THEN {attribute} ELSE {label} END)"
    return sql, [field.name, *[field.name] * 3, *[field.name] * 3]


def _compare(node: Compare) -> tuple[str, list]:
    actual, params = _actual(node.field)
    if node.op == "exists":
        return f"({actual} IS NOT NULL)", params
    if any(not isinstance(v, str) for v in node.values):
        raise Untranslatable  # a number compares as a number: Python's float() decides
    if node.op in ("==", "in"):
        marks = ", ".join(["%s"] * len(node.values))
        return f"COALESCE({actual} IN ({marks}), false)", [*params, *node.values]
    if node.op == "!=":
        return f"COALESCE({actual} <> %s, false)", [*params, node.values[0]]
    raise Untranslatable


def _node(node: Node) -> tuple[str, list]:
    if isinstance(node, Compare):
        return _compare(node)
    if isinstance(node, Not):
        sql, params = _node(node.operand)
        return f"(NOT {sql})", params
    parts = [_node(operand) for operand in node.operands]
    joiner = " AND " if isinstance(node, And) else " OR "
    assert isinstance(node, And | Or)
    return "(" + joiner.join(sql for sql, _ in parts) + ")", [p for _, params in parts for p in params]
