"""A bad setting said in one line naming its variable (``TUNEPLANE_*``), a secret's value
never repeated; a list setting that is not JSON said so."""

from __future__ import annotations

import re

from pydantic import ValidationError
from pydantic_settings import SettingsError

from tuneplane_node.settings.values import ENV_PREFIX, env_name

SECRET_FIELDS = frozenset({"node_token", "TUNEPLANE_NODE_TOKEN"})


def describe_validation(exc: ValidationError) -> str:
    """One line naming each bad variable; a secret's value is never repeated."""
    problems = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        if not error["loc"]:  # a rule across settings: its message names them
            problems.append(message)
            continue
        field = str(error["loc"][0])
        name = field if field.startswith(ENV_PREFIX) else env_name(field)
        inner = ".".join(str(part) for part in error["loc"][1:])
        where = f"{name} ({inner})" if inner else name
        shown = "" if field in SECRET_FIELDS else f" (got {error.get('input')!r})"
        problems.append(f"{where}: {message}{shown}")
    return "invalid settings: " + "; ".join(problems)


def describe_settings_error(exc: SettingsError) -> str:
    """pydantic-settings says 'error parsing value for field "fabrics"': name the variable."""
    match = re.search(r'field "(\w+)"', str(exc))
    name = env_name(match.group(1)) if match else "a TUNEPLANE_ setting"
    return (
        f"invalid settings: {name}: not valid JSON (lists are given as JSON, e.g. '[\"/models\"]')"
    )
