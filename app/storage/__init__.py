"""SQL storage: the engine, the schema (Alembic migrations) and one store per part.

One naming rule: ``<part>_store.py`` holds the SQL implementation of the Protocol its
consumer declares, named ``Sql<Protocol>`` (``Pg<Protocol>`` for a PostgreSQL-only
one): ``experiment_store.SqlExperimentStore`` is ``app.experiments.core.store.ExperimentStore``,
``process_store.SqlProcessRecords`` is ``ProcessRecords``, ``auth_store.SqlAuthStore``
is ``auth.store.AuthStore``. The other modules are not stores: the engine and the ORM
base (``db``), the experiments' tables (``experiment_rows``), the audit trail (a
batching writer), the cancel flag both job and task stores share, a PostgreSQL channel
(``ready_relay``), the retention sweep, the schema head, decisions taken in batches
(``batches``, and ``auth_admissions`` for the sign-in's) and the sign-in's own
connections (``front_door``) and SQLite's writers in turns (``sqlite_writes``). Nothing outside this
package sees an ORM row."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "audit",
    "audit_day_store",
    "auth_admissions",
    "auth_store",
    "batches",
    "cancel_requests",
    "db",
    "egress_store",
    "experiment_rows",
    "experiment_store",
    "front_door",
    "pool_pg_store",
    "pool_store",
    "process_store",
    "rate_store",
    "ready_relay",
    "retention",
    "schema_head",
    "sqlite_writes",
    "task_store",
    "warm_store",
]
