"""Agent errors; each message is what the device reports to the control plane."""


class AgentError(Exception):
    """Base class of every error the agent raises on purpose."""


class EnrolmentError(AgentError):
    """Enrolment was refused, or the agent has neither a credential nor a token."""


class DownloadError(AgentError):
    """The package could not be fetched whole (too big, wrong digest, transport failure)."""


class ActivationError(AgentError):
    """A verified package failed to load or to pass its self-test."""


class DownloadStalled(DownloadError):
    """The link is too slow or the deadline passed: keep the partial file and resume later."""


class DiskFullError(DownloadError):
    """Not enough free space for the package (checked first), or the disk filled up during the download."""


class IncompatibleModel(ActivationError):
    """The new model does not take what the device's pipeline feeds it; the message starts with
    the machine-readable reason ``incompatible:`` and names the mismatch."""

    reason = "incompatible"
