"""The sign-in's records: the SQL side of ``auth.store.AuthStore`` (``auth_store``), how
its presses of "Create my sandbox" are admitted in batches (``auth_admissions``), and the
connections it holds apart from the tenants' work (``front_door``), so a busy pool never
makes a sign-in wait for a connection."""

__all__ = ["auth_admissions", "auth_store", "front_door"]
