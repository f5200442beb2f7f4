"""Image references as an engine holds them: every spelling of one is one (`canonical`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from tuneplane_node.references import canonical

T = TypeVar("T")


class References(set[str]):
    """The references an engine has: every spelling of one is one (`canonical`), as the
    engines normalise them."""

    def __init__(self, refs: Iterable[str] = ()) -> None:
        super().__init__(canonical(ref) for ref in refs)

    def add(self, ref: str) -> None:
        super().add(canonical(ref))

    def discard(self, ref: object) -> None:
        if isinstance(ref, str):
            super().discard(canonical(ref))

    def remove(self, ref: str) -> None:
        super().remove(canonical(ref))

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and super().__contains__(canonical(ref))


class ByReference(dict[str, T]):
    """A fact of an image, by reference (every spelling of one is one)."""

    def __setitem__(self, ref: str, value: T) -> None:
        super().__setitem__(canonical(ref), value)

    def __getitem__(self, ref: str) -> T:
        return super().__getitem__(canonical(ref))

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and super().__contains__(canonical(ref))

    def get(self, ref: str, default: Any = None) -> Any:
        return super().get(canonical(ref), default)
