"""A scrape of `/metrics`, parsed into samples: what tests/http/test_daemon_metrics.py and
tests/engines/test_daemon_metrics_engines.py share."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.console import TOKEN

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(node: Any, headers: dict[str, str] | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {TOKEN}"} if headers is None else headers
    async with node.client.get("/metrics", headers=headers) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(await response.text())


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]
