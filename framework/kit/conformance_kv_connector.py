"""The conformance kit's KV connector checks (``servelab check-plugin kv_connector=<name>``).

A connector never changes what is computed: tokens it loads must be the KV the engine would have
computed. The stage runs two waves of requests through one engine: the first computes prompts and
ends (a connector may save their blocks), the second continues them as chat turns do (its prompts
start with the first wave's prompt and output tokens), so a connector that stores finds them. The
GPU's prefix cache is off: what the second wave does not compute, the connector loaded.

- on the simulator (``backend=sim``, the tiny_code shape): the connector's protocol only;
- on the tiny random model (``model=tiny``, greedy; skipped with ``--no-real-model``): the same, and
  every token equals the run without a connector (``kv_connector=none``): the loaded bytes are right.

Every call is checked by a wrapper around the plugin: "valid matches" (bounds; asked twice, the same
answer), "every load answered" (each asynchronous load received, each kept request sent, each once,
nothing left at the end), "leaked blocks" (no block held once every request ended), "every request
ends", "outputs". The built-ins that a cluster chooses (``pd_*``) are checked by the cluster tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.core.kinds import KINDS, instantiate
from servelab.core.kv_connector import KVConnector
from servelab.core.kv_connector_plugin import KVConnectorPlugin
from servelab.core.registry import Registry
from servelab.core.request import Request
from servelab.kit.stage_info import StageInfo

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure, KitRun

BLOCK_SIZE, GPU_BLOCKS, FIRST_WAVE = 4, 48, 4
SIM = ("backend=sim", "model=tiny_code")
CLUSTER_CHOSEN = ("pd_sim", "pd_local", "pd_process", "migrate_sim")
# what a built-in needs beside it to have anything to do (a third party's connector needs nothing): the
# tiers hold prefix-cache blocks, so a GPU pool the second wave does not fit makes them serve it
COMPANIONS = {"tiers": ("kv_tiers=host", "kv_tier_policy=write_through", "num_kv_blocks=16"),
              "multi": ("kv_tiers=host", "kv_tier_policy=write_through", "num_kv_blocks=16",
                        "kv_connector.connectors=[tiers]")}


class _Checked(KVConnector):
    """Forwards every call to ``inner`` and records each broken promise in ``problems``."""

    def __init__(self, inner: KVConnector) -> None:
        self.connectors = [inner]  # servelab.kv.connectors.parts sees through it
        self.inner = inner
        self.problems: list[tuple[str, str]] = []
        self.loading: set[str] = set()  # asynchronous loads not reported received yet
        self.kept: set[str] = set()  # kept requests not reported sent yet
        self.loaded_tokens = 0

    def _bad(self, contract: str, message: str) -> None:
        if len(self.problems) < 5:
            self.problems.append((contract, message))

    def get_num_new_matched_tokens(self, seq, num_computed_tokens):
        n, load_async = self.inner.get_num_new_matched_tokens(seq, num_computed_tokens)
        again = self.inner.get_num_new_matched_tokens(seq, num_computed_tokens)
        if (n, load_async) != tuple(again):
            self._bad("valid matches", f"{seq.id}: asked twice, answered {(n, load_async)} then {tuple(again)}")
        if not 0 <= n <= max(0, seq.num_tokens - num_computed_tokens - 1):
            self._bad("valid matches", f"{seq.id}: {n} tokens matched after {num_computed_tokens} computed, of "
                                       f"{seq.num_tokens} (at most {seq.num_tokens - num_computed_tokens - 1})")
        return n, load_async

    def update_state_after_alloc(self, seq, block_ids, num_external_tokens):
        _, load_async = self.inner.get_num_new_matched_tokens(seq, seq.num_computed_tokens)
        if load_async:
            self.loading.add(seq.id)
        self.loaded_tokens += num_external_tokens
        self.inner.update_state_after_alloc(seq, block_ids, num_external_tokens)

    def request_finished(self, seq, block_ids):
        keep = self.inner.request_finished(seq, block_ids)
        if keep:
            self.kept.add(seq.id)
        return keep

    def get_finished(self):
        sent, received = self.inner.get_finished()
        for ids, pending, what in ((sent, self.kept, "sent"), (received, self.loading, "received")):
            for request_id in ids:
                if request_id not in pending:
                    self._bad("every load answered", f"{request_id} reported {what}, but it was not "
                                                     f"{'kept' if what == 'sent' else 'loading'} (or was reported)")
                pending.discard(request_id)
        return sent, received

    def get_step_transfer_time(self):
        return self.inner.get_step_transfer_time()

    def transfer_priced(self, added_s, hidden_s):
        self.inner.transfer_priced(added_s, hidden_s)

    def start_load_kv(self):
        self.inner.start_load_kv()

    def wait_for_load(self):
        self.inner.wait_for_load()

    def save_kv(self):
        self.inner.save_kv()

    def wait_for_save(self):
        self.inner.wait_for_save()


def checked_registry(registry: Registry, name: str, made: list[_Checked]) -> Registry:
    """``registry`` with ``kv_connector=name`` built inside a :class:`_Checked` (each appended to ``made``)."""
    inner = registry.get("kv_connector", name)
    spec = KINDS["kv_connector"]

    class Checked(KVConnectorPlugin):
        Config = inner.Config

        def __new__(cls, config, context):  # type: ignore[misc]
            checked = _Checked(instantiate(spec, inner, config, context))
            made.append(checked)
            return checked

    Checked.name = name
    copy = Registry({kind: dict(names) for kind, names in registry.plugins.items()}, dict(registry.origins),
                    list(registry.broken))
    copy.plugins["kv_connector"][name] = Checked
    return copy


def _first_wave() -> list[Request]:
    prefix = tuple((5 * j) % 97 + 1 for j in range(3 * BLOCK_SIZE))  # shared by every request
    return [Request(f"a{i}", prefix + tuple((11 * i + 3 * j) % 89 + 101 for j in range(2 * BLOCK_SIZE + i)), 5 + i,
                    arrival_time=0.0) for i in range(FIRST_WAVE)]


def _second_wave(first: list[Request], outputs: dict[str, list[int]]) -> list[Request]:
    return [Request(f"b{i}", r.prompt_token_ids + tuple(outputs.get(r.id, ())) + tuple(range(200, 203 + i)), 4,
                    arrival_time=0.0) for i, r in enumerate(first)]


def _run(overrides: tuple[str, ...], registry: Registry, outputs: dict[str, list[int]] | None = None):
    """Both waves on one engine; ``(engine, outputs, second wave)``. ``outputs``: the first wave's outputs
    the second continues (None: this run's own)."""
    from servelab.api import compose  # noqa: PLC0415 - above the kit's core imports
    from servelab.assemble.stack import build_stack  # noqa: PLC0415
    from servelab.run.runner import run_workload  # noqa: PLC0415

    engine = build_stack(compose(list(overrides)), registry).engine
    first = _first_wave()
    run_workload(engine, first)
    engine.poll_connector()  # the sends of the wave's last step: the engine frees their blocks
    mine = {s.id: list(s.output_token_ids) for s in engine.sequences.values()}
    second = _second_wave(first, outputs if outputs is not None else mine)
    run_workload(engine, second)
    engine.poll_connector()
    return engine, {s.id: list(s.output_token_ids) for s in engine.sequences.values()}


def _case(run: "KitRun", label: str, model: tuple[str, ...], tokens: bool) -> "Failure | None":
    from servelab.kit.conformance import Failure, merge_overrides  # noqa: PLC0415 - the kit imports this module

    base = (*model, f"block_size={BLOCK_SIZE}", f"num_kv_blocks={GPU_BLOCKS}", "max_num_seqs=4",
            "max_num_batched_tokens=64", "logger=none", "progress=false")
    plugin = merge_overrides((*base, f"kv_connector={run.name}", *COMPANIONS.get(run.name, ())), run.extra)
    made: list[_Checked] = []
    try:
        reference = None
        if tokens:
            _, reference = _run(base, run.registry)
            first = {k: v for k, v in reference.items() if k.startswith("a")}
            engine, outputs = _run(plugin, checked_registry(run.registry, run.name, made), first)
        else:
            engine, outputs = _run(plugin, checked_registry(run.registry, run.name, made))
    except Exception as exc:  # noqa: BLE001 - the plugin's error is the finding
        return Failure("plugin raised", f"{label}: {type(exc).__name__}: {exc} (run: {' '.join(plugin)})")
    checked = made[0] if made else None
    if checked is None:
        return Failure("plugin raised", f"{label}: kv_connector={run.name} was not built (run: {' '.join(plugin)})")
    if checked.problems:
        return Failure(*checked.problems[0])
    if checked.loading or checked.kept:
        return Failure("every load answered", f"{label}: at the end, loads never reported received: "
                       f"{sorted(checked.loading)}; kept requests never reported sent: {sorted(checked.kept)}")
    unfinished = [s.id for s in engine.sequences.values() if not s.is_finished]
    if unfinished:
        return Failure("every request ends", f"{label}: {unfinished} did not end")
    if engine.allocator.leaked_blocks():
        return Failure("leaked blocks", f"{label}: {engine.allocator.leaked_blocks()} blocks held at the end")
    if tokens and reference is not None:
        for rid, expected in reference.items():
            if outputs.get(rid) != expected:
                return Failure("outputs", f"{label}, {rid}: {outputs.get(rid)} != {expected} (kv_connector=none)")
    run.report.notes.append(f"{label}: {checked.loaded_tokens} prompt tokens loaded through the connector")
    return None


def check_kv_connector(run: "KitRun") -> "Failure | None":
    """The stage (see the module's docstring)."""
    from servelab.kit.conformance import REAL_MODEL  # noqa: PLC0415

    if run.name in CLUSTER_CHOSEN:
        run.report.notes.append(f"kv_connector={run.name} is chosen by a cluster (cluster.prefill_replicas=...): "
                                "tests/test_kv_connector_kind.py and the cluster tests run it")
        return None
    failure = _case(run, "simulator", SIM, tokens=False)
    run.report.cases = 1
    if failure is not None or not run.real_model:
        if not run.real_model:
            run.report.notes.append("real-model check skipped")
        return failure
    run.report.real_model = True
    run.report.cases = 2
    return _case(run, "real model (model=tiny, greedy)", REAL_MODEL, tokens=True)


check_kv_connector.stage_info = StageInfo(  # type: ignore[attr-defined]
    "two waves through the connector", "2 (the simulator, the real model)", False,
    f"{FIRST_WAVE} requests sharing a prefix end, then {FIRST_WAVE} chat turns continue them on the same engine "
    f"({GPU_BLOCKS} GPU blocks of {BLOCK_SIZE} tokens, no prefix cache): every match in bounds and side-effect "
    "free, every load received and every kept request sent once, no block held, every request ends; on the real "
    "model tokens equal `kv_connector=none`'s", real_model=True)
