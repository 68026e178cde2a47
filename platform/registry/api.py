"""REST doors onto registry services: input/output serializers, no logic."""

from __future__ import annotations

from accounts.api import OrganisationApi
from accounts.models import Membership
from accounts.permissions import OperatorWrites, ReadOnly, RolePermission
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from ferry_cloud.api_conditions import IF_MATCH, created, require_match, tagged
from ferry_cloud.api_lists import ListQuery, list_query, page_of, paginated
from ferry_cloud.api_shapes import VersionRefOutput, version_ref
from ferry_cloud.errors import NotFound
from ferry_cloud.idempotency import HEADER as IDEMPOTENCY_KEY
from ferry_cloud.idempotency import idempotent
from rest_framework import serializers, status
from rest_framework.response import Response

from converter.options import ACTIVATION_METHODS, BLOCK_SIZES, PRECISIONS
from registry import checkpoints, selectors, services
from registry.errors import InvalidUpload
from registry.models import ConversionJob, Model, ModelVersion
from registry.upload_limits import SizeLimitedMultiPartParser


class JobOutput(serializers.ModelSerializer):
    class Meta:
        model = ConversionJob
        fields = ["status", "progress", "log", "error", "attempts", "updated_at"]


class VersionOutput(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name")
    job = JobOutput()
    package_sha256 = serializers.CharField(
        source="package.sha256", default=None, allow_null=True, help_text="null until converted."
    )
    package_size = serializers.IntegerField(
        source="package.size", default=None, allow_null=True, help_text="null until converted."
    )
    base = serializers.UUIDField(
        source="base_id",
        allow_null=True,
        read_only=True,
        help_text="llm_adapter: the LLM version it was converted against (null for other kinds).",
    )

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "model",
            "label",
            "kind",
            "status",
            "options",
            "report",
            "released",
            "package_sha256",
            "package_size",
            "base",
            "llm_digest",
            "job",
            "created_at",
        ]


class ModelOutput(serializers.ModelSerializer):
    versions = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "name", "description", "created_at", "versions"]

    def get_versions(self, obj: Model) -> list[dict]:
        return [{"id": str(v.id), "label": v.label, "status": v.status} for v in obj.versions.all()]


class ModelInput(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
    description = serializers.CharField(required=False, allow_blank=True, default="")


class ModelQuery(ListQuery):
    ORDERING = ("name", "-name", "-created_at", "created_at")


class ModelListCreateApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(
        parameters=[ModelQuery], responses=page_of(ModelOutput, "ModelPage"), operation_id="v1_models_list"
    )
    def get(self, request):
        query = list_query(ModelQuery, request)
        models = selectors.model_list(organisation=self.organisation)
        return paginated(request, models, query, lambda rows: ModelOutput(rows, many=True).data)

    @extend_schema(request=ModelInput, responses={201: ModelOutput}, parameters=[IDEMPOTENCY_KEY])
    @idempotent
    def post(self, request):
        data = ModelInput(data=request.data)
        data.is_valid(raise_exception=True)
        model = services.model_create(organisation=self.organisation, **data.validated_data)
        return created(request, ModelOutput(model).data, "model", model_id=model.pk)


class ModelDetailApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(responses=ModelOutput)
    def get(self, request, model_id: int):
        return tagged(
            Response(ModelOutput(selectors.model_get(organisation=self.organisation, model_id=model_id)).data)
        )


class VersionInput(serializers.Serializer):
    file = serializers.FileField(
        help_text="The ONNX model; for kind llm or diffusion, a tar (optionally gzip/bz2/xz) or zip "
        "of the checkpoint directory."
    )
    label = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
    kind = serializers.ChoiceField(
        choices=ModelVersion.Kind.choices,
        default=ModelVersion.Kind.ONNX,
        help_text="onnx: one ONNX file. llm: a Hugging Face Llama-family checkpoint (config.json, "
        "*.safetensors, tokenizer.json). diffusion: diffusers' ONNX layout (text_encoder/, unet/, "
        "vae_decoder/, tokenizer/, scheduler/). llm_adapter: a PEFT LoRA adapter directory "
        "(adapter_config.json, adapter_model.safetensors) trained on the llm version named by base.",
    )
    base = serializers.UUIDField(
        required=False,
        help_text="llm_adapter: the id of the LLM version (of this organisation) the adapter was "
        "trained on; devices get only the adapter and install it beside that base.",
    )
    weights = serializers.ChoiceField(
        choices=sorted({w for ws in checkpoints.WEIGHTS.values() for w in ws}),
        required=False,
        help_text="llm: fp16, int8 or int4 (default int4, block_size 32 or 64); diffusion: fp32 or int8 "
        "(default fp32). Not for onnx (use quantize).",
    )
    image_size = serializers.IntegerField(
        required=False, min_value=32, max_value=2048, help_text="diffusion: default image side (default 512)."
    )
    steps = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        help_text="diffusion: default denoising steps, also those of the accuracy image (default 20).",
    )
    quantize = serializers.ChoiceField(choices=list(PRECISIONS), required=False)
    block_size = serializers.ChoiceField(
        choices=list(BLOCK_SIZES), required=False, help_text="int4 block size."
    )
    calibration = serializers.FileField(
        required=False,
        help_text="An .npz (numpy.savez) with one array per model input: the inputs of the accuracy report.",
    )
    activations = serializers.ChoiceField(
        choices=list(ACTIVATION_METHODS),
        required=False,
        help_text="Static int8 activations, ranges from the calibration file by this method.",
    )
    keep_float = serializers.RegexField(
        r"^[A-Za-z0-9_.:/, -]{1,2000}$",
        required=False,
        help_text="Mixed precision: 'first_last', or comma-separated node names to keep float32.",
    )
    accuracy_budget = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        help_text="Minimum cosine similarity of each output vs float32 (worst layers kept float32).",
    )


ONNX_OPTIONS = ("quantize", "block_size", "keep_float", "accuracy_budget", "activations")


class VersionQuery(ListQuery):
    ORDERING = ("-created_at", "created_at")

    model = serializers.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, help_text="Versions of this model."
    )
    status = serializers.ChoiceField(choices=ModelVersion.Status.choices, required=False)
    kind = serializers.ChoiceField(choices=ModelVersion.Kind.choices, required=False)


class ModelVersionQuery(VersionQuery):
    model = None  # the path names the model


class VersionListApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(
        parameters=[VersionQuery],
        responses=page_of(VersionOutput, "VersionPage"),
        operation_id="v1_versions_list",
    )
    def get(self, request):
        """Every version of every model, newest first."""
        query = list_query(VersionQuery, request)
        versions = selectors.version_list(
            organisation=self.organisation,
            model_id=query.get("model"),
            status=query.get("status"),
            kind=query.get("kind"),
        )
        return paginated(request, versions, query, lambda rows: VersionOutput(rows, many=True).data)


class VersionCreateApi(OrganisationApi):
    permission_classes = [OperatorWrites]
    parser_classes = [SizeLimitedMultiPartParser]

    @extend_schema(
        parameters=[ModelVersionQuery],
        responses=page_of(VersionOutput, "VersionPage"),
        operation_id="v1_model_versions_list",
    )
    def get(self, request, model_id: int):
        """The model's versions, newest first."""
        model = selectors.model_get(organisation=self.organisation, model_id=model_id)
        query = list_query(ModelVersionQuery, request)
        versions = selectors.version_list(
            organisation=self.organisation,
            model_id=model.pk,
            status=query.get("status"),
            kind=query.get("kind"),
        )
        return paginated(request, versions, query, lambda rows: VersionOutput(rows, many=True).data)

    @extend_schema(
        request={"multipart/form-data": VersionInput},
        responses={201: VersionOutput},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent
    def post(self, request, model_id: int):
        model = selectors.model_get(organisation=self.organisation, model_id=model_id)
        data = VersionInput(data=request.data)
        data.is_valid(raise_exception=True)
        upload, kind = data.validated_data["file"], data.validated_data["kind"]
        options = {k: v for k, v in data.validated_data.items() if k not in ("file", "label", "kind", "base")}
        base = _base_version(self.organisation, data.validated_data.get("base"))
        samples = options.pop("calibration", None)
        if kind == ModelVersion.Kind.ONNX:
            foreign = sorted(set(options) - set(ONNX_OPTIONS))
            if foreign:
                message = f"{foreign[0]} is for kind llm or diffusion, not onnx."
                raise InvalidUpload(message, fields={foreign[0]: [message]})
            if samples is not None:
                options["calibration"] = services.calibration_store(
                    organisation=model.organisation, stream=samples, size=samples.size
                )
        elif samples is not None:
            raise InvalidUpload("calibration is for kind onnx.", fields={"calibration": ["only for onnx"]})
        version = services.version_upload(
            model=model,
            label=data.validated_data["label"],
            stream=upload,
            size=upload.size,
            options=options,
            kind=kind,
            base=base,
        )
        version = selectors.version_get(organisation=self.organisation, version_id=version.pk)
        return created(request, VersionOutput(version).data, "version", version_id=version.pk)


def _base_version(organisation, version_id) -> ModelVersion | None:
    """The version a ``base`` field names; one of another organisation is a 400 on the field."""
    if version_id is None:
        return None
    try:
        return selectors.version_get(organisation=organisation, version_id=version_id)
    except NotFound as exc:
        raise InvalidUpload(str(exc), fields={"base": [str(exc)]}) from None


class VersionDetailApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(responses=VersionOutput)
    def get(self, request, version_id):
        version = selectors.version_get(organisation=self.organisation, version_id=version_id)
        return tagged(Response(VersionOutput(version).data))

    @extend_schema(request=None, responses={204: None}, parameters=[IF_MATCH])
    def delete(self, request, version_id):
        """Delete a version never released and used by nothing (409 otherwise)."""
        version = selectors.version_get(organisation=self.organisation, version_id=version_id)
        require_match(request, VersionOutput(version).data)
        services.version_delete(version=version)
        return Response(status=status.HTTP_204_NO_CONTENT)


# ---- conversion jobs and the signed package ----------------------------------------------------


class ConversionJobOutput(serializers.ModelSerializer):
    version = serializers.UUIDField(source="version_id", read_only=True, help_text="The version it converts.")
    version_info = serializers.SerializerMethodField()
    model = serializers.IntegerField(source="version.model_id", read_only=True)
    log = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        help_text='Log lines, oldest first: {"at": ISO time, "message": text}.',
    )
    error = serializers.CharField(help_text="Why it failed; empty unless status is failed.")

    class Meta:
        model = ConversionJob
        fields = [
            "id",
            "version",
            "version_info",
            "model",
            "status",
            "progress",
            "log",
            "error",
            "attempts",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field(VersionRefOutput)
    def get_version_info(self, obj: ConversionJob) -> dict:
        return version_ref(obj.version)


class ConversionJobQuery(ListQuery):
    ORDERING = ("-created_at", "created_at", "-updated_at", "updated_at")
    LIST_PARAMETERS = frozenset({"status"})

    status = serializers.MultipleChoiceField(
        choices=ConversionJob.Status.choices, required=False, help_text="Any of these (repeat it)."
    )
    model = serializers.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, help_text="Jobs of this model's versions."
    )
    version = serializers.UUIDField(required=False, help_text="The job of this version.")


class ConversionJobListApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(
        parameters=[ConversionJobQuery],
        responses=page_of(ConversionJobOutput, "ConversionJobPage"),
        operation_id="v1_conversion_jobs_list",
    )
    def get(self, request):
        """The organisation's conversion jobs, newest first: status, progress, log and error."""
        query = list_query(ConversionJobQuery, request)
        jobs = selectors.conversion_job_list(
            organisation=self.organisation,
            statuses=sorted(query.get("status", ())),
            model_id=query.get("model"),
            version_id=query.get("version"),
        )
        return paginated(request, jobs, query, lambda rows: ConversionJobOutput(rows, many=True).data)


class ConversionJobDetailApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(responses=ConversionJobOutput)
    def get(self, request, job_id: int):
        job = selectors.conversion_job_get(organisation=self.organisation, job_id=job_id)
        return tagged(Response(ConversionJobOutput(job).data))


class AdminReads(RolePermission):
    """Reads and writes need an admin (a signed package is the model itself)."""

    read_role = Membership.Role.ADMIN
    write_role = Membership.Role.ADMIN


class PackageNotReady(NotFound):
    code = "package_not_ready"


class VersionPackageApi(OrganisationApi):
    permission_classes = [AdminReads]

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
        operation_id="v1_versions_package_retrieve",
    )
    def get(self, request, version_id):
        """The version's signed package (.ferry), streamed; 404 package_not_ready until converted."""
        version = selectors.version_get(organisation=self.organisation, version_id=version_id)
        if version.package is None:
            raise PackageNotReady(
                f"Version {version} is {version.status}: it has a package once its conversion succeeds."
            )
        name = f"{version.model.name}-{version.label}.ferry"
        response = FileResponse(
            version.package.file.open("rb"),
            as_attachment=True,
            filename=name,
            content_type="application/octet-stream",
        )
        response["Content-Length"] = str(version.package.size)
        response["ETag"] = f'"{version.package.sha256}"'  # the bytes' sha256: what devices verify too
        return response
