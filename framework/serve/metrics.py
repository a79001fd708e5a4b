"""``GET /metrics``: the server's Prometheus metrics, under vLLM's names where vLLM has one.

Every figure comes from what the run's result files record: latencies from the same
:func:`servelab.results.metrics.request_record` that writes ``requests.jsonl`` (observed when a request
ends), gauges and counters from the engine's step records. The table of names and definitions is
in ``docs/serve.md``. Each server has its own registry (tests run several in one process).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported for the app

from servelab.results.metrics import request_record

disable_created_metrics()  # no *_created series (as vLLM): they only double the page

# vLLM's buckets, so dashboards built for vLLM read these the same way
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServeMetrics:
    """The collectors, fed by the engine thread (prometheus_client is thread-safe)."""

    def __init__(self, model_name: str, ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> None:
        self.registry = CollectorRegistry()
        self.slo = (ttft_slo_ms, tpot_slo_ms)
        r, label = self.registry, ["model_name"]

        def gauge(name, doc):
            return Gauge(name, doc, label, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, label, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, label, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.swapped = gauge("vllm:num_requests_swapped", "Requests swapped to the host pool.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.gpu_cache_usage = gauge("vllm:gpu_cache_usage_perc", "Same as vllm:kv_cache_usage_perc (vLLM v0 name).")
        self.prefix_hit_rate = gauge("vllm:gpu_prefix_cache_hit_rate",
                                     "Prompt tokens served from the prefix cache / prompt tokens, since start.")
        self.spec_rate = gauge("vllm:spec_decode_draft_acceptance_rate",
                               "Accepted draft tokens / draft tokens verified, since start.")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions (recompute and swap).")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of ended requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.success = Counter("vllm:request_success", "Ended requests by finish reason (stop, length, abort).",
                               ["model_name", "finished_reason"], registry=r)
        self.refused = Counter("servelab:requests_refused", "HTTP requests refused before reaching the engine, "
                               "by status code (400 invalid, 401 no key, 413 too large, 503 busy).",
                               ["model_name", "code"], registry=r)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token (first token - arrival).",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gaps between consecutive output tokens.",
                             ITL_BUCKETS)
        self.itl_v0 = histogram("vllm:time_per_output_token_seconds",
                                "Same observations as vllm:inter_token_latency_seconds (vLLM v0 name).", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per request: (last token - first token) / (output tokens - 1).", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Last token - arrival.", E2E_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "First scheduled - arrival.", E2E_BUCKETS)
        self.model_name = model_name
        self._prompt = self._cached = self._drafts = self._accepted = 0

    # ---- fed by the engine thread -------------------------------------------------------------
    def on_step(self, record, queues: dict[str, int], kv_usage: float) -> None:
        self.on_queues(queues, kv_usage)
        if record.preempted:
            self.preemptions.inc(len(record.preempted))
        if record.draft_tokens:
            self._drafts += record.draft_tokens
            self._accepted += record.accepted_tokens
            self.draft_tokens.inc(record.draft_tokens)
            self.accepted_tokens.inc(record.accepted_tokens)
            self.spec_rate.set(self._accepted / self._drafts)

    def on_queues(self, queues: dict[str, int], kv_usage: float) -> None:
        self.running.set(queues.get("running", 0))
        self.waiting.set(queues.get("waiting", 0))
        self.swapped.set(queues.get("swapped", 0))
        self.kv_usage.set(kv_usage)
        self.gpu_cache_usage.set(kv_usage)

    def on_end(self, seq) -> None:
        """A request ended (finished, stopped, aborted): its latencies as ``requests.jsonl`` has them."""
        rec = request_record(seq, 1.0, *self.slo)
        if rec["rejected_reason"] is not None:
            return
        self.success.labels(self.model_name, rec["finish_reason"]).inc()
        self.generation_tokens.inc(rec["output_len"])
        self.prompt_tokens.inc(rec["prompt_len"])
        self._prompt += rec["prompt_len"]
        self._cached += rec["num_cached_prompt_tokens"]
        self.prefix_queries.inc(rec["prompt_len"])
        self.prefix_hits.inc(rec["num_cached_prompt_tokens"])
        self.prefix_hit_rate.set(self._cached / self._prompt if self._prompt else 0.0)
        if rec["finish_reason"] == "abort":  # as in summary.json: no latencies of requests left early
            return
        if rec["ttft_ms"] is not None:
            self.ttft.observe(rec["ttft_ms"] / 1e3)
            self.e2e.observe(rec["e2e_ms"] / 1e3)
        if rec["queue_ms"] is not None:
            self.queue.observe(rec["queue_ms"] / 1e3)
        if rec["output_len"] > 1:
            self.tpot.observe(rec["tpot_ms"] / 1e3)
        for gap in rec["itl_ms"]:
            self.itl.observe(gap / 1e3)
            self.itl_v0.observe(gap / 1e3)

    def cache_config(self, block_size: int, num_blocks: int) -> None:
        """vLLM's ``vllm:cache_config_info`` (value 1, the facts in labels): what ``servelab route``
        puts in its views' ``block_size`` and ``num_kv_blocks``."""
        Gauge("vllm:cache_config_info", "The KV cache's configuration (labels; value 1).",
              ["model_name", "block_size", "num_gpu_blocks"], registry=self.registry).labels(
            self.model_name, str(block_size), str(num_blocks)).set(1)

    def refused_request(self, code: int) -> None:
        self.refused.labels(self.model_name, str(code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
