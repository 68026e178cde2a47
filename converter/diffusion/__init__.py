"""Diffusion packages: diffusers' / optimum's ONNX layout (three graphs, tokenizer, scheduler) in,
one Ferry diffusion package (engine/diffusion/package.py) out.  ``layout`` reads and checks the
source, ``convert`` converts each graph through the ordinary converter, measures the pipeline and
writes (and optionally signs) the package, ``cli`` is ``ferry convert-diffusion``."""

from converter.diffusion.convert import DiffusionConversionReport, convert_diffusion
from converter.diffusion.layout import DiffusionLayoutError, Layout, read_layout

__all__ = ["DiffusionConversionReport", "DiffusionLayoutError", "Layout", "convert_diffusion", "read_layout"]
