"""Leave room on each page of the job table for new versions of its rows (PostgreSQL only).

Every cycle rewrites the `reason` of the waiting jobs whose reason changed: a placing cycle on a
large queue rewrites tens of thousands. `reason` is in no index, so PostgreSQL can update such a
row in place on its page (a HOT update: no new index entries, old versions pruned on the page)
but only when the page has room. At fillfactor 50 a page keeps room for a new version of each of
its rows; at the default (100) pages are full and every rewrite inserts into all the table's
indexes. Existing pages take the setting as they are rewritten (VACUUM FULL, pg_repack).
"""

from django.db import migrations

FILLFACTOR = 50


def set_fillfactor(apps, schema_editor, value=FILLFACTOR):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("scheduler", "Job")._meta.db_table)
    schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(value)})")


def reset_fillfactor(apps, schema_editor):
    set_fillfactor(apps, schema_editor, value=100)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0002_agent_tokens_cluster_settings"),
    ]

    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
