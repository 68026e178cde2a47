"""Signature compatibility: a package fits what a device feeds, or each mismatch is named."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from deploy.compat import Contract, contract_of, describe, mismatches, pipeline_inputs

DTYPES = ["float32", "float16", "int64", "int32", "bool", "uint8"]
names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
dims = st.one_of(st.integers(1, 64), st.sampled_from(["N", "batch", "seq"]))
shapes = st.one_of(st.none(), st.lists(dims, min_size=0, max_size=4))
specs = st.builds(lambda n, d, s: {"name": n, "dtype": d, "shape": s}, names, st.sampled_from(DTYPES), shapes)
signatures = st.lists(specs, min_size=1, max_size=4, unique_by=lambda s: s["name"])


@given(signatures, signatures)
def test_a_package_fits_the_contract_it_defines(inputs, outputs):
    assert mismatches(Contract(inputs, outputs), copy.deepcopy(inputs), copy.deepcopy(outputs)) == []


@given(signatures, signatures, st.data())
def test_a_changed_input_dtype_is_named(inputs, outputs, data):
    index = data.draw(st.integers(0, len(inputs) - 1))
    changed = copy.deepcopy(inputs)
    old = changed[index]["dtype"]
    changed[index]["dtype"] = data.draw(st.sampled_from([d for d in DTYPES if d != old]))
    found = mismatches(Contract(inputs, outputs), changed, outputs)
    assert [(m.kind, m.tensor) for m in found] == [("input", inputs[index]["name"])]
    assert (
        "dtype" in found[0].reason and old in found[0].reason and changed[index]["dtype"] in found[0].reason
    )


@given(signatures, signatures, st.data())
def test_a_fixed_input_dim_of_another_size_is_named(inputs, outputs, data):
    fixed = [
        (i, a) for i, s in enumerate(inputs) for a, d in enumerate(s["shape"] or []) if isinstance(d, int)
    ]
    if not fixed:
        return
    index, axis = data.draw(st.sampled_from(fixed))
    changed = copy.deepcopy(inputs)
    changed[index]["shape"][axis] += data.draw(st.integers(1, 10))
    found = mismatches(Contract(inputs, outputs), changed, outputs)
    assert len(found) == 1 and found[0].tensor == inputs[index]["name"]
    assert f"dim {axis}" in found[0].reason


@given(signatures, signatures, st.data())
def test_a_package_that_fixes_a_dim_the_device_varies_does_not_fit(inputs, outputs, data):
    symbolic = [
        (i, a) for i, s in enumerate(inputs) for a, d in enumerate(s["shape"] or []) if isinstance(d, str)
    ]
    if not symbolic:
        return
    index, axis = data.draw(st.sampled_from(symbolic))
    changed = copy.deepcopy(inputs)
    changed[index]["shape"][axis] = 1
    found = mismatches(Contract(inputs, outputs), changed, outputs)
    assert [m.tensor for m in found] == [inputs[index]["name"]]
    # the other way round fits: a package that accepts any size where the device feeds a fixed one
    assert mismatches(Contract(changed, outputs), inputs, outputs) == []


@given(signatures, signatures)
def test_symbolic_names_do_not_matter_and_unknown_ranks_promise_nothing(inputs, outputs):
    renamed = copy.deepcopy(inputs)
    for spec in renamed:
        spec["shape"] = (
            None if spec["shape"] is None else [d if isinstance(d, int) else "x:0" for d in spec["shape"]]
        )
    assert mismatches(Contract(inputs, outputs), renamed, outputs) == []
    unknown = [{**spec, "shape": None} for spec in inputs]
    assert mismatches(Contract(inputs, outputs), unknown, outputs) == []


@given(signatures, signatures, names)
def test_missing_and_extra_tensors_are_named(inputs, outputs, extra):
    contract = Contract(inputs, outputs)
    dropped = inputs[1:]
    found = mismatches(contract, dropped, outputs)
    assert ("input", inputs[0]["name"]) in {(m.kind, m.tensor) for m in found}
    if extra not in {s["name"] for s in inputs}:
        found = mismatches(contract, [*inputs, {"name": extra, "dtype": "float32", "shape": [1]}], outputs)
        assert [(m.kind, m.tensor) for m in found] == [("input", extra)]
        assert "does not feed" in found[0].reason
    found = mismatches(contract, inputs, outputs[1:])
    assert [(m.kind, m.tensor) for m in found] == [("output", outputs[0]["name"])]
    assert "does not produce" in found[0].reason


def test_an_output_of_another_width_is_named_and_a_new_output_is_fine():
    contract = Contract(
        [{"name": "x", "dtype": "float32", "shape": ["N", 8]}],
        [{"name": "scores", "dtype": "float32", "shape": ["N", 2]}],
    )
    wider = [
        {"name": "scores", "dtype": "float32", "shape": ["N", 3]},
        {"name": "aux", "dtype": "int64", "shape": None},
    ]
    found = mismatches(contract, contract.inputs, wider)
    assert [str(m) for m in found] == [
        "output 'scores': dim 1 is 3 in the package, 2 on the device (package [N, 3], device [N, 2])"
    ]
    assert mismatches(contract, contract.inputs, [*contract.outputs, wider[1]]) == []


def test_a_pipeline_feeds_its_features_as_a_float32_batch():
    package_inputs = [{"name": "features", "dtype": "float32", "shape": ["N", 2]}]
    pipeline = {"features": {"input": "features", "values": ["w.mean", "event.v"]}}
    assert pipeline_inputs(pipeline, package_inputs) == [
        {"name": "features", "dtype": "float32", "shape": ["batch", 2]}
    ]
    assert pipeline_inputs(None, package_inputs) == package_inputs
    contract = contract_of({"inputs": package_inputs, "outputs": [], "metadata": {"pipeline": pipeline}})
    # a model that wants 3 features does not fit a pipeline that assembles 2
    wants_three = [{"name": "features", "dtype": "float32", "shape": ["N", 3]}]
    found = mismatches(contract, wants_three, [])
    assert (
        describe(found)
        == "input 'features': dim 1 is 3 in the package, 2 on the device (package [N, 3], device [batch, 2])"
    )
    # nor does one that takes a single row at a time: the pipeline batches
    single = [{"name": "features", "dtype": "float32", "shape": [1, 2]}]
    assert "dim 0 is 1 in the package, batch on the device" in describe(mismatches(contract, single, []))


def test_describe_shows_the_first_few():
    contract = Contract([{"name": n, "dtype": "float32", "shape": [1]} for n in "abcde"], [])
    found = mismatches(contract, [{"name": n, "dtype": "int64", "shape": [1]} for n in "abcde"], [])
    assert describe(found).endswith("; and 2 more") and describe(found).startswith("input 'a': dtype int64")
