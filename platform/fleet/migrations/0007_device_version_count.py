"""fleet_deviceversioncount, kept by triggers on fleet_device (PostgreSQL only; see
fleet.models.DeviceVersionCount)."""

from django.db import migrations, models

# Statement-level, from the statement's transition tables: a bulk statement (a fill, a bulk
# revoke, a version deleted under 100,000 devices) makes one upsert per row it touches here,
# not one per device (row-level, a count updated 100,000 times in one transaction took
# minutes). The moves are upserted in key order, so two single-statement transactions (a
# check-in, a bulk action) cannot deadlock on them.
MOVES = """
    INSERT INTO fleet_deviceversioncount AS c (organisation_id, version_id, slot, devices)
    SELECT m.organisation_id, m.version_id, m.slot, sum(m.delta)
    FROM ({moves}) AS m (organisation_id, version_id, slot, delta)
    GROUP BY m.organisation_id, m.version_id, m.slot
    HAVING sum(m.delta) <> 0
    ORDER BY m.organisation_id, m.version_id, m.slot
    ON CONFLICT (organisation_id, version_id, slot) DO UPDATE SET devices = c.devices + EXCLUDED.devices;
"""
# the slot: the device id's last byte, so devices installing the same version at once share
# a row lock one time in 16
SLOT = "get_byte(uuid_send(id), 15) & 15"
LEFT = f"SELECT organisation_id, running_version_id, {SLOT}, -1 FROM old_devices WHERE revoked_at IS NULL"
JOINED = f"SELECT organisation_id, running_version_id, {SLOT}, 1 FROM new_devices WHERE revoked_at IS NULL"


def _function(name: str, moves: str) -> str:
    body = MOVES.format(moves=moves)
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN{body}    RETURN NULL;\nEND\n$$;"
    )


FUNCTIONS = (
    "\n".join(
        [
            _function("fleet_device_version_count_inserted", JOINED),
            _function("fleet_device_version_count_deleted", LEFT),
            # every UPDATE: a row whose organisation, version and revocation did not change
            # leaves and rejoins the same count, and the HAVING drops it (no write)
            _function("fleet_device_version_count_updated", f"{LEFT} UNION ALL {JOINED}"),
        ]
    )
    + """
CREATE FUNCTION fleet_device_version_count_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fleet_deviceversioncount;
    RETURN NULL;
END
$$;
"""
)

TRIGGERS = """
CREATE TRIGGER fleet_device_version_count_insert AFTER INSERT ON fleet_device
    REFERENCING NEW TABLE AS new_devices
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_device_version_count_inserted();
CREATE TRIGGER fleet_device_version_count_update AFTER UPDATE ON fleet_device
    REFERENCING OLD TABLE AS old_devices NEW TABLE AS new_devices
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_device_version_count_updated();
CREATE TRIGGER fleet_device_version_count_delete AFTER DELETE ON fleet_device
    REFERENCING OLD TABLE AS old_devices
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_device_version_count_deleted();
CREATE TRIGGER fleet_device_version_count_truncate AFTER TRUNCATE ON fleet_device
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_device_version_count_truncated();
"""

# the devices already there are counted under this lock (held to the migration's commit), so
# no write falls between the count and the triggers
LOCK = "LOCK TABLE fleet_device IN SHARE ROW EXCLUSIVE MODE"
BACKFILL = f"""
INSERT INTO fleet_deviceversioncount (organisation_id, version_id, slot, devices)
SELECT organisation_id, running_version_id, {SLOT}, count(*) FROM fleet_device
WHERE revoked_at IS NULL GROUP BY 1, 2, 3;
"""

DROP = """
DROP TRIGGER IF EXISTS fleet_device_version_count_insert ON fleet_device;
DROP TRIGGER IF EXISTS fleet_device_version_count_update ON fleet_device;
DROP TRIGGER IF EXISTS fleet_device_version_count_delete ON fleet_device;
DROP TRIGGER IF EXISTS fleet_device_version_count_truncate ON fleet_device;
DROP FUNCTION IF EXISTS fleet_device_version_count_inserted();
DROP FUNCTION IF EXISTS fleet_device_version_count_deleted();
DROP FUNCTION IF EXISTS fleet_device_version_count_updated();
DROP FUNCTION IF EXISTS fleet_device_version_count_truncated();
"""


def install(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for sql in (LOCK, FUNCTIONS, TRIGGERS, BACKFILL):
            schema_editor.execute(sql)


def uninstall(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0006_rest_device_list_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeviceVersionCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("organisation_id", models.BigIntegerField()),
                ("version_id", models.UUIDField(null=True)),
                ("slot", models.SmallIntegerField(default=0)),
                ("devices", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("organisation_id", "version_id", "slot"),
                        name="device_version_count_key",
                        nulls_distinct=False,
                    )
                ],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
