"""SQL storage: the engine, the schema (Alembic migrations) and one store per part.

One naming rule: ``<part>_store.py`` holds the SQL implementation of the Protocol its
consumer declares, named ``Sql<Protocol>`` (``Pg<Protocol>`` for a PostgreSQL-only
one): ``experiment_store.SqlExperimentStore`` is ``app.experiments.core.store.ExperimentStore``,
``process_store.SqlProcessRecords`` is ``ProcessRecords``, ``auth_store.SqlAuthStore``
is ``auth.store.AuthStore``. The other modules are not stores: the engine and the ORM
base (``db``), the experiments' tables (``experiment_rows``), the audit trail (a
batching writer), the cancel flag both job and task stores share, a PostgreSQL channel
(``ready_relay``), the retention sweep and the schema head. Nothing outside this
package sees an ORM row."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "audit",
    "audit_day_store",
    "auth_store",
    "cancel_requests",
    "db",
    "egress_store",
    "experiment_rows",
    "experiment_store",
    "pool_pg_store",
    "pool_store",
    "process_store",
    "rate_store",
    "ready_relay",
    "retention",
    "schema_head",
    "task_store",
    "warm_store",
]
