"""The volume store's client acts with a tenant's authority alone (issue 49): it follows a
redirect only to https and only where a tenant could go itself, checks every address it
connects to, never carries a login to another origin, and keeps no cookie or connection
past the session of one fill. Against servers of the tests' own on this machine's
addresses, and listeners that count who connects (a fake metadata service)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.deputy import Listener, Tenant
from tests.http.test_daemon_server import make_ca, make_cert
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import PROGRESS_BYTES, Fetcher
from tuneplane_node.runtime.reach import Reach

# Real servers on sockets (tests' own loop): slow by the suite's rule.
pytestmark = pytest.mark.slow

ONLY_THE_TENANTS = ["127.0.0.1/32"]  # the tenant's server; 127.0.0.2 is "the node's"


@pytest.fixture
async def tenant() -> AsyncIterator[Tenant]:
    served = Tenant(files={"w": b"weights" * 1000}, mine=b"tenant b's checkpoint")
    await served.start()
    yield served
    await served.close()


@pytest.fixture
async def metadata() -> AsyncIterator[Listener]:
    """A fake cloud metadata service on an address of this machine the node never reaches."""
    listener = Listener("127.0.0.2")
    await listener.start()
    yield listener
    await listener.close()


def fetcher_for(
    tenant: Tenant, *, allowed: list[str] = ONLY_THE_TENANTS, **more: object
) -> Fetcher:
    host = tenant.url.split("://", 1)[1]
    insecure = frozenset({host}) if tenant.url.startswith("http:") else frozenset()
    return Fetcher(stall_s=5.0, reach=Reach(allowed), insecure=insecure, **more)  # type: ignore[arg-type]


async def fetched(fetcher: Fetcher, url: str, **headers: str) -> bytes:
    async with fetcher.session() as http, http.open(url, headers=headers) as download:
        return b"".join([bytes(batch) async for batch in download.batches()])


async def test_a_redirect_to_the_metadata_service_over_http_is_refused_unasked(
    tenant: Tenant, metadata: Listener
) -> None:
    target = f"http://127.0.0.2:{metadata.port}/latest/meta-data/iam/security-credentials/"
    with pytest.raises(VolumeFillFailed, match="a redirect to plain http://") as refused:
        await fetched(fetcher_for(tenant), f"{tenant.url}/redir?to={target}")
    assert not refused.value.retryable
    assert metadata.connections == 0


async def test_a_redirect_to_an_internal_https_address_is_refused_before_it_connects(
    tenant: Tenant, metadata: Listener
) -> None:
    target = f"https://127.0.0.2:{metadata.port}/latest/meta-data/"
    with pytest.raises(
        VolumeFillFailed, match=r"not one the node fetches from.*\(loopback\)"
    ) as refused:
        await fetched(fetcher_for(tenant), f"{tenant.url}/redir?to={target}")
    assert not refused.value.retryable
    assert "127.0.0.2" not in refused.value.message  # the kind is the tenant's, not the address
    assert "TUNEPLANE_VOLUME_ALLOWED_NETWORKS" in refused.value.message
    assert metadata.connections == 0


async def test_a_name_that_resolves_to_an_internal_address_is_refused(
    tenant: Tenant, metadata: Listener
) -> None:
    """``localhost`` stands for a name whose DNS answer is internal: the resolver's
    answer is checked, and nothing is connected to."""
    port = tenant.url.rsplit(":", 1)[1]
    fetcher = Fetcher(stall_s=5.0, reach=Reach(), insecure=frozenset({f"localhost:{port}"}))
    with pytest.raises(VolumeFillFailed, match=r"\(loopback\)"):
        await fetched(fetcher, f"http://localhost:{port}/files/w")
    assert tenant.requests == []


async def test_an_ip_literal_the_operator_did_not_list_is_refused(tenant: Tenant) -> None:
    with pytest.raises(VolumeFillFailed, match=r"\(loopback\)"):
        await fetched(fetcher_for(tenant, allowed=[]), f"{tenant.url}/files/w")
    assert tenant.requests == []
    assert await fetched(fetcher_for(tenant), f"{tenant.url}/files/w") == b"weights" * 1000


@pytest.mark.parametrize("to", ["ftp://example.com/w", "https://exa|mple.com/w", "https://127.1/w"])
async def test_a_redirect_to_what_is_no_url_of_a_valid_host_is_refused(
    tenant: Tenant, to: str
) -> None:
    with pytest.raises(VolumeFillFailed, match="names no valid host"):
        await fetched(fetcher_for(tenant), f"{tenant.url}/redir?to={to}")


async def test_a_login_never_follows_a_redirect_to_another_origin(tenant: Tenant) -> None:
    other = Tenant(files={"w": b"mirror"})
    await other.start()
    try:
        url = f"{tenant.url}/redir?to={other.url}/files/w"
        fetcher = fetcher_for(tenant)
        fetcher.insecure |= {other.url.split("://", 1)[1]}
        assert await fetched(fetcher, url, Authorization="Bearer tenant-b") == b"mirror"
    finally:
        await other.close()
    assert tenant.requests[0].headers.get("Authorization") == "Bearer tenant-b"
    assert "Authorization" not in other.requests[0].headers


async def test_a_cookie_one_fill_was_given_never_reaches_another(tenant: Tenant) -> None:
    """Finding 4: tenant B's signed URL sets a session cookie its own fill follows; tenant
    A's fill of the file that cookie guards, in a session of its own, has no cookie."""
    fetcher = fetcher_for(tenant)
    assert await fetched(fetcher, f"{tenant.url}/signed") == b"tenant b's checkpoint"
    with pytest.raises(VolumeFillFailed, match="403"):
        await fetched(fetcher, f"{tenant.url}/mine")


async def test_a_private_ca_is_trusted_for_volume_sources_when_the_operator_names_it(
    tmp_path: Path,
) -> None:
    ca = make_ca(tmp_path, "mirror-ca")
    served = Tenant(cert=make_cert(tmp_path, "mirror", ca, server=True), files={"w": b"w"})
    await served.start()
    try:
        with pytest.raises(VolumeFillFailed, match="certificate"):
            await fetched(fetcher_for(served), f"{served.url}/files/w")
        assert await fetched(fetcher_for(served, ca_file=ca), f"{served.url}/files/w") == b"w"
    finally:
        await served.close()


async def test_a_trickle_is_a_stall_not_progress(tenant: Tenant) -> None:
    """Finding 5: a byte every 0.05 s kept a read alive forever; fewer than a MiB in the
    stall period stalls the download."""
    tenant.trickle_s = 0.05
    fetcher = fetcher_for(tenant)
    fetcher.stall_s = 0.5
    with pytest.raises(VolumeFillFailed, match=f"fewer than {PROGRESS_BYTES} bytes came") as raised:
        await fetched(fetcher, f"{tenant.url}/trickle")
    assert raised.value.retryable  # a fill retries it, counting it as no progress
