"""Alembic environment: runs on the connection that ``app.storage.db.upgrade_schema`` hands it."""

from alembic import context

from app.storage.db import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
)
with context.begin_transaction():
    context.run_migrations()
