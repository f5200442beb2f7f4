"""The container engine's failures: it did not answer (503), or answered no (502), for
what is there already (409) or for a field of the request (422)."""

from __future__ import annotations

from typing import ClassVar

from tuneplane_node.errors.base import INVALID, FieldError, NodeError
from tuneplane_node.errors.conflicts import Conflict


class EngineError(NodeError):
    """Something about the container engine (or the process runtime standing in for one)."""

    code: ClassVar[str] = "engine_error"

    def __init__(self, message: str, *, engine: str) -> None:
        super().__init__(message)
        self.engine = engine


class EngineUnavailable(EngineError):
    """The engine did not answer. Nothing is known, so nothing may be reported gone."""

    status = 503
    code: ClassVar[str] = "engine_unavailable"

    def __init__(self, *, engine: str, reason: str) -> None:
        super().__init__(f"engine unreachable: {engine}: {reason}", engine=engine)
        self.reason = reason


class EngineRefused(EngineError):
    """The engine answered and refused the call; carries the engine's own message."""

    status = 502
    code: ClassVar[str] = "engine_refused"

    def __init__(self, *, engine: str, action: str, reason: str) -> None:
        super().__init__(f"{engine} refused to {action}: {reason}", engine=engine)
        self.action = action
        self.reason = reason


class EngineConflict(EngineRefused, Conflict):
    """The engine refused because of what is already there (a container name in use):
    the caller's to resolve, not a node fault."""

    status = 409
    code: ClassVar[str] = "engine_conflict"


class RegistryRefused(EngineRefused):
    """The registry refused the pull: wrong or missing credentials, or no such image
    (the engines deliberately say the two alike). Not retried: the same credentials
    would be refused again."""

    code: ClassVar[str] = "registry_refused"

    def __init__(self, *, engine: str, image: str, reason: str) -> None:
        super().__init__(
            engine=engine,
            action=f"pull {image}",
            reason=f"the registry refused access to {image} (wrong or missing credentials, "
            f"or no such image): {reason}",
        )
        self.image = image


class SpecRefused(EngineRefused):
    """The engine refused a container for one of its fields: the console's to fix."""

    status = 422
    code: ClassVar[str] = "spec_refused"

    def __init__(self, *, engine: str, action: str, reason: str, field: str) -> None:
        super().__init__(engine=engine, action=action, reason=reason)
        self.field = field
        self.message = f"{field}: {self.message}"
        self.args = (self.message,)
        self.errors = (FieldError(field, INVALID, self.message),)


def is_name_conflict(status: int | None, message: str) -> bool:
    """Engines say "name in use" with 409 (docker) or 500 and a sentence (podman 4)."""
    return status == 409 or "already in use" in message
