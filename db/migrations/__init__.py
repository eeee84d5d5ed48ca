"""Alembic's environment and the schema's revisions (db/migrate.py runs them)."""
