"""bench/llm.py's peer files: llama.cpp's GGUF files made from the same checkpoint Ferry converts.

The f32 GGUF comes from the llama-cpp-python sdist's own ``convert_hf_to_gguf.py`` (a patched
copy, see ``patched_converter``), then q8_0 / q4_0 from ``llama_model_quantize`` with ``pure``
(every matrix at the type, as Ferry stores them), run in the peer's venv:

    <peer venv>/bin/python bench/llm_peer.py SOURCE.gguf DEST.gguf FTYPE
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PEER_DIR = Path(os.environ.get("FERRY_LLAMA_CPP_DIR", Path.home() / ".cache/ferry/bench/llama-cpp-python"))
PEER_TYPES = {"int8": ("q8_0", 7), "int4": ("q4_0", 2)}  # Ferry precision -> GGUF type, llama_ftype


def peer_python() -> Path | None:
    python = PEER_DIR / "venv" / "bin" / "python"
    return python if (PEER_DIR / "venv" / ".built").is_file() else None


def gguf_files(checkpoint: Path, directory: Path, precisions: list[str]) -> dict[str, Path]:
    """f32 GGUF by the sdist's converter (patched copy), then q8_0/q4_0 by llama_model_quantize."""
    f32 = directory / "llama-f32.gguf"
    if not f32.is_file():
        script = patched_converter(directory / "gguf-convert")
        env = dict(os.environ, PYTHONPATH=str(PEER_DIR / "src/vendor/llama.cpp/gguf-py"), NO_LOCAL_GGUF="1")
        command = [sys.executable, str(script), str(checkpoint), "--outfile", str(f32), "--outtype", "f32"]
        subprocess.run(command, check=True, env=env, capture_output=True)
    found = {}
    for precision in precisions:
        name, ftype = PEER_TYPES[precision]
        out = directory / f"llama-{name}.gguf"
        if not out.is_file():
            command = [str(peer_python()), __file__, str(f32), str(out), str(ftype)]
            done = subprocess.run(command, capture_output=True, text=True)  # llama.cpp's log: per tensor
            if done.returncode:
                raise SystemExit(f"quantizing {out.name} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        found[precision] = out
    return found


def patched_converter(directory: Path) -> Path:
    """A copy of convert_hf_to_gguf.py and its ``conversion`` package whose unrecognised-BPE
    check answers "gpt-2" (a byte-level BPE with GPT-2's regex, which this tokenizer is)."""
    import shutil  # noqa: PLC0415

    source = PEER_DIR / "src" / "vendor" / "llama.cpp"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(source / "conversion", directory / "conversion")
    shutil.copy(source / "convert_hf_to_gguf.py", directory)
    base = directory / "conversion" / "base.py"
    check = 'raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")'
    # upstream imports sentencepiece before it looks for tokenizer.model, so a BPE checkpoint
    # fails where sentencepiece is not installed: look first (the fallback is then the BPE vocab)
    spm = (
        "        from sentencepiece import SentencePieceProcessor\n\n"
        "        tokenizer_path = self.dir_model / 'tokenizer.model'\n"
    )
    text = base.read_text(encoding="utf-8")
    if check not in text or spm not in text:
        raise SystemExit(f"{base}: the code bench/llm.py patches moved; update its patch")
    text = text.replace(check, 'res = "gpt-2"  # patched by bench/llm.py')
    text = text.replace(
        spm,
        "        tokenizer_path = self.dir_model / 'tokenizer.model'\n"
        "        if not tokenizer_path.is_file():  # patched by bench/llm.py\n"
        "            raise FileNotFoundError(tokenizer_path)\n"
        "        from sentencepiece import SentencePieceProcessor\n",
    )
    base.write_text(text, encoding="utf-8")
    return directory / "convert_hf_to_gguf.py"


def quantize(source: str, dest: str, ftype: int) -> None:
    """Runs in the peer's venv: every tensor (embedding and output too) at ``ftype``."""
    import ctypes  # noqa: PLC0415

    import llama_cpp  # noqa: PLC0415

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.pure, params.nthread = ftype, True, 2
    if llama_cpp.llama_model_quantize(source.encode(), dest.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize {source} -> {dest} failed")


def gguf_decode_bytes(gguf: Path) -> int:
    """Bytes a llama.cpp decode step reads: its matrices (the file less metadata and vectors)."""
    return gguf.stat().st_size  # the vectors and the header are < 0.5% of it


if __name__ == "__main__":  # in the peer's venv (``gguf_files``)
    quantize(sys.argv[1], sys.argv[2], int(sys.argv[3]))
