"""The automation flow as a script would run it: ferryctl processes against a live server."""

from __future__ import annotations

import httpx
import pytest
from fleet.services import device_enrol, enrolment_token_create

from tests.platform.conftest import onnx_bytes


@pytest.fixture
def lab_device(org):
    return device_enrol(
        token=enrolment_token_create(organisation=org).token,
        name="cam-1",
        attributes={},
        labels={"site": "lab"},
    ).device


@pytest.mark.slow
def test_upload_wait_release_pause_rollback(
    ferryctl, conversion_worker, lab_device, tmp_path, live_server, admin
):
    created = ferryctl("models", "create", "detector", "--json")
    assert created.code == 0, created.stderr
    model = created.json()
    assert model["name"] == "detector"

    onnx = tmp_path / "detector.onnx"
    onnx.write_bytes(onnx_bytes())
    uploaded = ferryctl("versions", "upload", "detector", str(onnx), "--label", "v1", "--wait", "--json")
    assert uploaded.code == 0, uploaded.stderr
    version = uploaded.json()
    assert version["status"] == "ready" and version["label"] == "v1"
    assert version["package_sha256"] and version["package_size"] > 0

    listed = ferryctl("versions", "list", "--model", "detector", "--json").json()
    assert [v["id"] for v in listed] == [version["id"]]
    shown = ferryctl("versions", "show", version["id"])  # a table for people
    assert shown.code == 0 and "ready" in shown.stdout and version["id"] in shown.stdout

    released = ferryctl(
        "releases", "create", "lab-rollout", "--version", version["id"],
        "--filter", "labels.site == lab", "--phases", "100", "--soak", "600", "--start", "--json",
    )  # fmt: skip
    assert released.code == 0, released.stderr
    release = released.json()
    assert release["state"] == "active" and release["version"] == version["id"]
    assert release["target"]["filter"] == "labels.site == lab"
    assert [(p["percentage"], p["min_soak_seconds"]) for p in release["phases"]] == [(100.0, 600)]

    live = ferryctl("releases", "watch", release["id"], "--json", "--interval", "0.2", "--timeout", "1")
    assert live.code == 3, live.stderr  # still active when the watch gave up
    assert "still active" in live.stderr
    assert [(d["device_id"], d["state"]) for d in live.json()["devices"]] == [(str(lab_device.pk), "pending")]

    table = ferryctl("releases", "show", release["id"])
    assert table.code == 0 and "lab-rollout" in table.stdout and "active" in table.stdout

    paused = ferryctl("releases", "pause", release["id"], "--reason", "checking the lab", "--json")
    assert paused.code == 0, paused.stderr
    assert paused.json()["state"] == "paused"
    stale = ferryctl("releases", "resume", release["id"], "--expected-revision", str(release["revision"]))
    assert stale.code == 2 and "error:" in stale.stderr and "409" in stale.stderr

    rolled = ferryctl("releases", "rollback", release["id"], "--reason", "bad numbers", "--json")
    assert rolled.code == 0, rolled.stderr
    assert rolled.json()["state"] == "rolled_back"
    history = ferryctl("releases", "show", release["id"], "--json").json()
    assert [e["action"] for e in history["events"]][-2:] == ["pause", "rollback"]

    watched = ferryctl("releases", "watch", release["id"], "--json", "--interval", "0.2")
    assert watched.code == 1  # it ended, but not completed
    assert watched.json()["release"]["state"] == "rolled_back"

    states = ferryctl("releases", "list", "--state", "rolled_back", "--json").json()
    assert [r["id"] for r in states] == [release["id"]]

    group = httpx.post(
        f"{live_server.url}/api/v1/device-groups/",
        json={"name": "lab-cams", "device_ids": [str(lab_device.pk)]},
        headers={"Authorization": f"Token {admin[1]}"},
    ).json()
    drafted = ferryctl(
        "releases", "create", "by-group", "--version", version["id"], "--group", "lab-cams", "--json"
    )
    assert drafted.code == 0, drafted.stderr
    assert drafted.json()["state"] == "draft" and drafted.json()["target"]["group_ids"] == [group["id"]]
    unknown = ferryctl("releases", "create", "x", "--version", version["id"], "--group", "no-such-group")
    assert unknown.code == 2 and "no device group named 'no-such-group'" in unknown.stderr


@pytest.mark.slow
def test_devices_list_show_pin_and_pages(ferryctl, org, lab_device):
    for n in range(2, 5):
        device_enrol(
            token=enrolment_token_create(organisation=org).token,
            name=f"cam-{n}",
            attributes={},
            labels={"site": "depot"},
        )
    every = ferryctl("devices", "list", "--json").json()
    assert sorted(d["name"] for d in every) == ["cam-1", "cam-2", "cam-3", "cam-4"]
    lab = ferryctl("devices", "list", "--filter", "labels.site == lab", "--json").json()
    assert [d["id"] for d in lab] == [str(lab_device.pk)]
    two = ferryctl("devices", "list", "--limit", "2", "--json").json()
    assert len(two) == 2
    shown = ferryctl("devices", "show", str(lab_device.pk), "--json").json()
    assert shown["name"] == "cam-1" and shown["labels"] == {"site": "lab"}

    bad = ferryctl("devices", "list", "--filter", "labels.site ==")
    assert bad.code == 2 and "error:" in bad.stderr and bad.stdout == ""
    missing = ferryctl(
        "devices", "pin", str(lab_device.pk), "--version", "00000000-0000-0000-0000-000000000000"
    )
    assert missing.code == 2 and "error:" in missing.stderr
    unpinned = ferryctl("devices", "unpin", str(lab_device.pk), "--json")
    assert unpinned.code == 0 and unpinned.json()["pinned_version"] is None


@pytest.mark.slow
def test_enrolment_tokens_create_list_revoke(ferryctl):
    created = ferryctl("tokens", "create", "--labels", "site=lab", "--ttl-hours", "2", "--json")
    assert created.code == 0, created.stderr
    token = created.json()
    assert token["token"] and token["labels"] == {"site": "lab"}
    listed = ferryctl("tokens", "list", "--json").json()
    assert [(t["id"], t["state"]) for t in listed] == [(token["id"], "unused")]
    assert "token" not in listed[0]  # the secret is shown once
    revoked = ferryctl("tokens", "revoke", str(token["id"]))
    assert revoked.code == 0, revoked.stderr
    after = ferryctl("tokens", "list", "--json").json()
    assert after == [] or after[0]["state"] != "unused"
    malformed = ferryctl("tokens", "create", "--labels", "no-equals-sign")
    assert malformed.code == 2 and "key=value" in malformed.stderr


@pytest.mark.slow
def test_a_bad_token_is_a_clear_error_and_exit_2(ferryctl):
    refused = ferryctl("models", "list", token="not-a-token")
    assert refused.code == 2
    assert refused.stderr.startswith("error:") and "401" in refused.stderr
    assert refused.stdout == ""


@pytest.mark.slow
def test_login_writes_a_private_config_that_later_commands_use(ferryctl, live_server, admin, tmp_path):
    bad = ferryctl("login", "--url", live_server.url, "--token", "wrong", env={"FERRY_TOKEN": None})
    assert bad.code == 2 and not (tmp_path / "config" / "ferry" / "config.toml").exists()
    saved = ferryctl("login", "--url", live_server.url, "--token", admin[1], env={"FERRY_TOKEN": None})
    assert saved.code == 0, saved.stderr
    path = tmp_path / "config" / "ferry" / "config.toml"
    assert path.stat().st_mode & 0o777 == 0o600
    from_file = ferryctl("models", "list", "--json", env={"FERRY_URL": None, "FERRY_TOKEN": None})
    assert from_file.code == 0 and from_file.json() == []
    nothing = ferryctl(
        "models", "list", env={"FERRY_URL": None, "FERRY_TOKEN": None, "XDG_CONFIG_HOME": "/nonexistent"}
    )
    assert nothing.code == 2 and "FERRY_URL" in nothing.stderr


@pytest.mark.slow
def test_an_unreachable_server_exits_1(ferryctl):
    down = ferryctl("devices", "list", env={"FERRY_URL": "http://127.0.0.1:9"})
    assert down.code == 1 and "Cannot reach" in down.stderr


@pytest.mark.slow
def test_upload_passes_kind_and_base_to_the_server(ferryctl, conversion_worker, tmp_path, live_server, admin):
    """--kind llm_adapter --base reach the server: an ONNX version is no adapter's base."""
    assert ferryctl("models", "create", "chat", "--json").code == 0
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(onnx_bytes())
    uploaded = ferryctl("versions", "upload", "chat", str(onnx), "--label", "v1", "--wait", "--json")
    assert uploaded.code == 0, uploaded.stderr
    onnx_version = uploaded.json()["id"]
    adapter = ferryctl(
        "versions", "upload", "chat", str(onnx), "--label", "pirate", "--kind", "llm_adapter",
        "--base", onnx_version, "--json",
    )  # fmt: skip
    assert adapter.code != 0
    assert "is a onnx version; an adapter's base is an llm version" in adapter.stderr
