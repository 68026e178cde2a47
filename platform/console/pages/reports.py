"""A version's conversion report shaped for its console page, by the kind of version: an ONNX
model's graph, precision sizes and per-output accuracy; a language model's next-token figures
against fp32; a LoRA adapter's rank and base binding; a diffusion pipeline's three graphs and
its image against fp32 (PSNR, SSIM). Each shaper reads a stored report dict and tolerates the
fields an older converter did not write (shown as "–")."""

from __future__ import annotations

from typing import Any

from registry.models import ModelVersion

DIFFUSION_GRAPHS = ("text_encoder", "unet", "vae_decoder")


def report_context(version: ModelVersion) -> dict[str, Any]:
    """The template names the version page's report section uses, for this version's kind."""
    report = version.report or {}
    kind = version.kind
    if kind == ModelVersion.Kind.LLM:
        return {"report_template": "console/pages/report_llm.html", "llm": llm_figures(report)}
    if kind == ModelVersion.Kind.LLM_ADAPTER:
        return {"report_template": "console/pages/report_adapter.html", "adapter": adapter_figures(report)}
    if kind == ModelVersion.Kind.DIFFUSION:
        return {
            "report_template": "console/pages/report_diffusion.html",
            "diffusion": diffusion_figures(report),
        }
    return {
        "report_template": "console/pages/report_onnx.html",
        "sizes": sizes(version),
        "accuracy": accuracy_rows(report),
        "passes": passes_that_changed(report),
    }


def _ratio(part: Any, whole: Any) -> float | None:
    if isinstance(part, int | float) and isinstance(whole, int | float) and whole > 0:
        return part / whole
    return None


def llm_figures(report: dict[str, Any]) -> dict[str, Any]:
    """Precision, size against the checkpoint and the next-token accuracy against fp32."""
    accuracy = report.get("accuracy") or {}
    return {
        "precision": report.get("precision") or "–",
        "block": report.get("block") if report.get("precision") == "int4" else None,
        "model_type": report.get("model_type") or "–",
        "parameters": report.get("parameters"),
        "weights_bytes": report.get("weights_bytes"),
        "checkpoint_bytes": report.get("checkpoint_bytes"),
        "weights_ratio": _ratio(report.get("weights_bytes"), report.get("checkpoint_bytes")),
        "tokens": accuracy.get("tokens"),
        "top1": accuracy.get("top1_agreement"),
        "mean_kl": accuracy.get("mean_kl"),
        "perplexity": accuracy.get("perplexity"),
        "fp32_perplexity": accuracy.get("fp32_perplexity"),
        "selftest_tokens": len((report.get("selftest") or {}).get("tokens") or []),
    }


def adapter_figures(report: dict[str, Any]) -> dict[str, Any]:
    """What the adapter changes and which base weights it is bound to."""
    return {
        "name": report.get("name") or "–",
        "rank": report.get("rank"),
        "scaling": report.get("scaling"),
        "targets": report.get("targets") or [],
        "adapter_bytes": report.get("adapter_bytes"),
        "base_digest": report.get("base_digest") or "",
    }


def diffusion_figures(report: dict[str, Any]) -> dict[str, Any]:
    """One row per graph (nodes, size against fp32, worst output's cosine and error) and the
    whole pipeline's image against fp32's from the same seed and prompt."""
    graphs = report.get("graphs") or {}
    rows = []
    for name in [*DIFFUSION_GRAPHS, *sorted(set(graphs) - set(DIFFUSION_GRAPHS))]:
        graph = graphs.get(name)
        if not isinstance(graph, dict):
            continue
        outputs = [
            f for f in ((graph.get("accuracy") or {}).get("outputs") or {}).values() if isinstance(f, dict)
        ]
        cosines = [f["cosine_similarity"] for f in outputs if f.get("cosine_similarity") is not None]
        errors = [f["max_abs_error"] for f in outputs if f.get("max_abs_error") is not None]
        rows.append(
            {
                "name": name,
                "nodes_before": graph.get("nodes_before"),
                "nodes_after": graph.get("nodes_after"),
                "size": graph.get("size"),
                "fp32_size": graph.get("fp32_size"),
                "ratio": graph.get("size_ratio"),
                "cosine": min(cosines) if cosines else None,
                "max_abs_error": max(errors) if errors else None,
            }
        )
    return {
        "precision": report.get("precision") or "–",
        "graphs": rows,
        "pipeline": report.get("pipeline") or None,
        "fp32_size": report.get("fp32_size"),
        "converted_size": report.get("converted_size"),
        "ratio": report.get("size_ratio"),
    }


def precision(report: dict[str, Any]) -> str:
    return str(report.get("quantize") or "float32")


def sizes(version: ModelVersion) -> list[dict[str, Any]]:
    """[{"precision", "bytes"}]: the float32 graph, the converted one if reduced, the package."""
    report = version.report or {}
    rows = []
    if report.get("fp32_package_size"):
        rows.append({"precision": "float32", "bytes": report["fp32_package_size"]})
    if report.get("quantize") and report.get("converted_size"):
        rows.append(
            {
                "precision": precision(report),
                "bytes": report["converted_size"],
                "ratio": report.get("size_ratio"),
            }
        )
    if version.package_id:
        rows.append({"precision": f"package ({precision(report)}, signed)", "bytes": version.package.size})
    return rows


def passes_that_changed(report: dict[str, Any]) -> list[str]:
    """The optimisation passes that removed nodes, as "name: nodes before → after"."""
    lines, nodes = [], report.get("nodes_before")
    for step in report.get("passes") or []:
        if isinstance(step, dict) and step.get("nodes") != nodes:
            lines.append(f"{step.get('pass')}: {nodes} → {step.get('nodes')} nodes")
            nodes = step.get("nodes")
    return lines


def accuracy_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (precision, output): the metric each precision is judged by, against float32."""
    rows = []
    if report.get("fp16_cosine_similarity") is not None:
        rows.append(
            {
                "precision": "fp16",
                "output": "all outputs",
                "metric": "cosine similarity",
                "cosine": report["fp16_cosine_similarity"],
                "max_abs_error": report.get("fp16_max_abs_error"),
                "top1": None,
            }
        )
    accuracy = report.get("accuracy") or {}
    for name, figures in sorted((accuracy.get("outputs") or {}).items()):
        if not isinstance(figures, dict):
            continue
        rows.append(
            {
                "precision": precision(report),
                "output": name,
                "metric": "top-1 agreement"
                if figures.get("top1_agreement") is not None
                else "cosine similarity",
                "cosine": figures.get("cosine_similarity"),
                "max_abs_error": figures.get("max_abs_error"),
                "top1": figures.get("top1_agreement"),
                "samples": f"{accuracy.get('samples')} {accuracy.get('inputs')}",
            }
        )
    return rows
