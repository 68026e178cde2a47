"""Converting Hugging Face Llama-family checkpoints into Ferry LLM packages (``ferry convert-llm``).

``convert`` checks the checkpoint (engine/llm refuses what it cannot run, naming the field or
tensor), stores the weights at fp16/int8/int4 in the runtime's layout, measures the accuracy
against fp32 on a text (``accuracy``; the default ``sample_text.txt`` ships in the package)
and writes the package atomically.
"""
