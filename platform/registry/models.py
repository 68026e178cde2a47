import uuid

from accounts.models import Organisation
from django.db import models


class Artifact(models.Model):
    """Bytes in storage (an uploaded ONNX file or a signed package), addressed by their sha256."""

    class Kind(models.TextChoices):
        ONNX = "onnx", "ONNX model"
        ARCHIVE = "archive", "Checkpoint archive (tar or zip)"
        PACKAGE = "package", "Ferry package"

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    file = models.FileField(max_length=300)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organisation", "kind", "sha256"], name="one_artifact_per_digest")
        ]


class Model(models.Model):
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organisation", "name"], name="unique_model_name")]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One uploaded revision of a model; immutable once a release has used it."""

    class Kind(models.TextChoices):
        """What was uploaded: one ONNX file, or an archive of a language-model checkpoint or of a
        diffusers ONNX layout; every kind converts into a signed package released the same way."""

        ONNX = "onnx", "ONNX model"
        LLM = "llm", "Language model (Hugging Face Llama-family checkpoint)"
        DIFFUSION = "diffusion", "Text-to-image diffusion (diffusers ONNX layout)"
        LLM_ADAPTER = "llm_adapter", "LoRA adapter of an LLM version (PEFT adapter directory)"

    class Status(models.TextChoices):
        CONVERTING = "converting", "Converting"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    label = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ONNX)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CONVERTING)
    source = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="+")
    package = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="+", null=True, blank=True)
    options = models.JSONField(default=dict, blank=True)
    report = models.JSONField(default=dict, blank=True)
    released = models.BooleanField(default=False)
    # llm_adapter: the LLM version it was converted against (devices get only the adapter, which
    # they install beside that base; releases.compatibility refuses devices without it)
    base = models.ForeignKey("self", on_delete=models.PROTECT, related_name="adapters", null=True, blank=True)
    # the base weights the version runs on (engine.llm.lora.base_digest): an llm version's own,
    # which its adapters bind to; an llm_adapter's base's. "" for other kinds (and for llm versions
    # converted before this field: registry.services.llm_digest_of fills it in on first use)
    llm_digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "label"], name="unique_version_label")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.model.name}:{self.label}"


class ConversionJob(models.Model):
    """The conversion of one version; the row (not Celery's result backend) is the job's truth."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    version = models.OneToOneField(ModelVersion, on_delete=models.CASCADE, related_name="job")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)
    log = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Who runs it ("<worker node>/<pid>") while running; updated_at is its heartbeat.
    claimed_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
