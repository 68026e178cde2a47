"""fleet_deviceversioncount, kept by triggers on fleet_device (PostgreSQL only; see
fleet.models.DeviceVersionCount)."""

from django.db import migrations, models

FUNCTION = """
CREATE FUNCTION fleet_device_version_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- the device's one leaves its old row and joins its new one; a device moving between two
    -- rows locks them in (organisation, version) order, so two moving opposite ways cannot
    -- deadlock; rows whose moves cancel out are not touched
    INSERT INTO fleet_deviceversioncount AS c (organisation_id, version_id, devices)
    SELECT m.organisation_id, m.version_id, sum(m.delta)
    FROM (
        SELECT OLD.organisation_id, OLD.running_version_id, -1
        WHERE TG_OP <> 'INSERT' AND OLD.revoked_at IS NULL
        UNION ALL
        SELECT NEW.organisation_id, NEW.running_version_id, 1
        WHERE TG_OP <> 'DELETE' AND NEW.revoked_at IS NULL
    ) AS m (organisation_id, version_id, delta)
    GROUP BY m.organisation_id, m.version_id
    HAVING sum(m.delta) <> 0
    ORDER BY m.organisation_id, m.version_id
    ON CONFLICT (organisation_id, version_id) DO UPDATE SET devices = c.devices + EXCLUDED.devices;
    RETURN NULL;
END
$$;

CREATE FUNCTION fleet_device_version_count_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fleet_deviceversioncount;
    RETURN NULL;
END
$$;
"""

# WHEN clauses: a check-in's last_seen_at or attributes write never calls the function
TRIGGERS = """
CREATE TRIGGER fleet_device_version_count_insert AFTER INSERT ON fleet_device
    FOR EACH ROW WHEN (NEW.revoked_at IS NULL) EXECUTE FUNCTION fleet_device_version_count();
CREATE TRIGGER fleet_device_version_count_update
    AFTER UPDATE OF organisation_id, running_version_id, revoked_at ON fleet_device
    FOR EACH ROW WHEN (
        OLD.organisation_id IS DISTINCT FROM NEW.organisation_id
        OR OLD.running_version_id IS DISTINCT FROM NEW.running_version_id
        OR (OLD.revoked_at IS NULL) <> (NEW.revoked_at IS NULL)
    ) EXECUTE FUNCTION fleet_device_version_count();
CREATE TRIGGER fleet_device_version_count_delete AFTER DELETE ON fleet_device
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL) EXECUTE FUNCTION fleet_device_version_count();
CREATE TRIGGER fleet_device_version_count_truncate AFTER TRUNCATE ON fleet_device
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_device_version_count_truncated();
"""

# the devices already there are counted under this lock (held to the migration's commit), so
# no write falls between the count and the triggers
LOCK = "LOCK TABLE fleet_device IN SHARE ROW EXCLUSIVE MODE"
BACKFILL = """
INSERT INTO fleet_deviceversioncount (organisation_id, version_id, devices)
SELECT organisation_id, running_version_id, count(*) FROM fleet_device
WHERE revoked_at IS NULL GROUP BY organisation_id, running_version_id;
"""

DROP = """
DROP TRIGGER IF EXISTS fleet_device_version_count_insert ON fleet_device;
DROP TRIGGER IF EXISTS fleet_device_version_count_update ON fleet_device;
DROP TRIGGER IF EXISTS fleet_device_version_count_delete ON fleet_device;
DROP TRIGGER IF EXISTS fleet_device_version_count_truncate ON fleet_device;
DROP FUNCTION IF EXISTS fleet_device_version_count();
DROP FUNCTION IF EXISTS fleet_device_version_count_truncated();
"""


def install(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for sql in (LOCK, FUNCTION, TRIGGERS, BACKFILL):
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
                ("devices", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("organisation_id", "version_id"),
                        name="device_version_count_key",
                        nulls_distinct=False,
                    )
                ],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
