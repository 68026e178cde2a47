"""The KV cache's int8 storage (per kv head and position scales) against float32, prefix reuse
across requests (the same logits and tokens as a fresh prefill, fewer tokens prefilled), and the
context limit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import jit, kernels
from engine.llm.cache import KVCache
from engine.llm.checkpoint import load_checkpoint
from engine.llm.errors import ContextLimitError
from engine.llm.generate import Generator, generate
from engine.llm.lora import LoraAdapter
from engine.llm.model import LlmModel, weights_from_checkpoint
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer
from tests.engine.llm.checkpoints import TEXT, write_checkpoint

GREEDY = SamplingOptions(temperature=0)
# int8 KV against fp32 KV on these models: every logit within 5% of the logits' spread and the
# same argmax at >= 95% of positions (measured: ~1.8% and 100%)
INT8_LOGIT_TOLERANCE = 0.05
INT8_MIN_TOP1 = 0.95


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlmModel, LlmTokenizer]:
    directory = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(directory, "qwen2", max_position_embeddings=64)
    checkpoint = load_checkpoint(directory)
    model = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint))
    return model, LlmTokenizer.from_directory(directory)


def _teacher_forced(model: LlmModel, tokens: list[int], kind: str, prefill: int = 8) -> np.ndarray:
    """Logits at every position: ``prefill`` tokens in one block, then one decode step each."""
    cache = model.new_cache(kind=kind)
    rows = [model.forward(tokens[:prefill], cache, all_logits=True)]
    rows += [model.forward([t], cache)[None] for t in tokens[prefill:]]
    return np.concatenate(rows)


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_int8_kv_logits_stay_within_the_stated_tolerance_of_fp32(model_type: str, tmp_path: Path) -> None:
    write_checkpoint(tmp_path, model_type, seed=3, max_position_embeddings=64)
    checkpoint = load_checkpoint(tmp_path)
    model = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint))
    tokens = LlmTokenizer.from_directory(tmp_path).encode(TEXT)[:64]
    exact, int8 = _teacher_forced(model, tokens, "fp32"), _teacher_forced(model, tokens, "int8")
    assert not np.array_equal(exact, int8)  # the int8 path really ran
    assert np.abs(exact - int8).max() <= INT8_LOGIT_TOLERANCE * exact.std()
    assert np.mean(exact.argmax(axis=1) == int8.argmax(axis=1)) >= INT8_MIN_TOP1


def test_int8_storage_rounds_each_vector_to_half_its_scale_and_takes_a_quarter_of_the_bytes(
    llm: tuple,
) -> None:
    model, _ = llm
    c = model.config
    exact, int8 = KVCache(c, 32), KVCache(c, 32, "int8")
    assert int8.nbytes < exact.nbytes / 3
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((5, c.num_kv_heads, c.head_dim)).astype(np.float32) * 3
    values = rng.standard_normal((5, c.num_kv_heads, c.head_dim)).astype(np.float32)
    values[2, 0] = 0.0  # an all-zero vector must not divide by its zero scale
    int8.write(1, 4, keys, values)
    got_keys, got_values = int8.read(1, 9)
    for got, want, scales in ((got_keys, keys, int8.key_scales), (got_values, values, int8.value_scales)):
        error = np.abs(got[:, 4:9] - want.transpose(1, 0, 2))
        assert np.all(error <= scales[1, :, 4:9, None] / 2 + 1e-6)
    assert np.all(got_values[0, 6] == 0.0) and np.isfinite(got_values).all()


@pytest.mark.parametrize("total", [1, 7, 50])
def test_every_decode_attention_candidate_reads_an_int8_cache_as_its_dequantized_floats(total: int) -> None:
    rng = np.random.default_rng(5)
    heads, kv, d, context = 6, 2, 16, 64
    q = rng.standard_normal((heads, d)).astype(np.float32)
    keys = rng.integers(-127, 128, (kv, context, d)).astype(np.int8)
    values = rng.integers(-127, 128, (kv, context, d)).astype(np.int8)
    key_scales = rng.uniform(0.001, 0.02, (kv, context)).astype(np.float32)
    value_scales = rng.uniform(0.001, 0.02, (kv, context)).astype(np.float32)
    key_scales[:, total:] = value_scales[:, total:] = np.nan  # positions past ``total`` are not read
    expected = []
    for h in range(heads):
        g = h // (heads // kv)
        k = keys[g, :total].astype(np.float64) * key_scales[g, :total, None]
        v = values[g, :total].astype(np.float64) * value_scales[g, :total, None]
        s = k @ q[h] * 0.25
        e = np.exp(s - s.max())
        expected.append(e / e.sum() @ v)
    jit.load(ops=["LlmDecodeAttention"])
    found = kernels.candidates("LlmDecodeAttention", {}, [])
    assert len(found) == (2 if jit.enabled() else 1)
    for kernel in found:
        out = kernel([q, keys, key_scales, values, value_scales], {"total": total, "scale": 0.25})[0]
        np.testing.assert_allclose(out, np.concatenate(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_a_reused_prefix_gives_a_fresh_prefills_logits_and_prefills_only_the_rest(
    llm: tuple, kind: str
) -> None:
    model, tokenizer = llm
    tokens = tokenizer.encode(TEXT)[:48]
    cache = model.new_cache(kind=kind)
    model.forward(tokens[:20], cache)  # a first request: the shared 20 tokens...
    model.forward(tokens[30:40], cache)  # ...then a continuation the next request does not share
    assert cache.common_prefix(tokens[:40]) == 20
    cache.truncate(20)
    reused = model.forward(tokens[20:40], cache)
    # bit for bit what a fresh cache computes with the same block split: nothing stale is read
    split = model.new_cache(kind=kind)
    model.forward(tokens[:20], split)
    np.testing.assert_array_equal(reused, model.forward(tokens[20:40], split))
    # and a one-block fresh prefill up to the float rounding of another block split
    fresh = model.forward(tokens[:40], model.new_cache(kind=kind))
    np.testing.assert_allclose(reused, fresh, rtol=0, atol=1e-5 * np.abs(fresh).max())
    assert reused.argmax() == fresh.argmax()


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_the_generator_reuses_the_shared_system_prompt_and_generates_the_same_tokens(
    llm: tuple, kind: str
) -> None:
    model, tokenizer = llm
    system = tokenizer.encode(TEXT[:120])
    first, second = system + tokenizer.encode(" the ferry"), system + tokenizer.encode(" the island")
    generator = Generator(model, tokenizer, kv_cache=kind)
    one = generator.generate(first, max_tokens=5, options=GREEDY, stop_tokens=[])
    two = generator.generate(second, max_tokens=5, options=GREEDY, stop_tokens=[])
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert one.reused_tokens == 0 and one.prefilled_tokens == len(first)
    assert two.reused_tokens == shared >= len(system) - 1
    assert two.prefilled_tokens == len(second) - shared
    fresh = generate(model, tokenizer, second, max_tokens=5, options=GREEDY, stop_tokens=[],
                     cache=model.new_cache(kind=kind))  # fmt: skip
    assert two.tokens == fresh.tokens and two.text == fresh.text


def test_a_chats_next_turn_reuses_the_previous_prompt_and_reply(llm: tuple) -> None:
    model, tokenizer = llm
    generator = Generator(model, tokenizer)
    prompt = tokenizer.encode("On the island the road")
    reply = generator.generate(prompt, max_tokens=6, options=GREEDY, stop_tokens=[])
    follow = prompt + reply.tokens + tokenizer.encode(" and the sea")
    again = generator.generate(follow, max_tokens=3, options=GREEDY, stop_tokens=[])
    # the cache holds the prompt and every reply token but the last (sampled, never run)
    assert again.reused_tokens == len(prompt) + len(reply.tokens) - 1
    same = generator.generate(follow, max_tokens=3, options=GREEDY, stop_tokens=[])
    assert same.reused_tokens == len(follow) - 1 and same.tokens == again.tokens  # one token to run


def test_another_adapter_does_not_reuse_the_bases_cache(llm: tuple) -> None:
    model, tokenizer = llm
    generator = Generator(model, tokenizer)
    prompt = tokenizer.encode("Passengers drink tea")
    generator.generate(prompt, max_tokens=2, options=GREEDY, stop_tokens=[])
    adapter = LoraAdapter(name="empty", rank=1, layers=[{} for _ in range(model.config.num_layers)])
    assert generator.generate(prompt, max_tokens=2, options=GREEDY, adapter=adapter).reused_tokens == 0
    assert generator.generate(prompt, max_tokens=2, options=GREEDY, adapter=adapter).reused_tokens > 0


def test_the_context_limit_is_a_clear_error_before_any_work_and_the_cache_survives(llm: tuple) -> None:
    model, tokenizer = llm
    generator = Generator(model, tokenizer, kv_cache="int8")
    prompt = tokenizer.encode(TEXT)[:40]
    generator.generate(prompt, max_tokens=24, options=GREEDY, stop_tokens=[])  # 40 + 24 - 1 fits 64
    assert generator.cache.length == 63
    refused = r"40 prompt tokens and max_tokens=26 need 65 of the context length's 64"
    with pytest.raises(ContextLimitError, match=refused):
        generator.generate(prompt, max_tokens=26, options=GREEDY, stop_tokens=[])
    # refused before prefilling: the cache still holds the prompt, reused by the next request
    assert generator.generate(prompt, max_tokens=2, options=GREEDY).reused_tokens == 39
    with pytest.raises(ContextLimitError, match="context length 80 must be between 1 and the model's 64"):
        model.new_cache(80)
    with pytest.raises(ValueError, match="KV cache kind 'int4'"):
        model.new_cache(kind="int4")
