"""Column types that convert once, at the database boundary: a JSON column
reads back as its pydantic model, a status column as its enum. Callers
above never re-validate what they read."""

from __future__ import annotations

from enum import Enum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy import JSON, String
from sqlalchemy.types import TypeDecorator

M = TypeVar("M", bound=BaseModel)
# The validation context of what the database gives back (ddpo/schemas/strict.py).
STORED = {"stored": True}
E = TypeVar("E", bound=Enum)


class ModelJSON(TypeDecorator[M], Generic[M]):
    """A pydantic model stored as its JSON form (the same documents as a
    plain JSON column holds: nothing to migrate)."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[M]) -> None:
        super().__init__()
        self.model = model

    def process_bind_param(self, value: M | None, dialect: Any) -> Any:
        return None if value is None else value.model_dump(mode="json")

    def process_result_value(self, value: Any, dialect: Any) -> M | None:
        # Checks that came after a row was written must not make it unreadable.
        return None if value is None else self.model.model_validate(value, context=STORED)


class EnumText(TypeDecorator[E], Generic[E]):
    """An enum stored as its value in a plain string column (SQLAlchemy's
    own Enum type stores member names)."""

    impl = String
    cache_ok = True

    def __init__(self, enum: type[E]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: E | str | None, dialect: Any) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Any) -> E | None:
        return None if value is None else self.enum(value)
