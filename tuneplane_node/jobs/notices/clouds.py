"""The clouds' metadata services, read for notices: AWS, GCP and Azure, each by its own
documented endpoints, headers and tokens.

- **AWS** (IMDSv2): a session token (``PUT /latest/api/token``, kept six hours, asked
  again on a 401), then ``/latest/meta-data/spot/instance-action`` (a spot instance's
  2 minutes: ``{"action", "time"}``), ``events/recommendations/rebalance`` (advice, no
  deadline: cordon only) and ``events/maintenance/scheduled`` (a reboot, stop or
  retirement by ``NotBefore``). A 404 is "no notice".
- **GCP**: ``/computeMetadata/v1/instance/?recursive=true`` with ``Metadata-Flavor:
  Google``, waited on (``wait_for_change`` with the last ``ETag``): ``preempted``
  (``TRUE``: 30 s), ``maintenanceEvent`` (``TERMINATE_ON_HOST_MAINTENANCE``: a GPU VM
  cannot migrate and gets an hour; ``upcomingMaintenance``'s window where it says one;
  ``MIGRATE_ON_HOST_MAINTENANCE``: cordon only; ``NONE`` again withdraws it).
- **Azure**: ``/metadata/scheduledevents`` with ``Metadata: true``: ``Preempt``,
  ``Terminate``, ``Reboot`` and ``Redeploy`` end the jobs by ``NotBefore`` (``Freeze``, a
  pause of seconds, only cordons), for this VM (its name asked once); an event is
  acknowledged (``StartRequests``) once the drain it made has ended, where the operator
  allows (`acknowledge`).

Each reader's `read` answers the notices standing now, raising `VolumeFillFailed` (the
fetcher's) or `MetadataRefused` when the service does not answer as documented: the
watcher backs off and invents no notice. Pure protocol: no loop, no state of the node.
"""

from __future__ import annotations

import email.utils
import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from tuneplane_node.clock import Clock, parse_rfc3339
from tuneplane_node.fetch.fetching import Answer, Session
from tuneplane_node.jobs.words.notices import MAINTENANCE, PREEMPT, REBALANCE, TERMINATE, Notice

log = logging.getLogger(__name__)
MAX_ANSWER = 2**20
AWS_BASE = GCP_BASE = AZURE_BASE = "http://169.254.169.254"
AWS_TOKEN_S = 21600
GCP_WAIT_S = 60  # a long poll's own deadline (the service answers by then, changed or not)
GCP_PREEMPT_S = 30.0  # a preempted GCP VM's notice
GCP_GPU_MAINTENANCE_S = 3600.0  # a GPU VM's notice of host maintenance it cannot migrate
AZURE_API = "api-version=2020-07-01"
AZURE_ENDS = {"Preempt": PREEMPT, "Terminate": TERMINATE, "Reboot": MAINTENANCE,
              "Redeploy": MAINTENANCE}  # fmt: skip
AWS_ENDS = frozenset({"instance-reboot", "system-reboot", "instance-stop", "instance-retirement"})


class MetadataRefused(Exception):
    """The metadata service answered, but not as documented (a status, garbage)."""


class Reader(Protocol):
    """One cloud's notices: ``waits``: its `read` waits for a change (a long poll);
    ``base``: the metadata service's URL."""

    name: str
    waits: bool
    base: str

    async def read(self, http: Session) -> list[Notice]: ...


class AwsReader:
    name, waits = "aws", False

    def __init__(self, base: str, *, clock: Clock) -> None:
        self.base = base
        self.clock = clock
        self._token: tuple[str, float] | None = None  # the token, and when to renew it

    async def read(self, http: Session) -> list[Notice]:
        spot = await self._get(http, "/latest/meta-data/spot/instance-action")
        rebalance = await self._get(http, "/latest/meta-data/events/recommendations/rebalance")
        scheduled = await self._get(http, "/latest/meta-data/events/maintenance/scheduled")
        return [*_aws_spot(spot), *_aws_rebalance(rebalance), *_aws_scheduled(scheduled)]

    async def _get(self, http: Session, path: str) -> Any:
        """The JSON at ``path``; None for a 404 (no notice)."""
        answer = await self._asked(http, path)
        if answer.status == 401:  # the token lapsed early: a new one, once
            self._token = None
            answer = await self._asked(http, path)
        if answer.status == 404:
            return None
        return _json(answer, path)

    async def _asked(self, http: Session, path: str) -> Answer:
        headers = {"X-aws-ec2-metadata-token": await self._session_token(http)}
        return await http.request("GET", self.base + path, headers=headers, limit=MAX_ANSWER)

    async def _session_token(self, http: Session) -> str:
        now = self.clock.monotonic()
        if self._token is None or self._token[1] <= now:
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_S)}
            answer = await http.request(
                "PUT", f"{self.base}/latest/api/token", headers=ttl, limit=MAX_ANSWER
            )
            if answer.status != 200 or not answer.body:
                raise MetadataRefused(f"its token service answered {answer.status}")
            self._token = (answer.body.decode("ascii", "replace"), now + AWS_TOKEN_S - 60)
        return self._token[0]


def _aws_spot(document: Any) -> list[Notice]:
    if not isinstance(document, dict) or document.get("action") not in (
        "terminate", "stop", "hibernate",
    ):  # fmt: skip
        return []
    deadline = parse_rfc3339(str(document.get("time") or ""))
    action = str(document["action"])
    return [Notice("aws", PREEMPT, f"aws spot {action} {document.get('time')}", True,
                   deadline, f"spot {action}")]  # fmt: skip


def _aws_rebalance(document: Any) -> list[Notice]:
    if not isinstance(document, dict) or not document.get("noticeTime"):
        return []
    key = f"aws rebalance {document['noticeTime']}"
    return [Notice("aws", REBALANCE, key, False, None, "rebalance recommendation")]


def _aws_scheduled(document: Any) -> list[Notice]:
    found = []
    for event in document if isinstance(document, list) else []:
        if not isinstance(event, dict) or event.get("State", "active") != "active":
            continue
        code = str(event.get("Code", ""))
        deadline = _aws_time(str(event.get("NotBefore", "")))
        key = f"aws {event.get('EventId') or code} {event.get('NotBefore')}"
        found.append(Notice("aws", MAINTENANCE, key, code in AWS_ENDS, deadline, code))
    return found


def _aws_time(text: str) -> datetime | None:
    """``21 Jan 2019 09:00:43 GMT``, as AWS's maintenance events say a time."""
    try:
        return datetime.strptime(text, "%d %b %Y %H:%M:%S %Z").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


class GcpReader:
    name, waits = "gcp", True

    def __init__(self, base: str, *, clock: Clock) -> None:
        self.base = base
        self.clock = clock
        self._etag = "0"
        self._since: dict[str, datetime] = {}  # a notice's first sight: its deadline's start

    async def read(self, http: Session) -> list[Notice]:
        url = (
            f"{self.base}/computeMetadata/v1/instance/?recursive=true&wait_for_change=true"
            f"&timeout_sec={GCP_WAIT_S}&last_etag={self._etag}"
        )
        headers = {"Metadata-Flavor": "Google"}
        answer = await http.request("GET", url, headers=headers, limit=MAX_ANSWER)
        document = _json(answer, "/computeMetadata/v1/instance/")
        if not isinstance(document, dict):
            raise MetadataRefused("its instance document is not a JSON object")
        self._etag = answer.headers.get("ETag", self._etag)
        return self._notices(document)

    def _notices(self, document: Mapping[str, Any]) -> list[Notice]:
        found = []
        if str(document.get("preempted", "")).upper() == "TRUE":
            found.append(self._noticed("gcp preempted", PREEMPT, GCP_PREEMPT_S, "preempted"))
        event = str(document.get("maintenanceEvent", "NONE"))
        if event.startswith("TERMINATE"):
            window = _gcp_window(document.get("upcomingMaintenance"))
            notice = self._noticed(f"gcp {event}", MAINTENANCE, GCP_GPU_MAINTENANCE_S, event)
            found.append(notice if window is None else _at(notice, window))
        elif event.startswith("MIGRATE"):
            found.append(Notice("gcp", MAINTENANCE, f"gcp {event}", False, None, event))
        self._since = {k: v for k, v in self._since.items() if k in {n.key for n in found}}
        return found

    def _noticed(self, key: str, kind: str, notice_s: float, detail: str) -> Notice:
        """A notice whose deadline is its first sight plus the cloud's notice time."""
        first = self._since.setdefault(key, self.clock.now())
        return Notice("gcp", kind, key, True, first + timedelta(seconds=notice_s), detail)


def _gcp_window(upcoming: Any) -> datetime | None:
    if not isinstance(upcoming, dict):
        return None
    return parse_rfc3339(str(upcoming.get("windowStartTime") or ""))


def _at(notice: Notice, deadline: datetime) -> Notice:
    return Notice(notice.source, notice.kind, notice.key, True, deadline, notice.detail)


class AzureReader:
    name, waits = "azure", False

    def __init__(self, base: str, *, clock: Clock) -> None:
        self.base = base
        self.clock = clock
        self._vm: str | None = None

    async def read(self, http: Session) -> list[Notice]:
        vm = await self._name(http)
        answer = await http.request(
            "GET", f"{self.base}/metadata/scheduledevents?{AZURE_API}",
            headers={"Metadata": "true"}, limit=MAX_ANSWER,
        )  # fmt: skip
        document = _json(answer, "/metadata/scheduledevents")
        events = document.get("Events") if isinstance(document, dict) else None
        if not isinstance(events, list):
            raise MetadataRefused("its scheduled events have no Events list")
        return [notice for event in events if (notice := _azure(event, vm)) is not None]

    async def _name(self, http: Session) -> str:
        if self._vm is None:
            url = f"{self.base}/metadata/instance/compute/name?api-version=2021-02-01&format=text"
            answer = await http.request("GET", url, headers={"Metadata": "true"}, limit=MAX_ANSWER)
            if answer.status != 200:
                raise MetadataRefused(f"its instance name answered {answer.status}")
            self._vm = answer.body.decode("utf-8", "replace").strip()
        return self._vm

    async def acknowledge(self, http: Session, notice: Notice) -> None:
        """Start the event early: the drain it made has ended."""
        event = notice.key.removeprefix("azure ")
        body = json.dumps({"StartRequests": [{"EventId": event}]}).encode()
        answer = await http.request(
            "POST", f"{self.base}/metadata/scheduledevents?{AZURE_API}",
            headers={"Metadata": "true", "Content-Type": "application/json"},
            limit=MAX_ANSWER, body=body,
        )  # fmt: skip
        if answer.status not in (200, 204):
            raise MetadataRefused(f"its acknowledgement answered {answer.status}")


def _azure(event: Any, vm: str) -> Notice | None:
    if not isinstance(event, dict) or event.get("ResourceType", "VirtualMachine") != (
        "VirtualMachine"
    ):
        return None
    resources = event.get("Resources")
    if isinstance(resources, list) and resources and vm not in resources:
        return None
    kind_word = str(event.get("EventType", ""))
    deadline = _azure_time(str(event.get("NotBefore") or ""))
    key = f"azure {event.get('EventId')}"
    if kind_word in AZURE_ENDS:
        return Notice("azure", AZURE_ENDS[kind_word], key, True, deadline, kind_word)
    if kind_word == "Freeze":
        return Notice("azure", MAINTENANCE, key, False, deadline, kind_word)
    return None


def _azure_time(text: str) -> datetime | None:
    """``Mon, 19 Sep 2016 18:29:47 GMT`` (RFC 1123), as Azure says a time."""
    try:
        return email.utils.parsedate_to_datetime(text) if text else None
    except (TypeError, ValueError):
        return None


def _json(answer: Answer, path: str) -> Any:
    if answer.status != 200:
        raise MetadataRefused(f"{path} answered {answer.status}")
    try:
        return json.loads(answer.body)
    except ValueError:
        raise MetadataRefused(f"{path} answered no JSON") from None


def reader_of(cloud: str, base: str | None, *, clock: Clock) -> Reader:
    """The reader of ``cloud``'s notices, at ``base`` (None: the cloud's own address)."""
    if cloud == "aws":
        return AwsReader(base or AWS_BASE, clock=clock)
    if cloud == "gcp":
        return GcpReader(base or GCP_BASE, clock=clock)
    return AzureReader(base or AZURE_BASE, clock=clock)


DMI = "/sys/class/dmi/id"
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


def detected(dmi: str = DMI) -> str | None:
    """The cloud this machine says it runs on (its DMI identity), None elsewhere."""
    vendor, product, asset = (_dmi(dmi, name) for name in ("sys_vendor", "product_name",
                                                           "chassis_asset_tag"))  # fmt: skip
    if "amazon" in vendor.lower() or product.lower().startswith("amazon ec2"):
        return "aws"
    if "google" in vendor.lower() or product == "Google Compute Engine":
        return "gcp"
    if asset == AZURE_ASSET_TAG:
        return "azure"
    return None


def _dmi(directory: str, name: str) -> str:
    try:
        with open(f"{directory}/{name}") as file:
            return file.read().strip()
    except OSError:
        return ""
