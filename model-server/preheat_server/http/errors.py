"""OpenAI-style error bodies: every failure the API reports is `{"error": {message, type, param, code}}`."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import ValidationError


class APIError(Exception):
    """A request failure with the HTTP status and OpenAI error fields to report."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _loc_to_param(loc: tuple) -> str:
    """('messages', 0, 'content') -> 'messages[0].content'; pydantic's union-branch tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or part in ("str", "int", "float", "bool", "list", "dict", "none") or \
                part.startswith(("function-", "constrained-", "tagged-")):
            continue  # a union branch name, not a field
        else:
            out += ("." if out else "") + part
    return out


def from_validation_error(err: ValidationError) -> APIError:
    """The most telling problem of a pydantic validation error, as a 400 naming the offending parameter.

    When a union field fails in every branch, a branch whose type matched but whose value did not
    (too long, out of range) says more than "not a string"; if every branch failed on type, the
    message says which type was sent.
    """
    errors = err.errors(include_url=False)
    first = errors[0]
    top = first["loc"][0] if first["loc"] else None
    same_field = [e for e in errors if (e["loc"][0] if e["loc"] else None) == top]
    value_errors = [e for e in same_field if not e["type"].endswith("_type") and e["type"] != "missing"]
    chosen = value_errors[0] if value_errors else first
    param = _loc_to_param(tuple(chosen["loc"]))
    if chosen["type"] == "missing":
        message = f"Missing required parameter '{param}'."
    elif chosen["type"] == "extra_forbidden":
        message = f"Unrecognized parameter '{param}'."
    elif not value_errors and len(same_field) > 1:
        param = _loc_to_param(tuple(first["loc"]))
        message = f"Invalid type for '{param}': got {_describe(_input_at(first))}."
    elif chosen["type"] == "value_error":
        message = f"Invalid value for '{param}': {chosen['msg'].removeprefix('Value error, ')}"
    else:
        message = f"Invalid value for '{param}': {chosen['msg']}" + _got(chosen)
    return APIError(400, message, param=param or None, code=chosen["type"])


def _input_at(e: dict) -> Any:
    return e.get("input")


def _got(e: dict) -> str:
    if "input" not in e or isinstance(e["input"], dict | list):
        return "."
    text = repr(e["input"])
    return f" (got {text[:60]})." if len(text) <= 60 else " (got a long value)."


def _describe(value: Any) -> str:
    kinds = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array",
             dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)
