"""Restore any forecaster from its `to_dict()`: a table from `kind` tag to class.

Each forecaster class joins the table where it is defined (`@restorable`), so the containers
(ensemble, quantile tracking) can restore their members through this module without importing the
registry that builds them: the registry imports them, this module imports none of them.
"""

from __future__ import annotations

from typing import Any, TypeVar

from preheat.scaling.forecast.base import Forecaster

T = TypeVar("T", bound=type)

_CLASSES: dict[str, Any] = {}


def restorable(cls: T) -> T:
    """Class decorator: `forecaster_from_dict` restores dicts tagged `cls.kind` with `cls.from_dict`."""
    _CLASSES[cls.kind] = cls
    return cls


def forecaster_from_dict(d: dict[str, Any]) -> Forecaster:
    """Restore any forecaster from its `to_dict()` (dispatches on the `kind` tag)."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind not in _CLASSES:
        raise ValueError(f"cannot restore forecaster of kind {kind!r}; known: {', '.join(sorted(_CLASSES))}")
    return _CLASSES[kind].from_dict(d)
