"""releases_releasestatecount, kept by triggers on releases_devicereleasestatus (PostgreSQL
only; see releases.models.ReleaseStateCount and fleet's migration 0007, the same pattern)."""

from django.db import migrations, models

# Statement-level, from the statement's transition tables (one upsert per count row a
# statement moves, however many reports it writes), upserted in key order (two single-statement
# transactions cannot deadlock on them).
MOVES = """
    INSERT INTO releases_releasestatecount AS c (release_id, state, slot, devices)
    SELECT m.release_id, m.state, m.slot, sum(m.delta)
    FROM ({moves}) AS m (release_id, state, slot, delta)
    GROUP BY m.release_id, m.state, m.slot
    HAVING sum(m.delta) <> 0
    ORDER BY m.release_id, m.state, m.slot
    ON CONFLICT (release_id, state, slot) DO UPDATE SET devices = c.devices + EXCLUDED.devices;
"""
# the slot: the device id's last byte, so reports of one state arriving at once share a row
# lock one time in 16
SLOT = "get_byte(uuid_send(device_id), 15) & 15"
LEFT = f"SELECT release_id, state, {SLOT}, -1 FROM old_statuses"
JOINED = f"SELECT release_id, state, {SLOT}, 1 FROM new_statuses"


def _function(name: str, moves: str) -> str:
    body = MOVES.format(moves=moves)
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN{body}    RETURN NULL;\nEND\n$$;"
    )


FUNCTIONS = (
    "\n".join(
        [
            _function("release_state_count_inserted", JOINED),
            _function("release_state_count_deleted", LEFT),
            # every UPDATE: a report whose state did not change leaves and rejoins the same count,
            # and the HAVING drops it (no write)
            _function("release_state_count_updated", f"{LEFT} UNION ALL {JOINED}"),
        ]
    )
    + """
CREATE FUNCTION release_state_count_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM releases_releasestatecount;
    RETURN NULL;
END
$$;
"""
)

TRIGGERS = """
CREATE TRIGGER release_state_count_insert AFTER INSERT ON releases_devicereleasestatus
    REFERENCING NEW TABLE AS new_statuses
    FOR EACH STATEMENT EXECUTE FUNCTION release_state_count_inserted();
CREATE TRIGGER release_state_count_update AFTER UPDATE ON releases_devicereleasestatus
    REFERENCING OLD TABLE AS old_statuses NEW TABLE AS new_statuses
    FOR EACH STATEMENT EXECUTE FUNCTION release_state_count_updated();
CREATE TRIGGER release_state_count_delete AFTER DELETE ON releases_devicereleasestatus
    REFERENCING OLD TABLE AS old_statuses
    FOR EACH STATEMENT EXECUTE FUNCTION release_state_count_deleted();
CREATE TRIGGER release_state_count_truncate AFTER TRUNCATE ON releases_devicereleasestatus
    FOR EACH STATEMENT EXECUTE FUNCTION release_state_count_truncated();
"""

# the reports already there are counted under this lock (held to the migration's commit), so
# no write falls between the count and the triggers
LOCK = "LOCK TABLE releases_devicereleasestatus IN SHARE ROW EXCLUSIVE MODE"
BACKFILL = f"""
INSERT INTO releases_releasestatecount (release_id, state, slot, devices)
SELECT release_id, state, {SLOT}, count(*) FROM releases_devicereleasestatus GROUP BY 1, 2, 3;
"""

DROP = """
DROP TRIGGER IF EXISTS release_state_count_insert ON releases_devicereleasestatus;
DROP TRIGGER IF EXISTS release_state_count_update ON releases_devicereleasestatus;
DROP TRIGGER IF EXISTS release_state_count_delete ON releases_devicereleasestatus;
DROP TRIGGER IF EXISTS release_state_count_truncate ON releases_devicereleasestatus;
DROP FUNCTION IF EXISTS release_state_count_inserted();
DROP FUNCTION IF EXISTS release_state_count_deleted();
DROP FUNCTION IF EXISTS release_state_count_updated();
DROP FUNCTION IF EXISTS release_state_count_truncated();
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
        ("releases", "0006_event_organisation"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReleaseStateCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("release_id", models.UUIDField()),
                ("state", models.CharField(max_length=16)),
                ("slot", models.SmallIntegerField(default=0)),
                ("devices", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("release_id", "state", "slot"), name="release_state_count_key"
                    )
                ],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
