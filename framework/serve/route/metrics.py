"""``GET /metrics`` of ``servelab route``: the router's own Prometheus metrics (docs/route.md has the
table). Per backend (label ``backend`` = its URL): requests forwarded and how they ended, errors by
kind, latency to the first byte and to the end, in-flight requests, up/down, draining; per router plugin: its
decisions and its failures. Each router has its own registry (tests run several in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported for the app

from servelab.serve.metrics import E2E_BUCKETS, TTFT_BUCKETS


class RouteMetrics:
    def __init__(self, router_name: str, backend_urls: list[str]) -> None:
        self.registry = r = CollectorRegistry()
        self.router_name = router_name
        self.requests = Counter("servelab:route_requests", "Requests forwarded to a backend, by how they ended "
                                "(ok, error: the backend failed, cancelled: the client left).",
                                ["backend", "outcome"], registry=r)
        self.errors = Counter("servelab:route_backend_errors", "Backend failures by kind (connect: no answer; "
                              "stream: died mid-answer; status: answered 5xx).", ["backend", "kind"], registry=r)
        self.retries = Counter("servelab:route_retries", "Requests sent to another backend after one failed before "
                               "streaming anything.", registry=r)
        self.decisions = Counter("servelab:route_decisions", "Placements the router plugin chose, by backend.",
                                 ["router", "backend"], registry=r)
        self.router_errors = Counter("servelab:route_router_errors", "Requests answered 500 because the router "
                                     "plugin raised or returned an invalid index.", ["router"], registry=r)
        self.first_byte = Histogram("servelab:route_first_byte_seconds", "Receipt to the backend's first byte "
                                    "(streaming: its first event).", ["backend"], buckets=TTFT_BUCKETS, registry=r)
        self.latency = Histogram("servelab:route_request_latency_seconds", "Receipt to the end of the answer.",
                                 ["backend"], buckets=E2E_BUCKETS, registry=r)
        self.in_flight = Gauge("servelab:route_in_flight", "Requests placed on the backend and not yet ended.",
                               ["backend"], registry=r)
        self.up = Gauge("servelab:route_backend_up", "1 while the backend passes its health checks.", ["backend"],
                        registry=r)
        self.draining = Gauge("servelab:route_backend_draining", "1 while the backend is drained or draining "
                              "(it takes no new request; its in-flight ones finish).", ["backend"], registry=r)
        for url in backend_urls:
            self.up.labels(url).set(1)
            self.in_flight.labels(url).set(0)
            self.draining.labels(url).set(0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
