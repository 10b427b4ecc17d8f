"""The slot pool's records: its state on SQLite (``pool_store.SqlPoolState``) and on
PostgreSQL (``pool_pg_store``: ``PgPoolState`` and ``PgLeadership``, an advisory lock and
NOTIFY), the warm containers' slot claims (``warm_store``) and the LISTEN/NOTIFY channel
that tells every server process a key's sandbox is ready (``ready_relay``)."""

__all__ = ["pool_pg_store", "pool_store", "ready_relay", "warm_store"]
