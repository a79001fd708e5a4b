"""One-command GPU check of the Triton paged-cache kernels (a few minutes on one GPU).

    python experiments/gpu_check_kernels.py            # CUDA: Triton kernels vs the torch reference
    python experiments/gpu_check_kernels.py --device cpu --backend torch --batch 2 --max-context 64 \\
        --heads 4 --kv-heads 2 --head-dim 16           # dry run of the script itself

1. Correctness: ``store_kv`` (with ``-1`` slots) must match the reference exactly; ``paged_attention``
   on ragged decode batches (single pass and split-K), chunked prefill after cached tokens and mixed
   prefill/decode batches, with shuffled and shared physical blocks, must match the reference run in
   fp32 within a dtype tolerance.
2. Bandwidth: decode attention at uniform context lengths, as bytes of K+V read per second and as a
   fraction of the device's copy bandwidth (a large device-to-device copy, read + write bytes), for
   the Triton kernel, the torch paged reference and torch SDPA over a contiguous cache.

Prints two tables (``--out DIR`` also writes them to ``DIR/kernels.md`` and, as numbers, to
``DIR/kernels.json``); exits 1 on any mismatch. The arithmetic and checks are importable functions so a
CPU test covers them with the torch backend standing in for Triton.

``--compile-only`` needs no GPU: it records the kernel launches the Triton wrappers make for the
configured shapes and compiles each for ``--arch`` (default sm_90) with Triton's bundled ``ptxas``,
catching compile-mode errors the CPU interpreter cannot see. Run it without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from servelab.kernels import reference
from servelab.kernels.backend import AttentionOps, select_attention_backend

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (atol, rtol) of a kernel's output against the fp32 reference computed from the same inputs.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


@dataclass(frozen=True)
class Shapes:
    """Model/cache geometry of a check run."""

    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16


@dataclass
class PagedCase:
    """Inputs of one ``paged_attention`` call (argument names follow the reference)."""

    name: str
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    max_query_len: int
    max_context_len: int
    scale: float

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.cu_seqlens_q, self.context_lens,
                self.max_query_len, self.max_context_len, self.scale)

    def upcast(self) -> "PagedCase":
        """The same case in fp32 (the oracle's inputs)."""
        return PagedCase(self.name, self.q.float(), self.k_cache.float(), self.v_cache.float(), *self.args()[3:])


@dataclass(frozen=True)
class CheckResult:
    name: str
    max_abs_err: float
    ok: bool


def make_paged_case(
    name: str, shapes: Shapes, query_lens: Sequence[int], context_lens: Sequence[int], device, *,
    shared_prefix_blocks: int = 0, seed: int = 0,
) -> PagedCase:
    """Random cache and queries; each sequence's blocks are a random permutation of the cache's blocks.

    With ``shared_prefix_blocks = n`` sequence 1 reuses sequence 0's first ``n`` physical blocks
    (prefix sharing). Block tables, cu_seqlens and context lens are int32.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    bs = shapes.block_size
    blocks_per_seq = [-(-c // bs) for c in context_lens]
    width = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 1
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(context_lens), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = order[used:used + n]
        used += n
    if shared_prefix_blocks and len(context_lens) > 1:
        n = min(shared_prefix_blocks, blocks_per_seq[0], blocks_per_seq[1])
        tables[1, :n] = tables[0, :n]

    cache_shape = (num_blocks, bs, shapes.num_kv_heads, shapes.head_dim)
    dev_gen = torch.Generator(device=device).manual_seed(seed)  # GiB-sized caches: fill on the device
    k_cache = torch.randn(cache_shape, generator=dev_gen, device=device, dtype=shapes.dtype)
    v_cache = torch.randn(cache_shape, generator=dev_gen, device=device, dtype=shapes.dtype)
    q = torch.randn(sum(query_lens), shapes.num_heads, shapes.head_dim, generator=dev_gen, device=device,
                    dtype=shapes.dtype)
    cu = torch.tensor([0, *query_lens]).cumsum(0).to(device=device, dtype=torch.int32)
    return PagedCase(
        name, q, k_cache, v_cache, tables.to(device), cu,
        torch.tensor(context_lens, dtype=torch.int32, device=device),
        max(query_lens), max(context_lens), shapes.head_dim**-0.5,
    )


def default_cases(shapes: Shapes, batch: int, max_context: int, device) -> list[PagedCase]:
    """Ragged decode (single pass and split), chunked prefill and a mixed batch, up to ``max_context``."""
    gen = torch.Generator().manual_seed(1)
    ragged = torch.randint(1, max_context + 1, (batch,), generator=gen).tolist()
    ragged[0] = max_context
    chunk = max(2, max_context // 16)
    prefill_q = [chunk, max(1, chunk // 2), 1, chunk]
    prefill_ctx = [chunk, max_context // 2, max(1, max_context // 4), max_context]
    return [
        make_paged_case("decode ragged", shapes, [1] * batch, ragged, device, shared_prefix_blocks=2),
        make_paged_case("decode split-K", shapes, [1, 1], [max_context, max(1, max_context * 5 // 8)], device),
        make_paged_case("prefill chunked", shapes, prefill_q, prefill_ctx, device, shared_prefix_blocks=1),
        make_paged_case("mixed prefill+decode", shapes, [chunk] + [1] * 3,
                        [max_context // 2, 7, max_context, 1], device),
    ]


def compare(name: str, out: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> CheckResult:
    """``ok`` iff shapes match, nothing is NaN, and ``|out - expected| <= atol + rtol * |expected|``."""
    if out.shape != expected.shape:
        return CheckResult(name, float("inf"), False)
    diff = (out.float() - expected.float()).abs()
    max_err = float(diff.max()) if diff.numel() else 0.0
    ok = not bool(torch.isnan(out).any()) and bool((diff <= atol + rtol * expected.float().abs()).all())
    return CheckResult(name, max_err, ok)


def check_store_kv(ops: AttentionOps, shapes: Shapes, num_tokens: int, device, seed: int = 0) -> CheckResult:
    """``ops.store_kv`` against the reference on distinct random slots, a quarter of them ``-1``."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = max(2, 2 * num_tokens // shapes.block_size + 1)
    cache_shape = (num_blocks, shapes.block_size, shapes.num_kv_heads, shapes.head_dim)
    slots = torch.randperm(num_blocks * shapes.block_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.25] = -1
    key = torch.randn(num_tokens, *cache_shape[2:], generator=gen).to(device, shapes.dtype)
    value = torch.randn(num_tokens, *cache_shape[2:], generator=gen).to(device, shapes.dtype)
    caches = [torch.zeros(cache_shape, dtype=shapes.dtype, device=device) for _ in range(4)]
    ops.store_kv(key, value, caches[0], caches[1], slots.to(device))  # int64: the reference needs it
    reference.store_kv(key, value, caches[2], caches[3], slots.to(device))
    k_res = compare("store_kv", caches[0], caches[2], 0.0, 0.0)
    v_res = compare("store_kv", caches[1], caches[3], 0.0, 0.0)
    return CheckResult("store_kv", max(k_res.max_abs_err, v_res.max_abs_err), k_res.ok and v_res.ok)


def check_attention(ops: AttentionOps, case: PagedCase) -> CheckResult:
    """``ops.paged_attention`` on ``case`` against the torch reference run in fp32 on the same inputs."""
    out = ops.paged_attention(*case.args())
    expected = reference.paged_attention(*case.upcast().args())
    atol, rtol = TOLERANCES[case.q.dtype]
    return compare(case.name, out, expected, atol, rtol)


def run_checks(ops: AttentionOps, shapes: Shapes, batch: int, max_context: int, device) -> list[CheckResult]:
    """All correctness checks of one configuration."""
    results = [check_store_kv(ops, shapes, num_tokens=4 * batch, device=device)]
    for case in default_cases(shapes, batch, max_context, device):
        results.append(check_attention(ops, case))
    return results


# --- bandwidth arithmetic -------------------------------------------------------------------------

def kv_bytes_read(context_lens: Sequence[int], num_kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """Bytes of K and V a decode step must read: every cached token's K and V for every KV head."""
    return 2 * sum(context_lens) * num_kv_heads * head_dim * elem_bytes


def copy_bytes_moved(numel: int, elem_bytes: int) -> int:
    """Bytes a device-to-device copy of ``numel`` elements moves (read once, written once)."""
    return 2 * numel * elem_bytes


def bandwidth(bytes_moved: int, seconds: float) -> float:
    """Bytes per second."""
    return bytes_moved / seconds


def make_timer(device) -> Callable[[Callable[[], object]], float]:
    """Seconds per call of a zero-argument function: ``triton.testing.do_bench`` median on CUDA."""
    if torch.device(device).type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, return_mode="median") / 1e3

    def cpu_timer(fn, repeats: int = 3) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats

    return cpu_timer


def measure_copy_bandwidth(device, timer, numel: int) -> float:
    """Bytes/s of a large contiguous device-to-device copy."""
    src = torch.empty(numel, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return bandwidth(copy_bytes_moved(numel, 4), timer(lambda: dst.copy_(src)))


@dataclass(frozen=True)
class BandwidthRow:
    impl: str
    batch: int
    context_len: int
    seconds: float
    bytes_per_s: float
    fraction_of_copy: float


def bench_decode(impls: dict[str, AttentionOps], shapes: Shapes, batch: int, context_len: int, device, timer,
                 copy_bw: float) -> list[BandwidthRow]:
    """Decode bandwidth of each paged implementation and of SDPA over a contiguous cache (uniform lengths)."""
    case = make_paged_case("bench", shapes, [1] * batch, [context_len] * batch, device)
    fns = {name: (lambda ops=ops: ops.paged_attention(*case.args())) for name, ops in impls.items()}
    # The contiguous baseline's own cache; its values do not matter for timing.
    k = torch.randn(batch, shapes.num_kv_heads, context_len, shapes.head_dim, device=device, dtype=shapes.dtype)
    v = torch.randn_like(k)
    q = case.q.view(batch, shapes.num_heads, 1, shapes.head_dim)
    gqa = shapes.num_heads != shapes.num_kv_heads
    fns["torch SDPA (contiguous)"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    nbytes = kv_bytes_read([context_len] * batch, shapes.num_kv_heads, shapes.head_dim, k.element_size())
    rows = []
    for name, fn in fns.items():
        seconds = timer(fn)
        bw = bandwidth(nbytes, seconds)
        rows.append(BandwidthRow(name, batch, context_len, seconds, bw, bw / copy_bw))
    return rows


# --- ahead-of-time compilation (no GPU needed) ------------------------------------------------------

def record_launches(run: Callable[[], object]) -> list[tuple[object, tuple, dict]]:
    """The ``(kernel, args, kwargs)`` launches the Triton wrappers make inside ``run``, not executed."""
    from servelab.kernels.triton_store_kv import _ModeAwareKernel

    launches = []
    original = _ModeAwareKernel.__getitem__
    _ModeAwareKernel.__getitem__ = lambda self, grid: lambda *a, **kw: launches.append((self, a, kw))
    try:
        run()
    finally:
        _ModeAwareKernel.__getitem__ = original
    return launches


def compile_launch(kernel, args: tuple, kwargs: dict, arch: int):
    """Compile one recorded launch for CUDA ``sm_<arch>``; returns Triton's compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    fn = triton.jit(kernel.fn)
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    constexprs = {k: v for k, v in kwargs.items() if k not in options}
    signature = {name: mangle_type(arg) for name, arg in zip(fn.arg_names, args)}
    signature.update({name: "constexpr" for name in constexprs})
    return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32), options=options)


def compile_only(shapes: Shapes, arch: int) -> list[tuple[str, int]]:
    """Compile every kernel variant a serving step with these shapes launches; ``(name, shared bytes)`` each.

    Covers store_kv, single-pass and split-K decode (with the merge) and prefill. The tiny CPU tensors
    only supply dtypes and strides: the compiled variants do not depend on batch or context length.
    """
    from servelab.kernels import triton_decode, triton_ops

    def step():
        cases = [
            make_paged_case("decode", shapes, [1, 1], [40, 7], "cpu"),
            make_paged_case("prefill", shapes, [16, 1], [40, 33], "cpu"),
        ]
        for case in cases:
            triton_ops.paged_attention(*case.args())
        q = cases[0].q[:1]
        triton_decode.paged_decode_attention(q, *cases[0].args()[1:3], cases[0].block_tables[:1],
                                             cases[0].context_lens[:1], 40, 1.0, num_splits=4)
        key = torch.zeros(4, shapes.num_kv_heads, shapes.head_dim, dtype=shapes.dtype)
        triton_ops.store_kv(key, key, cases[0].k_cache, cases[0].v_cache, torch.tensor([0, -1, 5, 9]))

    compiled = []
    for kernel, args, kwargs in record_launches(step):
        name = kernel.fn.__name__ + ("[split-K]" if kwargs.get("SPLIT_K") else "")
        compiled.append((name, compile_launch(kernel, args, kwargs, arch).metadata.shared))
    return compiled


def format_checks(results: Sequence[CheckResult]) -> str:
    lines = [f"{'check':<24} {'max |err|':>11}  result"]
    lines += [f"{r.name:<24} {r.max_abs_err:>11.3e}  {'ok' if r.ok else 'MISMATCH'}" for r in results]
    return "\n".join(lines)


def format_bandwidth(rows: Sequence[BandwidthRow], copy_bw: float) -> str:
    lines = [f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s",
             f"{'implementation':<26} {'batch':>5} {'context':>7} {'time ms':>9} {'GB/s':>8} {'of copy':>8}"]
    lines += [f"{r.impl:<26} {r.batch:>5} {r.context_len:>7} {r.seconds * 1e3:>9.3f} "
              f"{r.bytes_per_s / 1e9:>8.0f} {r.fraction_of_copy:>8.1%}" for r in rows]
    return "\n".join(lines)


def write_results(out: Path, args: argparse.Namespace, results: Sequence[CheckResult], rows: Sequence[BandwidthRow],
                  copy_bw: float) -> None:
    """``out/kernels.md`` (the two tables) and ``out/kernels.json`` (the settings, checks and rows)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.md").write_text(f"```\n{format_checks(results)}\n\n{format_bandwidth(rows, copy_bw)}\n```\n")
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    (out / "kernels.json").write_text(json.dumps({
        "settings": settings, "device": str(args.device), "copy_bytes_per_s": copy_bw,
        "checks": [asdict(r) for r in results], "bandwidth": [asdict(r) for r in rows]}, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="triton", choices=["triton", "torch"],
                        help="implementation under test (torch: dry run of this script)")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=8192)
    parser.add_argument("--bench-contexts", type=int, nargs="*", default=[1024, 4096, 8192])
    parser.add_argument("--copy-numel", type=int, default=1 << 28, help="fp32 elements of the copy benchmark")
    parser.add_argument("--out", type=Path, default=None, help="also write kernels.md and kernels.json here")
    parser.add_argument("--compile-only", action="store_true", help="compile the kernels for --arch; no GPU")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability for --compile-only")
    args = parser.parse_args(argv)

    shapes = Shapes(args.heads, args.kv_heads, args.head_dim, args.block_size, DTYPES[args.dtype])
    if args.compile_only:
        for name, shared in compile_only(shapes, args.arch):
            print(f"compiled for sm_{args.arch}: {name:<32} shared memory {shared / 1024:.0f} KiB")
        return 0

    device = torch.device(args.device)
    ops = select_attention_backend(args.backend, device)
    results = run_checks(ops, shapes, args.batch, args.max_context, device)
    print(format_checks(results))

    timer = make_timer(device)
    copy_bw = measure_copy_bandwidth(device, timer, args.copy_numel)
    impls = {f"{ops.name} paged": ops}
    if ops.name != "torch":
        impls["torch paged reference"] = select_attention_backend("torch", device)
    rows = []
    for context_len in args.bench_contexts:
        rows += bench_decode(impls, shapes, args.batch, context_len, device, timer, copy_bw)
    print(format_bandwidth(rows, copy_bw))
    if args.out is not None:
        write_results(args.out, args, results, rows, copy_bw)

    failed = [r.name for r in results if not r.ok]
    if failed:
        print(f"MISMATCH in: {', '.join(failed)}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
