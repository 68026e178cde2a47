"""The device's local chat API: a subset of OpenAI's chat-completions API over an LLM package.

Modules: ``errors`` (``ApiError``: a status and OpenAI's error shape), ``chat_request`` (a request
body checked field by field into a ``ChatRequest``), ``template`` (the package's chat template
rendered in a sandbox), ``service`` (one loaded package: the queue, generation, the figures the
agent reports), ``server`` (the HTTP door on 127.0.0.1 or a UNIX socket) and ``standalone``
(``ferry-agent serve-llm``: a package directory or archive, without a control plane), ``health``
(an LLM package's self-test at activation) and ``host`` (the running agent's ``--llm-port``).
"""
