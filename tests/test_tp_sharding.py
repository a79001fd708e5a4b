"""Tensor-parallel sharding without processes: the loader's slices, and TP=2/4 forwards run by threads.

The loader test checks each rank's weights against the checkpoint's tensors; the thread test runs
every rank of a group in one process (collectives over a barrier) and compares the logits with
TP=1, which covers KV heads split (tp <= kv heads), replicated (tp > kv heads) and odd vocabularies
far faster than spawning 4 processes.
"""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import load_file

from servelab.exec import executor as executor_module
from servelab.core.batch import StepBatch
from servelab.exec.executor import ModelWorker, WorkerConfig
from servelab.exec.model.layers import TPGroup
from servelab.exec.model.loader import load_model
from servelab.exec.model.random_checkpoint import write_random_checkpoint
from servelab.exec.tp_comm import pack_batch, unpack_batch

HEADS, HEAD_DIM = 8, 8
SHAPE = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=96, num_hidden_layers=2, num_attention_heads=HEADS,
             max_position_embeddings=128, initializer_range=0.3)
MODELS = {
    "llama-2kv-odd-vocab": ("LlamaForCausalLM", dict(num_key_value_heads=2, vocab_size=1001)),
    "llama-1kv-tied": ("LlamaForCausalLM", dict(num_key_value_heads=1, vocab_size=998, tie_word_embeddings=True)),
    "qwen2-4kv-bias": ("Qwen2ForCausalLM", dict(num_key_value_heads=4, vocab_size=1003)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("shard_models")
    return {name: write_random_checkpoint(root / name, arch, seed=5, **SHAPE, **extra)
            for name, (arch, extra) in MODELS.items()}


def _kv_heads_of_rank(rank: int, size: int, kv: int) -> list[int]:
    if size <= kv:
        per = kv // size
        return list(range(rank * per, (rank + 1) * per))
    return [rank // (size // kv)]  # replicated: ranks sharing a KV head hold the same one


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_loads_exactly_its_slice(checkpoints, name, size):
    path = checkpoints[name]
    full = {k.removeprefix("model."): v for k, v in load_file(str(next(path.glob("*.safetensors")))).items()}
    kv = MODELS[name][1]["num_key_value_heads"]
    vocab = MODELS[name][1]["vocab_size"]
    heads, inter, shard = HEADS // size, SHAPE["intermediate_size"] // size, -(-vocab // size)
    for rank in range(size):
        model = load_model(path, TPGroup(rank, size), torch.float32, torch.device("cpu"), 128)
        params = dict(model.named_parameters())
        kv_rows = torch.cat([torch.arange(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in _kv_heads_of_rank(rank, size, kv)])
        q_rows = slice(rank * heads * HEAD_DIM, (rank + 1) * heads * HEAD_DIM)
        cols = slice(rank * inter, (rank + 1) * inter)
        for layer in range(SHAPE["num_hidden_layers"]):
            pre = f"layers.{layer}."
            attn = pre + "self_attn."
            for kind in ("weight", "bias") if "qwen2" in name else ("weight",):
                expected = torch.cat([full[f"{attn}q_proj.{kind}"][q_rows], full[f"{attn}k_proj.{kind}"][kv_rows],
                                      full[f"{attn}v_proj.{kind}"][kv_rows]])
                assert torch.equal(params[f"{attn}qkv_proj.{kind}"], expected), (rank, kind)
            assert torch.equal(params[f"{attn}o_proj.weight"], full[f"{attn}o_proj.weight"][:, q_rows])
            mlp = pre + "mlp."
            assert torch.equal(params[f"{mlp}gate_up_proj.weight"],
                               torch.cat([full[f"{mlp}gate_proj.weight"][cols], full[f"{mlp}up_proj.weight"][cols]]))
            assert torch.equal(params[f"{mlp}down_proj.weight"], full[f"{mlp}down_proj.weight"][:, cols])
            assert torch.equal(params[f"{pre}input_layernorm.weight"], full[f"{pre}input_layernorm.weight"])
        rows = full["embed_tokens.weight"][rank * shard:(rank + 1) * shard]
        embed = params["embed_tokens.weight"]
        assert embed.shape[0] == shard
        assert torch.equal(embed[:rows.shape[0]], rows) and not embed[rows.shape[0]:].any()  # padding is zero
        if "lm_head.weight" in params:
            head = params["lm_head.weight"]
            assert torch.equal(head[:rows.shape[0]], full["lm_head.weight"][rank * shard:(rank + 1) * shard])


class ThreadGroup:
    """Collectives between threads of one process (a stand-in for torch.distributed in tests)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[torch.Tensor | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)

    def _exchange(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = t.clone()
        self.barrier.wait()
        parts = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return parts

    def group(self, rank: int) -> TPGroup:
        def all_reduce(t):
            parts = self._exchange(rank, t)
            t.copy_(sum(parts[1:], parts[0].clone()))
            return t

        return TPGroup(rank, self.size, all_reduce, lambda t: torch.cat(self._exchange(rank, t), dim=-1))


def _batches() -> list[StepBatch]:
    """Two sequences prefilled together, then two decode steps (block size 8, blocks 0-3 and 4-7)."""
    def batch(chunks, starts):
        ids, pos, slots, ctx, tables = [], [], [], [], []
        for seq, (chunk, start) in enumerate(zip(chunks, starts)):
            table = [4 * seq + i for i in range(4)]
            p = list(range(start, start + len(chunk)))
            ids += chunk
            pos += p
            slots += [table[x // 8] * 8 + x % 8 for x in p]
            ctx.append(start + len(chunk))
            tables.append(table)
        cu = [0, len(chunks[0]), len(chunks[0]) + len(chunks[1])]
        return StepBatch(torch.tensor(ids), torch.tensor(pos), torch.tensor(slots), torch.tensor(tables, dtype=torch.int32),
                         torch.tensor(cu, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32),
                         max(map(len, chunks)), max(ctx), torch.tensor([cu[1] - 1, cu[2] - 1]), [None, None], [0, 0])

    a, b = list(range(3, 20)), list(range(500, 509))
    return [batch([a, b], [0, 0]), batch([[7], [9]], [17, 9]), batch([[11], [13]], [18, 10])]


def _logits_by_rank(path, size: int) -> dict[int, list[torch.Tensor]]:
    cfg = WorkerConfig(str(path), "float32", "cpu", "torch", 8, 128, 8, 0.1, 0.9, 0, 0)
    group = ThreadGroup(size)
    logits: dict[int, list[torch.Tensor]] = {r: [] for r in range(size)}
    errors = []

    def run(rank):
        try:
            worker = ModelWorker(cfg, group.group(rank))
            worker.allocate_kv_cache(8)
            for b in _batches():
                worker.execute(b)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            group.barrier.abort()

    original = executor_module.sample_and_verify

    def recording_sample(rows, batch):
        logits[int(threading.current_thread().name)].append(rows.clone())
        return original(rows, batch)

    executor_module.sample_and_verify = recording_sample
    try:
        threads = [threading.Thread(target=run, args=(r,), name=str(r)) for r in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        executor_module.sample_and_verify = original
    if errors:
        raise errors[0]
    return logits


@pytest.fixture
def one_thread():
    """Ranks run as threads: keep torch from oversubscribing the cores meanwhile."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("size", [2, 4])
def test_sharded_forward_matches_tp1_logits(checkpoints, name, size, one_thread):
    reference = _logits_by_rank(checkpoints[name], 1)[0]
    sharded = _logits_by_rank(checkpoints[name], size)
    for rank in range(size):
        for step, (got, want) in enumerate(zip(sharded[rank], reference)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"rank {rank} step {step}")


def test_plan_packing_round_trips_every_field():
    batch = _batches()[0]
    batch.swap_out, batch.swap_in, batch.copy_blocks = [(1, 2)], [(3, 4)], [(5, 6), (7, 8)]
    ints, floats, meta = pack_batch(batch)
    again = unpack_batch(ints, floats, meta)
    for field in batch.__dataclass_fields__:
        a, b = getattr(batch, field), getattr(again, field)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), field
        else:
            assert a == b, field
