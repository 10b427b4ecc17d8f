"""SQL storage: the engine, the schema (Alembic migrations) and one store per part
(auth, pool, experiments). Nothing outside this package sees an ORM row."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "artifact_records",
    "audit",
    "auth_store",
    "cancel_requests",
    "db",
    "egress_store",
    "experiment_rows",
    "experiment_store",
    "job_records",
    "pool_pg",
    "pool_store",
    "process_store",
    "rate_store",
    "ready_relay",
    "retention",
    "schema_head",
    "task_records",
    "warm_store",
]
