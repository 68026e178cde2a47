"""Console forms: they turn HTML fields into the arguments of the same services the REST API calls."""

from __future__ import annotations

from typing import Any

from django import forms

from converter.options import PRECISIONS

GATE_FIELDS = [
    ("max_activation_failure_rate", "Max activation failure rate", 0.05),
    ("max_error_rate", "Max inference error rate", 0.02),
    ("max_latency_p95_ratio", "Max p95 latency ratio (vs previous version)", 1.5),
    ("max_restarts_per_device", "Max restarts per device", 1.0),
    ("max_drift", "Max output drift (0..1, blank: off)", None),
]


class ReleaseForm(forms.Form):
    name = forms.CharField(max_length=200)
    version = forms.ChoiceField(help_text="A converted version.")
    filter = forms.CharField(
        required=False,
        widget=forms.TextInput(
            attrs={"size": 70, "placeholder": "hardware == rpi4 and region in [eu-west, eu-north]"}
        ),
        help_text="Filter expression (see the README); blank: no filter.",
    )
    group_ids = forms.MultipleChoiceField(required=False, label="Device groups")
    device_ids = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="One device id per line.",
    )
    phases = forms.CharField(
        initial="1, 10, 50, 100", help_text="Percentages of the matching devices, comma-separated, growing."
    )
    min_soak_seconds = forms.IntegerField(min_value=0, initial=600)
    min_reporting_devices = forms.IntegerField(min_value=0, initial=1)
    manual_approval = forms.BooleanField(
        required=False, help_text="Every phase waits for a person's Advance."
    )
    on_failure = forms.ChoiceField(choices=[("pause", "pause"), ("abort", "abort and roll back")])
    download_only = forms.BooleanField(required=False, help_text="Pre-stage now; Activate later.")
    window_cron = forms.CharField(
        required=False, label="Window cron", help_text="e.g. 0 2 * * * (blank: any time)"
    )
    window_duration_seconds = forms.IntegerField(required=False, min_value=60, label="Window duration (s)")
    window_timezone = forms.CharField(required=False, initial="UTC", label="Window time zone")
    priority = forms.IntegerField(initial=0)
    allow_empty = forms.BooleanField(
        required=False,
        label="Allow empty",
        help_text="Create it even if the target matches 0 devices now (devices that enrol later).",
    )
    new_pipeline = forms.BooleanField(
        required=False,
        label="Ships a new pipeline",
        help_text="The version comes with what feeds it: skip the check that it fits what devices run now.",
    )
    start = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args, versions=(), groups=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = [(str(v.pk), str(v)) for v in versions]
        self.fields["group_ids"].choices = [(str(g.pk), g.name) for g in groups]
        for name, label, initial in GATE_FIELDS:
            self.fields[name] = forms.FloatField(required=False, min_value=0, label=label, initial=initial)

    def clean_phases(self) -> list[float]:
        try:
            return [float(p) for p in self.cleaned_data["phases"].replace("%", "").split(",") if p.strip()]
        except ValueError:
            raise forms.ValidationError("Write the phases as numbers, e.g. 1, 10, 50, 100.") from None

    def service_arguments(self) -> dict:
        data = self.cleaned_data
        target = target_from(data)
        phases = [
            {
                "percentage": p,
                "min_soak_seconds": data["min_soak_seconds"],
                "min_reporting_devices": data["min_reporting_devices"],
                "manual_approval": data["manual_approval"],
            }
            for p in data["phases"]
        ]
        gate = {name: data[name] for name, _, _ in GATE_FIELDS}
        gate["on_failure"] = data["on_failure"]
        window = window_from(data)
        return {
            "name": data["name"],
            "target": target,
            "phases": phases,
            "gate": gate,
            "download_only": data["download_only"],
            "window": window,
            "priority": data["priority"],
            "start": data["start"],
            "allow_empty": data["allow_empty"],
            "new_pipeline": data["new_pipeline"],
        }


class TargetPreviewForm(forms.Form):
    """The target fields of the New release form, as its preview sends them while one types."""

    version = forms.CharField(required=False, max_length=64)
    filter = forms.CharField(required=False, max_length=4000, strip=False)
    group_ids = forms.MultipleChoiceField(required=False)
    device_ids = forms.CharField(required=False, max_length=400_000)

    def __init__(self, *args, versions=(), groups=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.versions = {str(v.pk): v for v in versions}
        self.fields["group_ids"].choices = [(str(g.pk), g.name) for g in groups]

    def clean_version(self):
        version_id = self.cleaned_data["version"]
        if version_id and version_id not in self.versions:
            raise forms.ValidationError("No converted version by that id.")
        return self.versions.get(version_id)

    def target(self) -> dict:
        return target_from(self.cleaned_data)


def target_from(data: dict[str, Any]) -> dict:
    """The release target the form's filter, group and device fields describe."""
    target: dict = {}
    if data["filter"].strip():
        target["filter"] = data["filter"]
    if data["group_ids"]:
        target["group_ids"] = list(data["group_ids"])
    device_ids = [line.strip() for line in data["device_ids"].splitlines() if line.strip()]
    if device_ids:
        target["device_ids"] = device_ids
    return target


class GroupForm(forms.Form):
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=[("static", "static"), ("dynamic", "dynamic (saved filter)")])
    filter = forms.CharField(required=False, widget=forms.TextInput(attrs={"size": 60}))
    device_ids = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))
    window_cron = forms.CharField(required=False, label="Window cron")
    window_duration_seconds = forms.IntegerField(required=False, min_value=60, label="Window duration (s)")
    window_timezone = forms.CharField(required=False, initial="UTC", label="Window time zone")


def window_from(data: dict[str, Any]) -> dict[str, Any] | None:
    """The maintenance window a form's window_* fields describe (None when no cron is given)."""
    if not data["window_cron"].strip():
        return None
    return {
        "cron": data["window_cron"].strip(),
        "duration_seconds": data["window_duration_seconds"] or 0,
        "timezone": data["window_timezone"].strip() or "UTC",
    }


class ModelForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


class VersionUploadForm(forms.Form):
    """A new version: the ONNX file and the converter's main options (the REST API has them all)."""

    label = forms.CharField(max_length=100, help_text="e.g. v2")
    file = forms.FileField(label="ONNX file")
    quantize = forms.ChoiceField(
        required=False,
        choices=[("", "float32 (no quantization)"), *((p, p) for p in PRECISIONS)],
        help_text="Reduced precision: the conversion report gives its accuracy against float32.",
    )
    device_class = forms.RegexField(
        regex=r"^[A-Za-z0-9_.-]*$",
        error_messages={"invalid": "Letters, digits, '.', '_' and '-' only, e.g. jetson."},
        required=False,
        max_length=64,
        label="Device class",
        help_text="Sign it for one hardware class only (e.g. jetson); blank: any device.",
    )

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.cleaned_data["quantize"]:
            options["quantize"] = self.cleaned_data["quantize"]
        if self.cleaned_data["device_class"].strip():
            options["device_class"] = self.cleaned_data["device_class"].strip()
        return options
