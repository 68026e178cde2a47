"""Exceptions the engine raises; each message names the node, input or file at fault."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class PackageError(EngineError):
    """The package is not a readable Ferry package (missing member, bad JSON, wrong format)."""


class PackageIntegrityError(PackageError):
    """A file in the package does not match the sha256 or size its manifest lists."""


class UnsupportedOperatorError(EngineError):
    """The graph uses an operator (or attribute value) this engine cannot run."""


class InputError(EngineError):
    """A feed passed to Session.run has the wrong name, shape or dtype."""


class NodeExecutionError(EngineError):
    """A kernel failed on a node; the message names the node and its input shapes."""
