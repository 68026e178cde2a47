"""The device list's filter as SQL (fleet.filter_sql) selects exactly the devices deploy/filters'
own evaluation selects, over fleets and filters hypothesis makes up."""

from __future__ import annotations

import pytest
from django.utils import timezone
from fleet import filter_sql
from fleet.models import Device
from fleet.selectors import device_list_filtered, devices_matching
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.filters import And, Compare, Field, Not, Or, unparse

KEYS = ["hw", "site", "zone"]
WORDS = ["pi", "jetson", "True", "None", "a b", "7", ""]
# stored values: the strings every writer stores, and what a hand-written row may hold
STORED = st.one_of(st.sampled_from(WORDS), st.booleans(), st.none(), st.integers(-3, 9))
FACTS = st.dictionaries(st.sampled_from(KEYS), STORED, max_size=3)
FIELDS = st.builds(Field, st.sampled_from(["any", "attributes", "labels"]), st.sampled_from(KEYS))
VALUES = st.sampled_from(WORDS)

COMPARES = st.one_of(
    st.builds(lambda f, v: Compare(f, "==", (v,)), FIELDS, VALUES),
    st.builds(lambda f, v: Compare(f, "!=", (v,)), FIELDS, VALUES),
    st.builds(lambda f, vs: Compare(f, "in", tuple(vs)), FIELDS, st.lists(VALUES, min_size=1, max_size=3)),
    st.builds(lambda f: Compare(f, "exists"), FIELDS),
)
NODES = st.recursive(
    COMPARES,
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.builds(lambda ops: And(tuple(ops)), st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda ops: Or(tuple(ops)), st.lists(inner, min_size=2, max_size=3)),
    ),
    max_leaves=6,
)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fleet=st.lists(st.tuples(FACTS, FACTS, st.booleans()), min_size=1, max_size=12),
    node=NODES,
)
def test_sql_selects_what_python_selects(org, fleet, node):
    text = unparse(node)
    assert filter_sql.condition(text) is not None  # every comparison here translates
    Device.objects.filter(organisation=org).delete()
    for i, (attributes, labels, revoked) in enumerate(fleet):
        Device.objects.create(
            organisation=org,
            name=f"d{i}",
            attributes=attributes,
            labels=labels,
            revoked_at=timezone.now() if revoked else None,
        )
    by_sql = {str(d.pk) for d in device_list_filtered(organisation=org, filter_text=text)}
    assert by_sql == set(devices_matching(organisation_id=org.pk, filter_text=text)), text


@pytest.mark.parametrize(
    "text", ["ram_mb >= 2048", "hw == 7", "tags has neon", 'app matches ">=1.2"', "hw == pi or ram > 1"]
)
def test_what_does_not_translate_is_left_to_python(text):
    assert filter_sql.condition(text) is None


@pytest.mark.django_db
def test_the_list_falls_back_to_python_for_those(org):
    for i, ram in enumerate(["512", "4096", "2048"]):
        Device.objects.create(organisation=org, name=f"d{i}", attributes={"ram_mb": ram})
    names = [d.name for d in device_list_filtered(organisation=org, filter_text="ram_mb >= 2048")]
    assert sorted(names) == ["d1", "d2"]
