"""The backends behind ``servelab route``: who they are, whether they are up, and what a router may
see of each (:class:`servelab.core.interfaces.ReplicaView`). A :class:`Backend` is the cluster
protocol's record of a replica (:class:`servelab.cluster.protocol.ReplicaRecord`), as the
simulator's and the engine processes' replicas are, so its view is made the same way.

A view is filled from two sources. The router's own counts: requests it placed on a backend and has
not yet seen end (``num_outstanding``) and their prompt + ``max_tokens`` (``outstanding_tokens``),
exact at every decision. The backend's ``/metrics`` (vLLM's names, which ``servelab serve`` and vLLM
both export): ``vllm:num_requests_waiting`` (+ ``..._swapped``), ``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc`` (or ``vllm:gpu_cache_usage_perc``) and ``vllm:cache_config_info``'s
``block_size`` / ``num_gpu_blocks`` labels, read in the background every ``route.refresh_interval_s``:
a view's gauges are at most that old. A backend without them (no ``/metrics``, other names) shows
zeros there, and ``block_size`` 16 / ``num_kv_blocks`` 0. ``can_hold`` is false for a backend that
is down (a failed health check or a failed request; ``/health`` every ``route.health_interval_s``
brings it back) and, when the prompt was tokenized with the backends' own tokenizer, for one whose
``max_model_len`` (from ``/v1/models``) is below prompt + ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servelab.cluster.protocol import Gauges, ReplicaRecord
from servelab.core.errors import ConfigError
from servelab.core.request import Request

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 5.0  # one start-up, health or metrics call


@dataclass
class Backend(ReplicaRecord):
    """One OpenAI-compatible server and the router's record of it (a mixed replica of the protocol).
    ``checks_length``: the router counts prompts in the backends' own tokens, so a request longer
    than ``max_model_len`` cannot go here."""

    url: str  # no trailing slash
    model: str  # the first id of its /v1/models
    owned_by: str = ""
    max_model_len: int | None = None
    up: bool = True
    num_kv_blocks: int = 0
    block_size: int = 16
    has_metrics: bool = False
    checks_length: bool = False

    @property
    def outstanding(self) -> int:
        """Requests the router placed here and has not seen end."""
        return self.num_outstanding

    def can_hold(self, request: Request, tokens: int | None = None) -> bool:
        fits = (not self.checks_length or self.max_model_len is None
                or request.prompt_len + request.max_tokens <= self.max_model_len)
        return self.up and fits

    def kv_pool(self) -> tuple[int, int]:
        return self.num_kv_blocks, self.block_size

    def read_metrics(self, text: str) -> None:
        """Take the gauges of a ``/metrics`` page (absent ones stay as they were)."""
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:cache_config_info":
                    self.block_size = int(float(sample.labels.get("block_size", self.block_size)))
                    self.num_kv_blocks = int(float(sample.labels.get("num_gpu_blocks", self.num_kv_blocks) or 0))
                else:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
        if "vllm:num_requests_running" in values:
            self.has_metrics = True
            self.gauges = Gauges(
                int(values.get("vllm:num_requests_waiting", 0) + values.get("vllm:num_requests_swapped", 0)),
                int(values["vllm:num_requests_running"]),
                float(values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc", 0.0))))


def probe_backend(index: int, url: str, client: httpx.Client) -> Backend:
    """The backend at ``url`` as it answers now; :class:`ConfigError` naming it when it is not an
    OpenAI-compatible server (unreachable, or no ``/v1/models`` list)."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"route.backends: {url!r} is not an http:// or https:// URL")
    try:
        answer = client.get(f"{url}/v1/models", timeout=CHECK_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ConfigError(f"route.backends: {url} is unreachable ({type(exc).__name__}: {exc})") from None
    try:
        if answer.status_code != 200:
            raise ValueError(answer.status_code)
        first = answer.json()["data"][0]
        model = str(first["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigError(f"route.backends: {url} is not an OpenAI-compatible server (GET /v1/models answered "
                          f"{answer.status_code} without a list of models)") from None
    backend = Backend(index, url, model, str(first.get("owned_by", "")), first.get("max_model_len"))
    try:
        page = client.get(f"{url}/metrics", timeout=CHECK_TIMEOUT_S)
        if page.status_code == 200:
            backend.read_metrics(page.text)
    except (httpx.HTTPError, ValueError):
        pass  # no metrics: its views carry the router's own counts only
    return backend


def probe_backends(urls: list[str]) -> list[Backend]:
    with httpx.Client() as client:
        return [probe_backend(i, url, client) for i, url in enumerate(urls)]


class BackendPool:
    """The backends, their HTTP client, and the background loop that keeps their gauges and health.
    Everything runs on the router's event loop: no locks."""

    def __init__(self, backends: list[Backend], refresh_interval_s: float, health_interval_s: float,
                 request_timeout_s: float, on_health=None) -> None:
        self.backends = backends
        self.refresh_interval_s, self.health_interval_s = refresh_interval_s, health_interval_s
        self.timeout = httpx.Timeout(request_timeout_s, connect=CHECK_TIMEOUT_S)
        self.on_health = on_health  # (backend) -> None, after its up/down state may have changed
        self.client: httpx.AsyncClient | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(timeout=self.timeout, limits=limits)
        self._task = asyncio.create_task(self._refresh_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.client is not None:
            await self.client.aclose()

    def mark_down(self, backend: Backend) -> None:
        if backend.up:
            log.warning("servelab route: backend %s is down", backend.url)
        backend.up = False
        if self.on_health:
            self.on_health(backend)

    async def _refresh_loop(self) -> None:
        since_health = self.health_interval_s  # check at once
        step = max(0.01, min(self.refresh_interval_s, self.health_interval_s))
        while True:
            health = since_health >= self.health_interval_s
            await asyncio.gather(*(self._refresh(b, health) for b in self.backends))
            since_health = 0.0 if health else since_health + step
            await asyncio.sleep(step)

    async def _refresh(self, backend: Backend, health: bool) -> None:
        assert self.client is not None
        short = httpx.Timeout(CHECK_TIMEOUT_S)
        if health:
            try:
                answer = await self.client.get(f"{backend.url}/health", timeout=short)
                if answer.status_code == 404:  # a server without /health: its model list will do
                    answer = await self.client.get(f"{backend.url}/v1/models", timeout=short)
                up = answer.status_code == 200
            except httpx.HTTPError:
                up = False
            if up != backend.up:
                log.warning("servelab route: backend %s is %s", backend.url, "up" if up else "down")
            backend.up = up
            if self.on_health:
                self.on_health(backend)
        if backend.up:
            try:
                page = await self.client.get(f"{backend.url}/metrics", timeout=short)
                if page.status_code == 200:
                    backend.read_metrics(page.text)
            except (httpx.HTTPError, ValueError):
                pass  # a slow or missing metrics page is no reason to stop routing there
