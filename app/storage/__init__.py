"""SQL storage: the engine, the schema (Alembic migrations) and one store per part.

One naming rule: ``<part>_store.py`` holds the SQL implementation of the Protocol its
consumer declares, named ``Sql<Protocol>`` (``Pg<Protocol>`` for a PostgreSQL-only
one): ``experiment_store.SqlExperimentStore`` is ``app.experiments.core.store.ExperimentStore``,
``process_store.SqlProcessRecords`` is ``ProcessRecords``. The other modules here are
not stores: the engine and the ORM base (``db``), the experiments' tables
(``experiment_rows``), the audit trail (a batching writer), the cancel flag both job and
task stores share, the retention sweep, the schema head, decisions taken in batches
(``batches``) and SQLite's writers in turns (``sqlite_writes``).

Two parts have a folder of their own, as they have several modules each: ``signin/``
(the sign-in's store, its batched admissions and its own connections) and ``slots/``
(the slot pool's state and leadership, the warm containers' claims and the PostgreSQL
channel that says a slot is ready). Nothing outside this package sees an ORM row."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "audit",
    "audit_day_store",
    "batches",
    "cancel_requests",
    "db",
    "egress_store",
    "experiment_rows",
    "experiment_store",
    "process_store",
    "rate_store",
    "retention",
    "schema_head",
    "signin",
    "slots",
    "sqlite_writes",
    "task_store",
]
