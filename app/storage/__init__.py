"""SQL storage: the engine, the schema (Alembic migrations) and one store per part
(auth, pool, experiments). Nothing outside this package sees an ORM row."""
