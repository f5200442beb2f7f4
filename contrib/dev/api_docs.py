#!/usr/bin/env python3
"""Writes what is generated of the API's documents, from the routes' declarations
(`tuneplane_node/daemon/routes.py`) and the request fields (`tuneplane_node/wire/`, the
launch's in `requests.py`): the OpenAPI document, ``contrib/openapi.json``, and in
``docs/api.md`` every request's field table. Run it after changing a route or a field:

    .venv/bin/python contrib/dev/api_docs.py            # write both
    .venv/bin/python contrib/dev/api_docs.py --check    # write nothing; exit 1 if stale

A table stands between ``<!-- fields: <Body> -->`` and ``<!-- end fields -->``; every
request body and query with fields has exactly one. tests/unit/test_wire_schema.py fails
while either file differs from what this writes.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package, whatever else is installed

from tuneplane_node.daemon.routes import OPERATIONS, document  # noqa: E402 (after the path)
from tuneplane_node.wire import schema  # noqa: E402 (after the path)
from tuneplane_node.wire.fields import Body, Field  # noqa: E402 (after the path)

OPENAPI = REPO / "contrib" / "openapi.json"
API_DOCS = REPO / "docs" / "api.md"
TABLE = re.compile(r"(<!-- fields: (\w+) -->\n)(.*?)(<!-- end fields -->)", re.DOTALL)
HEAD = "| Field | Required | Meaning |\n|---|---|---|\n"


def bodies() -> dict[str, Body]:
    """Every request body and query the routes declare that has fields, by name."""
    declared = (body for op in OPERATIONS for body in (op.body, op.query) if body is not None)
    return {body.name: body for body in declared if body.fields}


def table(body: Body) -> str:
    """The body's fields as docs/api.md shows them; a nested object's follow its row."""
    return HEAD + "".join(f"{row}\n" for row in rows(body.fields, prefix=""))


def rows(fields: Iterable[Field], *, prefix: str) -> Iterator[str]:
    for field in fields:
        name, doc = f"{prefix}{field.name}", field.doc.replace("|", "\\|")
        yield f"| `{name}` | {'yes' if field.required else 'no'} | {doc} |"
        if isinstance(field.schema, Body):
            yield from rows(field.schema.fields, prefix=f"{name}.")


def tabled(text: str) -> list[str]:
    """The bodies ``text`` has a table of, in order."""
    return [match.group(2) for match in TABLE.finditer(text)]


def with_tables(text: str) -> str:
    """``text`` with the table of every body the routes declare written anew."""
    known = bodies()

    def written(match: re.Match[str]) -> str:
        body = known.get(match.group(2))
        return match.group(0) if body is None else match.group(1) + table(body) + match.group(4)

    return TABLE.sub(written, text)


def table_problems(text: str) -> list[str]:
    """What no rewrite mends: a body without a table, a table of no body, one twice."""
    known, shown = bodies(), tabled(text)
    found = [f"docs/api.md: no table of {name}" for name in known if name not in shown]
    found += [f"docs/api.md: a table of {name}, which no route declares" for name in shown
              if name not in known]  # fmt: skip
    repeated = sorted({name for name in shown if shown.count(name) > 1})
    return found + [f"docs/api.md: two tables of {name}" for name in repeated]


def stale() -> list[str]:
    """The generated files that differ from what this script writes."""
    found = []
    if with_tables(API_DOCS.read_text()) != API_DOCS.read_text():
        found.append("docs/api.md")
    if OPENAPI.read_text() != schema.render(document()):
        found.append("contrib/openapi.json")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    check = parser.parse_args(argv).check
    broken = table_problems(API_DOCS.read_text())
    if broken:
        print("\n".join(broken), file=sys.stderr)
        return 1
    if check:
        out = stale()
        print(*(f"{path} is stale" for path in out), sep="\n", file=sys.stderr)
        return 1 if out else 0
    API_DOCS.write_text(with_tables(API_DOCS.read_text()))
    OPENAPI.write_text(schema.render(document()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
