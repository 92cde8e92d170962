"""Exceptions raised by the strata SDK.

Every failure is a :class:`StrataError`. HTTP errors from the daemon carry the
status, the machine-readable ``code`` (see docs/api.md, "Errors") and, for
illegal lifecycle transitions, the sandbox's ``current_state``.
"""

from __future__ import annotations

from typing import Any


class StrataError(Exception):
    """Base class of every SDK error.

    Attributes:
        status: HTTP status of the response (0 when no response was received).
        code: Machine-readable error code from the daemon, e.g. ``"sandbox_not_found"``.
        message: Human-readable message.
        current_state: State of the sandbox for ``invalid_state`` errors, else ``None``.
        body: The whole decoded error body (may hold ``dependents`` or ``findings``).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "",
        current_state: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.current_state = current_state
        self.body: dict[str, Any] = body or {}

    @property
    def dependents(self) -> list[str]:
        """Objects that still need the target (``in_use`` errors)."""
        return list(self.body.get("dependents") or [])

    @property
    def findings(self) -> list[dict[str, Any]]:
        """State-hygiene scan findings (``scan_findings`` errors)."""
        return list(self.body.get("findings") or [])

    @property
    def conflicts(self) -> list[dict[str, Any]]:
        """Paths changed both in the sandbox and between two bases (``rebase_conflicts`` errors)."""
        return list(self.body.get("conflicts") or [])

    def __str__(self) -> str:
        parts = [self.message]
        if self.code:
            parts.insert(0, f"[{self.status} {self.code}]")
        if self.current_state:
            parts.append(f"(current state: {self.current_state})")
        return " ".join(parts)


class BadRequest(StrataError):
    """400: malformed input, a hostile archive, or a path leaving the sandbox."""


class Unauthorized(StrataError):
    """401: TCP access without the right bearer token."""


class Forbidden(StrataError):
    """403: a tenant token on an operator-only route, another tenant named, or a
    request citing a denied Rule-of-Two approval (``approval`` holds it)."""

    @property
    def approval(self) -> dict[str, Any] | None:
        """The approval the refusal is about, if any."""
        a = self.body.get("approval")
        return dict(a) if isinstance(a, dict) else None


class ApprovalRequired(Forbidden):
    """403 ``approval_required``: the request would give one sandbox all three
    Rule-of-Two capabilities. ``approval["id"]`` names the pending approval; once an
    operator approves it (:meth:`Client.approve`), repeat the request."""


class NotFound(StrataError):
    """404: unknown sandbox, image, checkpoint, process, file, lease or route."""


class Conflict(StrataError):
    """409: illegal in the current state (``current_state`` says which), name taken,
    object still in use (``dependents``) or scan findings (``findings``)."""


class Unsupported(StrataError):
    """501: the host lacks a feature (e.g. standby without CRIU)."""


class ServerError(StrataError):
    """5xx other than 501: an internal daemon error, a corrupt standby image, a registry failure."""


class QuotaExceeded(StrataError):
    """429 ``quota_exceeded``: the request would take the tenant over one of its
    quotas (sandboxes, memory, disk, forks per minute); the message names the
    quota, its limit and the usage. Nothing was created."""


class InsufficientResources(ServerError):
    """507 ``insufficient_storage`` / 503 ``insufficient_memory``: the host cannot
    take the request now (its free disk or memory, minus the daemon's reserve and
    over-commit limits); the message says what is available. Nothing was created."""


class MetadataUnavailable(ServerError):
    """503 ``metadata_unavailable``: the daemon's PostgreSQL metadata database
    cannot be reached; the message says why. Nothing of the request was
    written: retry once the database is back."""


class StrataConnectionError(StrataError):
    """The daemon could not be reached (socket missing, connection refused, dropped)."""


_BY_STATUS: dict[int, type[StrataError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: QuotaExceeded,
    501: Unsupported,
    503: InsufficientResources,
    507: InsufficientResources,
}


def error_from_response(status: int, body: dict[str, Any] | None, fallback: str) -> StrataError:
    """Builds the exception for an error response (used by the client)."""
    body = body or {}
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else StrataError)
    if body.get("code") == "approval_required":
        cls = ApprovalRequired
    elif body.get("code") == "metadata_unavailable":
        cls = MetadataUnavailable
    return cls(
        str(body.get("message") or fallback),
        status=status,
        code=str(body.get("code") or ""),
        current_state=body.get("current_state"),
        body=body,
    )
