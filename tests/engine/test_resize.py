"""Resize: random shapes and attributes against onnx's reference (opsets 19, 13, 11), opset 10 and
tf_half_pixel_for_nn against onnxruntime (the reference cannot run either), torch's two usual
exports against onnxruntime, and the errors for bad attributes and inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine import Session
from engine.errors import NodeExecutionError, UnsupportedOperatorError
from engine.ops.resize import check_resize, resize
from tests.engine.helpers import (
    assert_same,
    check_op,
    run_engine,
    run_onnxruntime,
    run_reference,
    single_node_model,
    write_model_package,
)

SETTINGS = settings(max_examples=25, deadline=None)
COORDINATES = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# up- and downsampling, exact binary fractions and not
SCALES = [0.25, 0.5, 0.6, 0.75, 1.0, 1.3, 1.5, 2.0, 2.5, 3.0]


def _data(draw, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype in ("uint8", "int8"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _roi(draw, n: int) -> np.ndarray:
    """A crop box per axis, reaching past the input at times (those outputs are extrapolated)."""
    starts = [draw(st.sampled_from([0.0, -0.2, 0.1, 0.25, 0.4])) for _ in range(n)]
    ends = [s + draw(st.sampled_from([0.3, 0.5, 0.8, 1.0, 1.2])) for s in starts]
    return np.array(starts + ends, np.float32)


@st.composite
def resize_cases(draw, opset: int = 19, dtypes: tuple[str, ...] = ("float32",)):
    """(inputs [X, roi, scales, sizes], attrs) over the attribute space of ``opset``."""
    rank = draw(st.integers(3, 5))
    shape = tuple(draw(st.lists(st.integers(1, 5 if rank == 5 else 7), min_size=rank, max_size=rank)))
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    # half_pixel_symmetric: the reference's coordinates land a hair off integers (1 + 2e-16) and
    # its taps then a pixel off (7 -> 3 linear gives 0 for 10); onnxruntime is its oracle:
    # test_half_pixel_symmetric_follows_onnxruntime
    coordinates = [c for c in COORDINATES if c != "half_pixel_symmetric"]
    attrs = {"mode": mode, "coordinate_transformation_mode": draw(st.sampled_from(coordinates))}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(NEAREST_MODES))
    else:
        attrs["exclude_outside"] = draw(st.integers(0, 1))
        if opset >= 18:
            attrs["antialias"] = draw(st.integers(0, 1))
        if mode == "cubic":
            attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.75, -0.5, -0.6]))
    axes = list(range(rank))
    if opset >= 18 and draw(st.booleans()):
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        attrs["axes"] = [a - rank if draw(st.booleans()) else a for a in axes]  # negative ones too
    scales = sizes = None
    # pytorch_half_pixel with an output of length 1: the reference departs from the spec and
    # onnxruntime there (test_pytorch_half_pixel_to_length_one_follows_onnxruntime)
    one_ok = attrs["coordinate_transformation_mode"] != "pytorch_half_pixel"
    if draw(st.booleans()):
        choices = SCALES if one_ok else [s for s in SCALES if s >= 2]
        scales = np.array([draw(st.sampled_from(choices)) for _ in axes], np.float32)
    else:
        sizes = np.array([draw(st.integers(1 if one_ok else 2, 2 * shape[a] + 2)) for a in axes], np.int64)
        if opset >= 18 and one_ok:
            attrs["keep_aspect_ratio_policy"] = draw(
                st.sampled_from(["stretch", "not_larger", "not_smaller"])
            )
    roi = None
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        roi = _roi(draw, len(axes))
        attrs["extrapolation_value"] = draw(st.sampled_from([0.0, -1.5, 7.0]))
    elif opset < 13:
        roi = np.zeros(0, np.float32)  # a required input before opset 13
    if opset < 13 and scales is None:
        scales = np.zeros(0, np.float32)  # ditto: empty when sizes is given
    x = _data(draw, shape, draw(st.sampled_from(dtypes)))
    return [x, roi, scales, sizes], attrs


def check_resize_op(
    inputs: list[np.ndarray | None], attrs: dict, opset: int = 19, rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    """check_op, except that onnx's reference fails on negative axes (it hands them to
    numpy.transpose), so it gets them normalised while the engine gets them as drawn."""
    if not any(a < 0 for a in attrs.get("axes", [])):
        check_op("Resize", inputs, attrs, opset=opset, rtol=rtol, atol=atol)
        return
    model, feeds = single_node_model("Resize", inputs, attrs, opset=opset)
    reference_model, _ = single_node_model(
        "Resize", inputs, _positive_axes(attrs, inputs[0].ndim), opset=opset
    )
    assert_same(run_engine(model, feeds), run_reference(reference_model, feeds), rtol, atol)


def _positive_axes(attrs: dict, rank: int) -> dict:
    return dict(attrs, axes=[a % rank for a in attrs["axes"]]) if "axes" in attrs else attrs


@SETTINGS
@given(resize_cases())
def test_resize_matches_reference(case):
    inputs, attrs = case
    check_resize_op(inputs, attrs)


@SETTINGS
@given(resize_cases(dtypes=("uint8", "int8")))
def test_resize_integer_inputs_match_reference(case):
    """Integers are resampled in float64, then rounded half to even and saturated, as the
    reference does: outputs are identical, except that a result close to a .5 tie may round
    either way (the two sum the taps in different orders, and the reference's cubic weights are
    float32: see the float64 test).  The reference run on the float64 input gives the values it rounded,
    to tell those ties."""
    inputs, attrs = case
    x, attrs = inputs[0], _positive_axes(attrs, inputs[0].ndim)
    model, feeds = single_node_model("Resize", inputs, attrs, opset=19)
    (got,) = run_engine(model, feeds)
    (want,) = run_reference(model, feeds)
    model64, feeds64 = single_node_model("Resize", [x.astype(np.float64), *inputs[1:]], attrs, opset=19)
    (exact,) = run_reference(model64, feeds64)
    assert got.dtype == want.dtype == x.dtype and got.shape == want.shape
    # the reference's float32 weights put its float64 sums up to ~3e-4 off (4.50016 for an exact 4.5)
    tie = np.abs(exact - np.floor(exact) - 0.5) < 1e-3
    np.testing.assert_array_equal(got[~tie], want[~tie])
    assert np.all(np.abs(got[tie].astype(np.int64) - want[tie].astype(np.int64)) <= 1)


@SETTINGS
@given(resize_cases(dtypes=("float64",)))
def test_resize_double_inputs_match_reference(case):
    """float64 is resampled in float64; the reference computes its cubic weights in float32
    (cubic_coeff_a reaches it as a numpy float32), hence 1e-5 (linear and nearest agree to 1e-12)."""
    inputs, attrs = case
    tolerance = 1e-5 if attrs["mode"] == "cubic" else 1e-12
    check_resize_op(inputs, attrs, rtol=tolerance, atol=tolerance)


@SETTINGS
@given(resize_cases(dtypes=("float16",)))
def test_resize_float16_matches_reference(case):
    """float16 is computed in float32 where the reference computes in float64: the cast back to
    float16 may then land one float16 step (~1e-3 relative) apart."""
    inputs, attrs = case
    check_resize_op(inputs, attrs, rtol=2e-3, atol=2e-3)


@SETTINGS
@given(st.one_of(resize_cases(opset=13), resize_cases(opset=11)), st.sampled_from([11, 13]))
def test_resize_older_opsets_match_reference(case, opset):
    """Opsets 11-17: no axes, keep_aspect_ratio_policy, antialias or half_pixel_symmetric; roi
    (and scales, when sizes is given) may be empty tensors."""
    inputs, attrs = case
    x, roi, scales, sizes = inputs
    if opset < 13:
        roi = np.zeros(0, np.float32) if roi is None else roi
        scales = np.zeros(0, np.float32) if scales is None else scales
    check_op("Resize", [x, roi, scales, sizes], attrs, opset=opset)


@SETTINGS
@given(
    st.integers(3, 5).flatmap(lambda r: st.lists(st.integers(1, 6), min_size=r, max_size=r)),
    st.sampled_from(["nearest", "linear"]),
    st.data(),
)
def test_resize_opset10_matches_onnxruntime(shape, mode, data):
    """Resize-10 (inputs X, scales): asymmetric coordinates, nearest rounds down when upsampling
    and up when downsampling.  The reference cannot run it (it reads scales as roi), so
    onnxruntime is the oracle; the scales are binary fractions, on which its float32 coordinates
    round to the same source pixels as float64 ones."""
    scales = np.array([data.draw(st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0])) for _ in shape])
    if mode == "linear":
        scales[:2] = 1  # onnxruntime's linear resizes only the axes after batch and channel
    x = np.random.default_rng(data.draw(st.integers(0, 2**16))).standard_normal(shape).astype(np.float32)
    model, feeds = single_node_model("Resize", [x, scales.astype(np.float32)], {"mode": mode}, opset=10)
    assert_same(run_engine(model, feeds), run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)


def test_resize_opset10_nearest_floors_upsampling_and_ceils_downsampling():
    """The rule in numbers: 5 -> 3 samples 0, 1.43, 2.86 -> pixels 0, 2, 3; 2 -> 3 samples
    0, 0.67, 1.33 -> pixels 0, 0, 1."""
    x = np.array([[[[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]]], np.float32)
    model, feeds = single_node_model("Resize", [x, np.array([1, 1, 1.5, 0.7], np.float32)], {}, opset=10)
    (got,) = run_engine(model, feeds)
    np.testing.assert_array_equal(got, [[[[0, 2, 3], [0, 2, 3], [5, 7, 8]]]])
    np.testing.assert_array_equal(got, run_onnxruntime(model, feeds)[0])


@pytest.mark.parametrize("scale", [0.5, 1.5, 2.0, 3.0])
def test_tf_half_pixel_for_nn_matches_onnxruntime(scale):
    """tf_half_pixel_for_nn (opsets 11-12): the reference does not know it; onnxruntime does."""
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 6)).astype(np.float32)
    inputs = [x, np.zeros(0, np.float32), np.array([1, 1, scale, scale], np.float32)]
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    model, feeds = single_node_model("Resize", inputs, attrs, opset=11)
    assert_same(run_engine(model, feeds), run_onnxruntime(model, feeds), rtol=0, atol=0)


@pytest.mark.parametrize(
    "attrs",
    [
        # torch's F.interpolate(scale_factor=2, mode="bilinear", align_corners=False)
        {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
        # torch's F.interpolate(scale_factor=2, mode="nearest")
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    ],
)
def test_torch_style_2x_upsample_matches_onnxruntime(attrs):
    x = np.random.default_rng(2).standard_normal((2, 8, 13, 17)).astype(np.float32)
    inputs = [x, None, np.array([1, 1, 2, 2], np.float32)]
    model, feeds = single_node_model("Resize", inputs, attrs, opset=13)
    (got,) = run_engine(model, feeds)
    assert got.shape == (2, 8, 26, 34)
    assert got.flags.c_contiguous
    assert_same([got], run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "scales", "attrs"),
    [
        ((1, 2, 3, 300), [1, 1, 1, 2], {"mode": "linear"}),
        ((1, 1, 600, 3), [1, 1, 1.5, 1], {"mode": "cubic", "exclude_outside": 1}),
        (
            (2, 700, 2),
            [1, 0.7, 1],
            {"mode": "linear", "antialias": 1, "coordinate_transformation_mode": "align_corners"},
        ),
    ],
)
def test_long_axes_gather_taps_and_match_reference(shape, scales, attrs):
    """Axes too long for a dense (out, in) matrix take the tap-by-tap path."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    check_op("Resize", [x, None, np.array(scales, np.float32)], attrs, opset=19)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_non_finite_input_spreads_only_to_the_outputs_it_reaches(mode):
    """A dense matrix would multiply the inf by its zeros too (nan over the whole row): such
    input takes the tap path, which agrees with the reference."""
    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(1, 2, 3, 8)
    x[0, 1, 1, 2] = np.inf
    x[0, 0, 2, 6] = np.nan
    model, feeds = single_node_model("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": mode})
    (got,) = run_engine(model, feeds)
    (want,) = run_reference(model, feeds)
    # the reference saturates its float64 result into float32's range: inf comes back as max
    want[np.abs(want) == np.finfo(np.float32).max] *= np.inf
    assert_same([got], [want], rtol=1e-5, atol=1e-5)
    assert np.isfinite(got[0, 0, 0]).all() and np.isfinite(got[0, 1, :, -2:]).all()  # out of reach


def test_zero_length_output_axis():
    x = np.ones((1, 2, 3, 4), np.float32)
    check_op("Resize", [x, None, np.array([1, 1, 0.25, 1], np.float32)], {"mode": "linear"}, opset=19)
    got = resize([x, None, None, np.array([1, 2, 0, 4])], {"mode": "cubic"})[0]
    assert got.shape == (1, 2, 0, 4)


def test_unchanged_output_is_a_copy():
    x = np.ones((1, 2, 3, 4), np.float32)
    got = resize([x, None, np.array([1, 1, 1, 1], np.float32)], {"mode": "linear"})[0]
    np.testing.assert_array_equal(got, x)
    assert got is not x and not np.shares_memory(got, x)


X = np.zeros((1, 1, 4, 4), np.float32)
SCALES_4 = np.array([1, 1, 2, 2], np.float32)
SIZES_4 = np.array([1, 1, 8, 8], np.int64)


@pytest.mark.parametrize(
    ("inputs", "attrs", "message"),
    [
        ([X, None, SCALES_4, SIZES_4], {}, "exactly one of the inputs 'scales' and 'sizes', got both"),
        ([X, None, None, None], {}, "exactly one of the inputs 'scales' and 'sizes', got neither"),
        ([X, None, np.zeros(0, np.float32), np.zeros(0, np.int64)], {}, "got neither"),
        (
            [X, None, np.array([2, 2], np.float32)],
            {},
            r"scales has 2 values, expected one per axis \(the input's rank 4\)",
        ),
        (
            [X, None, None, np.array([8, 8, 8])],
            {},
            r"sizes has 3 values, expected one per axis \(the input's rank 4\)",
        ),
        (
            [X, None, None, np.array([8, 8, 8])],
            {"axes": [2, 3]},
            r"sizes has 3 values, .*the 2 axes in 'axes'",
        ),
        ([X, None, np.array([1, 1, 0, 2], np.float32)], {}, "scales must be positive and finite"),
        ([X, None, np.array([1, 1, -2, 2], np.float32)], {}, "scales must be positive and finite"),
        ([X, None, None, np.array([1, 1, -1, 8])], {}, "sizes must not be negative"),
        ([X, None, SCALES_4], {"axes": [0, 1, 2, 4]}, "axis 4 is out of range for rank 4"),
        ([X, None, SCALES_4], {"axes": [0, 1, 2, -2]}, "repeated axis"),
        (
            [X, None, SCALES_4],
            {"coordinate_transformation_mode": "tf_crop_and_resize"},
            "tf_crop_and_resize needs input 'roi'",
        ),
        (
            [X, np.array([0, 0, 1, 1], np.float32), SCALES_4],
            {"coordinate_transformation_mode": "tf_crop_and_resize"},
            r"roi has 4 values, expected 8 \(a start and an end per axis\)",
        ),
        (
            [np.zeros((1, 0, 4), np.float32), None, None, np.array([1, 2, 4])],
            {},
            "cannot resize axis 1 of length 0 to 2",
        ),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_problem(inputs, attrs, message):
    with pytest.raises(ValueError, match=message):
        resize(inputs, attrs)


def test_bad_input_at_run_names_the_node(tmp_path):
    model, feeds = single_node_model("Resize", [X, None, SCALES_4, SIZES_4], {"mode": "linear"}, opset=19)
    session = Session(write_model_package(model, tmp_path / "m.ferry", feeds), threads=1)
    with pytest.raises(NodeExecutionError, match=r"'the_resize' \(Resize\).*got both"):
        session.run(feeds)


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"mode": "bicubic"}, "Resize mode 'bicubic' is not one of nearest, linear, cubic"),
        (
            {"coordinate_transformation_mode": "corners"},
            "coordinate_transformation_mode 'corners' is not one of",
        ),
        ({"nearest_mode": "round"}, "nearest_mode 'round' is not one of"),
        ({"keep_aspect_ratio_policy": "fit"}, "keep_aspect_ratio_policy 'fit' is not one of"),
        ({"mode": "nearest", "antialias": 1}, "antialias=1 needs mode linear or cubic"),
        ({"exclude_outside": 1}, "exclude_outside=1 has no meaning for mode nearest"),
    ],
)
def test_unsupported_attributes_are_refused(attrs, reason):
    assert reason in check_resize(attrs, 3, 1)


def test_bad_mode_fails_at_load_naming_the_node(tmp_path):
    model, feeds = single_node_model("Resize", [X, None, SCALES_4], {"mode": "area"}, opset=19)
    path = write_model_package(model, tmp_path / "m.ferry", feeds)
    with pytest.raises(UnsupportedOperatorError, match="node 'the_resize': Resize mode 'area' is not one of"):
        Session(path)


def test_supported_attributes_pass_the_check():
    assert check_resize({}, 1, 1) is None
    assert check_resize({"mode": "cubic", "antialias": 1, "exclude_outside": 1}, 3, 1) is None
    assert check_resize({"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, 3, 1) is None


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize(("size", "scales", "sizes"), [(3, [1, 1, 1, 0.5], None), (4, None, [1, 2, 3, 1])])
def test_pytorch_half_pixel_to_length_one_follows_onnxruntime(mode, size, scales, sizes):
    """The spec (and onnxruntime) map an output of length 1 to input coordinate 0; the reference
    maps it to -0.5 or by the general formula, so onnxruntime is the oracle here."""
    x = (
        np.random.default_rng(size).standard_normal((1, 2, 3, size)).astype(np.float32)
    )  # 4-D: onnxruntime's cubic
    as_array = lambda v, t: None if v is None else np.array(v, t)  # noqa: E731
    inputs = [x, None, as_array(scales, np.float32), as_array(sizes, np.int64)]
    model, feeds = single_node_model(
        "Resize", inputs, {"mode": mode, "coordinate_transformation_mode": "pytorch_half_pixel"}, opset=19
    )
    got = run_engine(model, feeds)
    assert got[0].shape[-1] == 1
    assert_same(got, run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_a_coordinate_a_hair_past_zero_keeps_its_pixel_follows_onnxruntime(exclude_outside):
    """Keeping the aspect ratio, half_pixel_symmetric maps output 0 to 1e-16: its cubic taps
    must still centre on pixel 0 (they sat one pixel left, all outside, and gave 0 when
    excluded). The reference answers -0.244 here, so onnxruntime is the oracle."""
    x = np.random.default_rng(7).standard_normal((2, 3)).astype(np.float32)  # 2-D: onnxruntime's cubic
    attrs = {
        "mode": "cubic",
        "coordinate_transformation_mode": "half_pixel_symmetric",
        "exclude_outside": exclude_outside,
        "cubic_coeff_a": -0.6,
        "keep_aspect_ratio_policy": "not_larger",
    }
    model, feeds = single_node_model("Resize", [x, None, None, np.array([1, 2], np.int64)], attrs, opset=19)
    got = run_engine(model, feeds)
    assert got[0].shape == (1, 2)
    assert_same(got, run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-6)


@st.composite
def symmetric_cases(draw):
    """half_pixel_symmetric, linear and cubic, on 2-D inputs (onnxruntime's bilinear and
    bicubic). Nearest is left to the fixed cases below: where the exact coordinate is an integer
    (or a tie), onnxruntime's float32 arithmetic picks a side by a hair, which no formula matches."""
    mode = draw(st.sampled_from(["linear", "cubic"]))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=2, max_size=2)))
    attrs = {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}
    if mode == "cubic":  # (onnxruntime excludes outside pixels for cubic only, without antialias)
        attrs["exclude_outside"] = draw(st.integers(0, 1))
        attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.75, -0.5, -0.6]))
    scales = sizes = None
    if draw(st.booleans()):
        scales = np.array([draw(st.sampled_from(SCALES)) for _ in shape], np.float32)
    else:
        sizes = np.array([draw(st.integers(1, 2 * n + 2)) for n in shape], np.int64)
        attrs["keep_aspect_ratio_policy"] = draw(st.sampled_from(["stretch", "not_larger", "not_smaller"]))
    return [_data(draw, shape, "float32"), None, scales, sizes], attrs


@SETTINGS
@given(symmetric_cases())
def test_half_pixel_symmetric_follows_onnxruntime(case):
    inputs, attrs = case
    model, feeds = single_node_model("Resize", inputs, attrs, opset=19)
    got = run_engine(model, feeds)
    assume(got[0].shape != inputs[0].shape)  # onnxruntime copies the input then, whatever the scales
    assert_same(got, run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("mode", "nearest_mode"), [*(("nearest", m) for m in NEAREST_MODES), ("linear", None), ("cubic", None)]
)
def test_half_pixel_symmetric_seven_to_three_follows_onnxruntime(mode, nearest_mode):
    """7 -> 3 at scale 0.5: output 0 sits exactly on pixel 1 (the spec's order of operations
    gives 1 + 2e-16, and the engine, like the reference, used to answer pixel 0's value)."""
    attrs = {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}
    if mode == "nearest":
        attrs["nearest_mode"] = nearest_mode
    x = np.arange(7, dtype=np.float32).reshape(1, 7) * 10
    model, feeds = single_node_model(
        "Resize", [x, None, np.array([1, 0.5], np.float32), None], attrs, opset=19
    )
    got = run_engine(model, feeds)
    assert got[0].ravel().tolist() == [10, 30, 50]
    assert_same(got, run_onnxruntime(model, feeds), rtol=0, atol=0)
