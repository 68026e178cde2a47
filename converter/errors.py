"""Exceptions convert() raises; every message says what is wrong with the model in one line."""

from __future__ import annotations


def printable(text: str) -> str:
    """A name from the model as it can appear in a one-line message: quoted and escaped if it
    holds control characters (a corrupted or hostile model), else as is."""
    return text if text.isprintable() else repr(text)


class ConversionError(Exception):
    """Base class: the model could not be converted (nothing was written to the destination)."""


class InvalidModelError(ConversionError):
    """The source is not a valid ONNX model: missing, unparsable, failing the checker or shape inference."""


class UnsupportedOperatorsError(ConversionError):
    """The model uses operators (or custom domains) the engine cannot run; lists all of them at once.

    ``operators`` maps each problem to the names of the nodes that have it: an operator name,
    ``domain::Op (custom domain)``, or an attribute value the engine lacks ("Cast to ONNX data
    type 16 is not implemented").
    """

    def __init__(self, operators: dict[str, list[str]]) -> None:
        self.operators = operators
        parts = [
            f"{printable(op)} (nodes: {', '.join(printable(n) for n in nodes)})"
            for op, nodes in sorted(operators.items())
        ]
        super().__init__(f"{len(operators)} unsupported operator(s): " + "; ".join(parts))


class SelfTestError(ConversionError):
    """The engine could not run the converted model on the self-test input."""
