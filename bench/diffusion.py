"""Text-to-image: Ferry's diffusion pipeline beside onnxruntime on the same exported graphs.

    .venv/bin/python bench/diffusion.py                      # the small SD-style variant
    .venv/bin/python bench/diffusion.py --models small,sd15  # + SD-1.5's UNet (3.4 GB fp32)
    .venv/bin/python bench/diffusion.py --no-int8            # skip the slow int8 conversion

Builds, with diffusers and random weights (bench only; nothing is downloaded): a UNet2DCondition
model, a CLIP text encoder and a VAE decoder, exports each with torch's TorchScript exporter
(opset 17, dynamic batch and size) into diffusers' ONNX layout under var/bench/diffusion/<model>,
converts the layout with ``convert_diffusion`` (fp32 and int8), then prints:

- the UNet step (batch 2: classifier-free guidance, 32x32 latents = 256x256 images) for Ferry
  and onnxruntime at 1 and 2 threads, interleaved rounds, medians;
- a whole 20-step 256x256 image in a fresh process per runtime (graphs loaded inside the timed
  generation for both; the second generation is timed, the first plans), ``--image-pairs`` times
  each in ABBA order (the ratio: geometric mean of adjacent pairs), and its peak RSS (VmHWM),
  and Ferry's pipeline again with ``keep_sessions=True`` (Sessions kept, loaded and planned,
  from the first image: the timed one loads nothing);
- the int8 package's size against fp32 and its image's PSNR/SSIM against fp32 (same seed);
- where the UNet step's time goes per operator type, for both runtimes;
- one summary line: ``diffusion: unet step ratio R1 (1 thread), R2 (2 threads); image ratio R3;
  int8 psnr P dB`` (ratios = Ferry's time / onnxruntime's, of the last model built).

SD-1.5's UNet is only timed per step (its whole image and int8 conversion would take most of an
hour on 2 cores); the image, RSS and int8 figures come from the small variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import device_blas  # first: it may re-execute this command

device_blas.unset_overrides()

import numpy as np  # noqa: E402  (after the re-exec above)

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT)]

from converter.errors import ConversionError  # noqa: E402  (bench/ runs as a script)

OUT = Path(os.environ.get("FERRY_BENCH_DIR", ROOT / "var" / "bench")) / "diffusion"
LATENT = 32  # 256x256 images
# Runs before the timed ones, for both runtimes: Ferry's second run plans, and a 2-thread session
# then tries one thread for three runs before settling (engine/plan_threads.py); with two
# warm-ups the 2-thread median of the small UNet landed on those (58 ms against 45 settled).
WARM_UPS = 8
PROMPT = "a red ferry crossing a calm sea at sunset"
SEED = 1234

UNETS = {
    "sd15": dict(
        block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        layers_per_block=2,
        cross_attention_dim=768,
        attention_head_dim=8,
    ),
    "small": dict(
        block_out_channels=(64, 128, 128),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        cross_attention_dim=256,
        attention_head_dim=8,
    ),
}
TEXT = {
    "sd15": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4),
}
SCHEDULER = {
    "_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "num_train_timesteps": 1000, "steps_offset": 1,
    "set_alpha_to_one": False, "skip_prk_steps": True, "clip_sample": False,
}  # fmt: skip


# -- building and exporting (torch, diffusers: bench only) --------------------------------------


def _byte_vocab() -> tuple[dict[str, int], list[str]]:
    """CLIP's byte-level symbols, each also as a word end, and the two special tokens."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    symbols = [chr(c) for c in chars]
    tokens = symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}, []


def build_layout(name: str) -> Path:
    """The ONNX layout of model ``name`` (built once; delete the folder to rebuild)."""
    root = OUT / name
    if (root / "scheduler" / "scheduler_config.json").is_file():
        return root
    import torch  # noqa: PLC0415
    from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: PLC0415
    from transformers import CLIPTextConfig, CLIPTextModel  # noqa: PLC0415

    torch.manual_seed(0)
    vocab, merges = _byte_vocab()
    for sub in ("text_encoder", "unet", "vae_decoder", "tokenizer", "scheduler"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tokenizer" / "vocab.json").write_text(json.dumps(vocab))
    (root / "tokenizer" / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 77}))
    text = CLIPTextModel(
        CLIPTextConfig(vocab_size=len(vocab), max_position_embeddings=77, **TEXT[name])
    ).eval()
    width = UNETS[name]["cross_attention_dim"]
    unet = UNet2DConditionModel(sample_size=LATENT, in_channels=4, out_channels=4, **UNETS[name]).eval()
    vae_channels = (128, 256, 512, 512) if name == "sd15" else (32, 64, 64, 64)
    vae = AutoencoderKL(
        block_out_channels=vae_channels,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        layers_per_block=2 if name == "sd15" else 1,
    ).eval()
    (root / "vae_decoder" / "config.json").write_text(
        json.dumps({"scaling_factor": 0.18215, "block_out_channels": list(vae_channels)})
    )

    class Wrap(torch.nn.Module):  # the graph's inputs and its one output, by name
        def __init__(self, inner: torch.nn.Module, call) -> None:
            super().__init__()
            self.inner, self.call = inner, call

        def forward(self, *args):
            return self.call(self.inner, *args)

    spatial = {0: "batch", 2: "height", 3: "width"}
    text_graph = Wrap(text, lambda m, ids: m(input_ids=ids).last_hidden_state)
    unet_graph = Wrap(unet, lambda m, x, t, c: m(x, t, c).sample)
    vae_graph = Wrap(vae, lambda m, z: m.decode(z).sample)
    unet_args = (torch.randn(2, 4, LATENT, LATENT), torch.tensor([500, 500]), torch.randn(2, 77, width))
    exports = [
        ("text_encoder", text_graph, (torch.zeros(1, 77, dtype=torch.int64),), ["input_ids"],
         ["last_hidden_state"], {"input_ids": {0: "batch"}, "last_hidden_state": {0: "batch"}}),
        ("unet", unet_graph, unet_args, ["sample", "timestep", "encoder_hidden_states"], ["out_sample"],
         {"sample": spatial, "timestep": {0: "steps"}, "encoder_hidden_states": {0: "batch"},
          "out_sample": spatial}),
        ("vae_decoder", vae_graph, (torch.randn(1, 4, LATENT, LATENT),), ["latent_sample"], ["sample"],
         {"latent_sample": spatial, "sample": {0: "batch", 2: "H", 3: "W"}}),
    ]  # fmt: skip
    for sub, module, args, inputs, outputs, axes in exports:
        print(f"exporting {name}/{sub} ...", flush=True)
        path = root / sub / "model.onnx"
        module.requires_grad_(False)
        with torch.no_grad():
            torch.onnx.export(
                module, args, str(path), input_names=inputs, output_names=outputs,
                dynamic_axes=axes, opset_version=17, dynamo=False,
            )  # fmt: skip
        _external_if_large(path)
    # written last: it marks the layout complete (an interrupted export is redone next time)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER))
    return root


def _external_if_large(path: Path) -> None:
    """Graphs past protobuf's 2 GB limit keep their weights in one external file."""
    import onnx  # noqa: PLC0415

    extras = [p for p in path.parent.iterdir() if p != path and p.name != "config.json"]
    if path.stat().st_size > 1_500_000_000 or extras:
        model = onnx.load(str(path))
        for extra in extras:
            extra.unlink()
        onnx.save(model, str(path), save_as_external_data=True, location="weights.pb")


# -- timing ----------------------------------------------------------------------------------------


def unet_feeds(root: Path, width: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "sample": rng.standard_normal((2, 4, LATENT, LATENT), dtype=np.float32),
        "timestep": np.array([500, 500], np.int64),
        "encoder_hidden_states": rng.standard_normal((2, 77, width), dtype=np.float32),
    }


def time_step(
    unet_package: Path, onnx_path: Path, feeds: dict, threads: int, rounds: int
) -> tuple[float, float]:
    """Median seconds of one UNet step: Ferry, onnxruntime (interleaved, after WARM_UPS runs)."""
    import onnxruntime as ort  # noqa: PLC0415

    from engine import Session  # noqa: PLC0415

    ferry = Session(unet_package, threads=threads, verify=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    theirs = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    runs = {"ferry": lambda: ferry.run(feeds), "ort": lambda: theirs.run(None, feeds)}
    for run in runs.values():
        for _ in range(WARM_UPS):
            run()
    times: dict[str, list[float]] = defaultdict(list)
    # as bench/engine.py: idle pool threads of a 2-thread session (onnxruntime's, OpenBLAS's,
    # numba's) spin a while after each run and would starve the other runtime's next run
    settle = 0.05 if threads > 1 else 0.0
    for i in range(rounds):
        for key in sorted(runs, reverse=bool(i % 2)):
            time.sleep(settle)
            began = time.perf_counter()
            runs[key]()
            times[key].append(time.perf_counter() - began)
    return statistics.median(times["ferry"]), statistics.median(times["ort"])


def profile(unet_package: Path, onnx_path: Path, feeds: dict) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per operator type of one UNet step, 1 thread: Ferry, onnxruntime."""
    import onnxruntime as ort  # noqa: PLC0415

    from engine import Session  # noqa: PLC0415

    ours: dict[str, float] = defaultdict(float)
    for t in Session(unet_package, threads=1, verify=False).profile(feeds):
        ours[t.op] += t.seconds
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.enable_profiling = 1, True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        session.run(None, feeds)
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    theirs: dict[str, float] = defaultdict(float)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    last_start = runs[-1]["ts"] if runs else 0
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= last_start:
            theirs[e["args"].get("op_name", "?")] += e["dur"] / 1e6
    return dict(ours), dict(theirs)


def child(runtime: str, directory: str, layout: str, threads: int) -> None:
    """One fresh process: two 20-step 256x256 images (the second timed), then VmHWM."""
    if runtime in ("ferry", "ferry-keep"):
        from engine.diffusion.pipeline import DiffusionPipeline, GenerationRequest  # noqa: PLC0415

        request = GenerationRequest(PROMPT, width=256, height=256, steps=20, seed=SEED, scheduler="dpmpp_2m")
        # ferry: one graph loaded at a time (the default); ferry-keep: Sessions kept across images
        pipe = DiffusionPipeline(directory, threads=threads, keep_sessions=runtime == "ferry-keep")

        def generate() -> np.ndarray:
            return pipe.generate(request).image
    else:

        def generate() -> np.ndarray:
            return ort_image(Path(layout), threads)

    generate()
    began = time.perf_counter()
    image = generate()
    seconds = time.perf_counter() - began
    peak = next(
        int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM")
    )
    np.save(Path(directory) / f"bench-{runtime}.npy", image)
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak / 1024}))


def ort_image(layout: Path, threads: int) -> np.ndarray:
    """The same 20 steps as Ferry's pipeline, through onnxruntime (sessions loaded as it goes)."""
    import onnxruntime as ort  # noqa: PLC0415

    from engine.diffusion.pipeline import to_uint8  # noqa: PLC0415
    from engine.diffusion.schedulers import make_scheduler  # noqa: PLC0415
    from engine.diffusion.tokenizer import ClipTokenizer  # noqa: PLC0415

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1

    def session(name: str) -> ort.InferenceSession:
        return ort.InferenceSession(
            str(layout / name / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    tokenizer = ClipTokenizer.from_directory(layout / "tokenizer")
    ids = np.array([tokenizer.encode(""), tokenizer.encode(PROMPT)], np.int64)
    context = session("text_encoder").run(None, {"input_ids": ids})[0]
    scheduler = make_scheduler("dpmpp_2m", SCHEDULER, 20)
    rng = np.random.default_rng(SEED)
    latents = rng.standard_normal((1, 4, LATENT, LATENT), dtype=np.float32)
    unet = session("unet")
    for i, t in enumerate(scheduler.timesteps):
        x = np.concatenate([latents] * 2)
        out = unet.run(
            None, {"sample": x, "timestep": np.full(2, t, np.int64), "encoder_hidden_states": context}
        )[0]
        latents = scheduler.step(out[:1] + np.float32(7.5) * (out[1:] - out[:1]), i, latents)
    del unet
    decoded = session("vae_decoder").run(None, {"latent_sample": latents / np.float32(0.18215)})[0]
    return to_uint8(decoded[0])


def fresh(runtime: str, directory: Path, layout: Path, threads: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", runtime, str(directory), str(layout), str(threads)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def report_image(name: str, directory: Path, layout: Path, pairs: int) -> float:
    """The whole image in fresh processes, Ferry and onnxruntime in ABBA order (so a load
    change hits both alike), then Ferry with kept Sessions; prints the table and returns the
    image ratio: the geometric mean of each adjacent pair's Ferry / onnxruntime."""
    from engine.diffusion.quality import psnr  # noqa: PLC0415

    runs: dict[str, list[dict]] = defaultdict(list)
    for i in range(pairs):
        for runtime in ("ferry", "ort") if i % 2 == 0 else ("ort", "ferry"):
            runs[runtime].append(fresh(runtime, directory, layout, 1))
    kept = fresh("ferry-keep", directory, layout, 1)
    ratios = [f["seconds"] / o["seconds"] for f, o in zip(runs["ferry"], runs["ort"], strict=True)]
    ratio = float(np.exp(np.mean(np.log(ratios))))
    agree = psnr(np.load(directory / "bench-ferry.npy"), np.load(directory / "bench-ort.npy"))
    print(f"\n{name}: 20-step 256x256 image, 1 thread, fresh process (second image timed), {pairs} pairs")
    print("| runtime | s (each run) | peak RSS MB (max) |\n| --- | --- | --- |")
    for label, key in (("Ferry", "ferry"), ("onnxruntime", "ort")):
        seconds = ", ".join(f"{r['seconds']:.2f}" for r in runs[key])
        print(f"| {label} | {seconds} | {max(r['peak_rss_mb'] for r in runs[key]):.0f} |")
    print(f"| Ferry, keep_sessions | {kept['seconds']:.2f} | {kept['peak_rss_mb']:.0f} |")
    print(
        f"image ratio {ratio:.2f} (pairs: {', '.join(f'{r:.2f}' for r in ratios)}); "
        f"Ferry's image vs onnxruntime's: PSNR {agree:.1f} dB"
    )
    return ratio


# -- the run ------------------------------------------------------------------------------------


def convert(layout: Path, weights: str, name: str) -> tuple[Path, object]:
    from converter.diffusion.convert import DiffusionOptions, convert_diffusion  # noqa: PLC0415
    from deploy.package import generate_keypair, verify_and_unpack  # noqa: PLC0415

    keys = generate_keypair()
    archive = OUT / f"{name}-{weights}.ferry"
    options = DiffusionOptions(weights=weights, size=256, min_size=128, max_size=512, accuracy_steps=20)
    began = time.perf_counter()
    report = convert_diffusion(layout, archive, options=options, sign_key=keys.private_key)
    print(
        f"converted {name} {weights} in {time.perf_counter() - began:.0f} s: "
        f"{archive.stat().st_size:,} bytes",
        flush=True,
    )
    directory = OUT / f"{name}-{weights}"
    if directory.exists():
        import shutil  # noqa: PLC0415

        shutil.rmtree(directory)
    verify_and_unpack(archive, directory, keys.public_key)
    return directory, report


def step_only(layout: Path, name: str, rounds: int) -> tuple[Path, dict]:
    """Convert just the UNet (fp32) of a big model, for its step timings."""
    from converter import convert as convert_graph  # noqa: PLC0415
    from converter.diffusion.convert import diffusion_limits  # noqa: PLC0415

    package = OUT / f"{name}-unet.ferry"
    feeds = unet_feeds(layout, UNETS[name]["cross_attention_dim"])
    # converted on every run (about a minute): a package kept from an older converter would time
    # its graph, not this tree's (its fusions)
    began = time.perf_counter()
    limits = diffusion_limits()  # SD-1.5's 3.4 GB UNet: past the plain converter's 2 GiB default
    convert_graph(layout / "unet" / "model.onnx", package, limits=limits, selftest_inputs=feeds)
    print(f"converted {name} UNet in {time.perf_counter() - began:.0f} s", flush=True)
    return package, feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="small", help="comma-separated: small, sd15")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--image-pairs", type=int, default=2, help="fresh-process images per runtime, ABBA order"
    )
    parser.add_argument(
        "--no-int8", action="store_true", help="skip the int8 conversion (slow) and its report"
    )
    args = parser.parse_args()
    os.environ.setdefault("FERRY_KERNEL_CACHE", str(OUT / "kernel-cache"))
    OUT.mkdir(parents=True, exist_ok=True)
    import onnxruntime  # noqa: PLC0415

    print(
        f"onnxruntime {onnxruntime.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, "
        f"{device_blas.unset_note()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    summary: dict[str, float] = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        layout = build_layout(name)
        if name == "sd15":
            try:
                package, feeds = step_only(layout, name, args.rounds)
            except ConversionError as exc:  # e.g. past the diffusion model limit (4 GiB)
                print(f"\n{name}: not converted: {exc}", flush=True)
                continue
        else:
            directory, fp32_report = convert(layout, "fp32", name)
            int8_report = None if args.no_int8 else convert(layout, "int8", name)[1]
            package, feeds = directory / "unet.ferry", unet_feeds(layout, UNETS[name]["cross_attention_dim"])
        onnx_path = layout / "unet" / "model.onnx"
        print(f"\n{name}: UNet step, batch 2, {LATENT}x{LATENT} latents (ms, medians of {args.rounds})")
        print("| threads | Ferry | onnxruntime | ratio |\n| --- | --- | --- | --- |")
        for threads in (1, 2):
            ours, theirs = time_step(package, onnx_path, feeds, threads, args.rounds)
            summary[f"step{threads}"] = ours / theirs
            print(f"| {threads} | {ours * 1e3:.0f} | {theirs * 1e3:.0f} | {ours / theirs:.2f} |", flush=True)
        ours, theirs = profile(package, onnx_path, feeds)
        print(f"\n{name}: where a 1-thread UNet step goes (ms by operator type)")
        print("| Ferry op | ms | onnxruntime op | ms |\n| --- | --- | --- | --- |")
        left = sorted(ours.items(), key=lambda kv: -kv[1])[:10]
        right = sorted(theirs.items(), key=lambda kv: -kv[1])[:10]
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else ("", 0.0)
            b = right[i] if i < len(right) else ("", 0.0)
            print(f"| {a[0]} | {a[1] * 1e3:.1f} | {b[0]} | {b[1] * 1e3:.1f} |")
        print(
            f"| total | {sum(ours.values()) * 1e3:.0f} | total | {sum(theirs.values()) * 1e3:.0f} |",
            flush=True,
        )
        if name == "sd15":
            continue
        summary["image"] = report_image(name, directory, layout, args.image_pairs)
        if int8_report is None:
            continue
        p = int8_report.pipeline
        summary["psnr"] = p["psnr_db"]
        print(
            f"\n{name}: int8 package {int8_report.converted_size:,} bytes of graphs = "
            f"{int8_report.size_ratio:.1%} of fp32 ({fp32_report.converted_size:,}); image vs fp32 "
            f"PSNR {p['psnr_db']:.2f} dB, SSIM {p['ssim']:.4f} ({p['steps']} steps, seed {p['seed']})"
        )
        for graph, entry in int8_report.graphs.items():
            out = next(iter(entry["accuracy"]["outputs"].values()))
            print(f"  {graph}: {entry['size_ratio']:.1%} of fp32, cosine {out['cosine_similarity']:.6f}")
    r1, r2, r3, p = (summary.get(k, float("nan")) for k in ("step1", "step2", "image", "psnr"))
    print(
        f"\ndiffusion: unet step ratio {r1:.2f} (1 thread), {r2:.2f} (2 threads); "
        f"image ratio {r3:.2f}; int8 psnr {p:.1f} dB"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
