"""Ferry's on-device LLM runtime for the Llama family (Llama, Qwen2, Mistral-style decoders).

Modules: ``config`` (config.json -> ``LlmConfig``, refusing what the runtime cannot run),
``safetensors`` (memory-mapped reading, no torch), ``checkpoint`` (a Hugging Face checkpoint's
tensors checked against the config), ``weights`` (fp32/fp16, int8 per-channel and int4
block-wise matrices with their GEMV and tiled GEMM), ``model`` (prefill and cached decode),
``cache`` (the preallocated KV cache), ``sampler``, ``tokenizer``, ``generate`` (the loop with
stop strings and streaming) and ``package`` (the Ferry LLM package's layout, read side).
Decode's GEMVs go through the engine's kernel layer (engine/kernels.py: numba kernels in
``engine.llm.gemv_jit`` when the JIT tier is on, numpy otherwise).
"""
