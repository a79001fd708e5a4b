"""Triton paged-cache kernels against the torch reference, run in Triton's CPU interpreter.

Triton builds its own ``tl.*`` helpers (``tl.sum``, ``tl.max``, ...) for the interpreter only when
``TRITON_INTERPRET=1`` is set at its first import. So on a machine without CUDA (where compiled
Triton cannot run anyway) this module imports triton with the variable set, then restores the
environment so other test modules see their own; the ``interpreted`` tests set it again through a
fixture, and the kernels re-read it at launch (``triton_store_kv.mode_aware_jit``). If triton was
already imported without it, or CUDA is present, the interpreted tests run in one fresh process
instead (``test_interpreted_tests_in_fresh_process``).

The GPU-check script's arithmetic and comparison logic is tested here too, without the interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# See the module docstring: import triton in interpreter mode, then restore the environment.
if "triton" not in sys.modules and not torch.cuda.is_available():
    _prior = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
    except ImportError:
        pass
    finally:
        if _prior is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _prior

from servelab.kernels import reference
from servelab.kernels.backend import select_attention_backend

try:
    import triton

    from servelab.kernels import triton_decode, triton_ops, triton_store_kv
except ImportError:
    triton = None

REPO = Path(__file__).resolve().parents[1]
INTERPRET_IN_PROCESS = triton is not None and triton_store_kv.interpreter_available()
requires_triton = pytest.mark.skipif(triton is None, reason="triton is not importable (pip install 'servelab[triton]')")
requires_interpreter = pytest.mark.skipif(
    not INTERPRET_IN_PROCESS,
    reason="triton was imported without TRITON_INTERPRET=1 in this process; "
           "test_interpreted_tests_in_fresh_process runs these tests instead",
)


@pytest.fixture(scope="module")
def triton_interpret():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        yield


def interpreted(test):
    """Mark a test as running Triton kernels in this process's interpreter."""
    test = pytest.mark.usefixtures("triton_interpret")(test)
    return pytest.mark.interpreted(requires_triton(requires_interpreter(test)))


# --- case construction ----------------------------------------------------------------------------

def make_case(*, block_size, num_heads, num_kv_heads, head_dim, query_lens, context_lens,
              dtype=torch.float32, index_dtype=torch.int32, share_first_block=True, strided=False, seed=0):
    """Arguments of ``paged_attention`` with shuffled physical blocks and spare blocks in the cache.

    ``share_first_block``: sequence 1 reads sequence 0's first physical block (prefix sharing).
    ``strided``: K/V are views into one ``[num_blocks, 2, ...]`` tensor and the block table is a
    column-strided view, so no tensor the kernels index is contiguous. Unused table entries are -1.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_needed) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(blocks_needed) + 1
    tables = torch.full((len(context_lens), width * (2 if strided else 1)), -1, dtype=index_dtype)
    view = tables[:, ::2] if strided else tables
    used = 0
    for b, n in enumerate(blocks_needed):
        view[b, :n] = perm[used:used + n].to(index_dtype)
        used += n
    if share_first_block and len(context_lens) > 1 and min(blocks_needed[:2]) > 0:
        view[1, 0] = view[0, 0]

    kv = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_cache, v_cache = (kv[:, 0], kv[:, 1]) if strided else (kv[:, 0].contiguous(), kv[:, 1].contiguous())
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    return dict(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=view,
        cu_seqlens_q=torch.tensor([0, *query_lens]).cumsum(0).to(index_dtype),
        context_lens=torch.tensor(context_lens, dtype=index_dtype),
        max_query_len=max(query_lens), max_context_len=max(context_lens), scale=head_dim**-0.5,
    )


def reference_attention(case):
    """The torch reference, in fp32 on the same (possibly rounded) inputs, with int64 indices."""
    args = dict(case)
    for name in ("q", "k_cache", "v_cache"):
        args[name] = case[name].float()
    for name in ("block_tables", "cu_seqlens_q", "context_lens"):
        args[name] = case[name].long()
    return reference.paged_attention(**args)


TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def assert_close(out, expected, dtype):
    assert out.dtype == dtype
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


# --- store_kv ------------------------------------------------------------------------------------

@interpreted
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("src_dtype,cache_dtype", [(torch.float32,) * 2, (torch.bfloat16,) * 2,
                                                   (torch.float32, torch.float16)])
def test_store_kv_matches_reference(block_size, src_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, kv_heads, head_dim, tokens = 10, 2, 24, 9
    shape = (num_blocks, block_size, kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[[1, 4, 8]] = -1
    key = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(src_dtype)
    value = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(src_dtype)
    k_cache, v_cache = torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    triton_ops.store_kv(key, value, k_cache, v_cache, slots.to(torch.int32))
    reference.store_kv(key, value, k_ref, v_ref, slots)

    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


# --- quantised KV cache and INT8 weights -----------------------------------------------------------

def quantise_case(case, name):
    """``case`` with its K/V cache quantised to ``name`` (per token and head scales) by the reference."""
    from servelab.kernels.kv_quant import kv_storage_dtype, quantize_kv

    dtype = kv_storage_dtype(name, torch.float32)
    out = dict(case)
    for cache, scale in (("k_cache", "k_scale"), ("v_cache", "v_scale")):
        out[cache], out[scale] = quantize_kv(case[cache], dtype)
    return out


def as_bytes(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


@interpreted
@pytest.mark.parametrize("name", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16])
def test_quantising_store_kv_writes_the_reference_bytes(name, src_dtype):
    from servelab.kernels.kv_quant import kv_storage_dtype

    gen = torch.Generator().manual_seed(3)
    dtype = kv_storage_dtype(name, torch.float32)
    key = (torch.randn(9, 2, 24, generator=gen) * torch.logspace(-4, 2, 9).view(-1, 1, 1)).to(src_dtype)
    value = torch.randn(9, 2, 24, generator=gen).to(src_dtype)
    value[3] = 0.0  # an all-zero head: scale 1, values 0
    slots = torch.tensor([3, 17, -1, 0, 40, 41, 5, -1, 22])
    outs = []
    for store in (reference.store_kv, triton_ops.store_kv):
        caches = [torch.zeros(6, 8, 2, 24, dtype=dtype) for _ in range(2)] + [torch.zeros(6, 8, 2) for _ in range(2)]
        store(key, value, caches[0], caches[1], slots, caches[2], caches[3])
        outs.append(caches)
    for ref, got in zip(*outs):
        assert torch.equal(as_bytes(ref), as_bytes(got))


@interpreted
@pytest.mark.parametrize("name", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_dequantising_attention_matches_reference(name, kind):
    lens = dict(query_lens=[1, 1, 1], context_lens=[1, 70, 35]) if kind == "decode" else \
        dict(query_lens=[20, 9, 1, 0], context_lens=[20, 45, 17, 5])
    case = quantise_case(make_case(block_size=16, num_heads=4, num_kv_heads=2, head_dim=32, **lens), name)
    assert_close(triton_ops.paged_attention(**case), reference.paged_attention(**case), torch.float32)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 37])
def test_int8_matmul_matches_the_dequantised_product(dtype, m):
    from servelab.kernels.triton_int8_matmul import int8_matmul
    from servelab.exec.quant import dequantize_weight, quantize_weight

    gen = torch.Generator().manual_seed(m)
    qweight, scales = quantize_weight(torch.randn(80, 72, generator=gen))
    x = torch.randn(m, 72, generator=gen).to(dtype)
    expected = x.float() @ dequantize_weight(qweight, scales).T
    got = int8_matmul(x, qweight, scales)
    assert got.dtype == dtype and got.shape == (m, 80)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected, atol=tol * float(expected.abs().max()), rtol=tol)


# --- attention -----------------------------------------------------------------------------------

GRID = [pytest.param(bs, ratio, id=f"bs{bs}-gqa{ratio}") for bs in (1, 16, 32) for ratio in (1, 2, 4)]


@interpreted
@pytest.mark.parametrize("block_size,gqa", GRID)
def test_decode_matches_reference(block_size, gqa):
    case = make_case(block_size=block_size, num_heads=2 * gqa, num_kv_heads=2, head_dim=32,
                     query_lens=[1, 1, 1, 1], context_lens=[1, 70, 33, 2 * block_size + 3])
    assert_close(triton_ops.paged_attention(**case), reference_attention(case), torch.float32)


@interpreted
@pytest.mark.parametrize("block_size,gqa", GRID)
def test_prefill_matches_reference(block_size, gqa):
    # New prompt, chunk after cached tokens, a decode row and an idle sequence in one batch.
    case = make_case(block_size=block_size, num_heads=2 * gqa, num_kv_heads=2, head_dim=32,
                     query_lens=[20, 9, 1, 0], context_lens=[20, 45, 17, 5])
    assert_close(triton_ops.paged_attention(**case), reference_attention(case), torch.float32)


@interpreted
@pytest.mark.parametrize("num_splits", [2, 5])
def test_decode_split_k_matches_reference(num_splits):
    # Short sequences leave some splits empty; those must carry zero weight in the merge.
    case = make_case(block_size=16, num_heads=8, num_kv_heads=2, head_dim=32,
                     query_lens=[1, 1, 1], context_lens=[300, 3, 129])
    args = {k: v for k, v in case.items() if k not in ("cu_seqlens_q", "max_query_len")}
    out = triton_decode.paged_decode_attention(**args, num_splits=num_splits)
    assert_close(out, reference_attention(case), torch.float32)


@interpreted
@pytest.mark.parametrize("head_dim,dtype", [(8, torch.float32), (80, torch.bfloat16), (96, torch.float16),
                                            (256, torch.float32)])
def test_head_dims_and_dtypes(head_dim, dtype):
    for query_lens, context_lens in (([1, 1], [40, 7]), ([6, 1], [19, 30])):
        case = make_case(block_size=16, num_heads=4, num_kv_heads=2, head_dim=head_dim,
                         query_lens=query_lens, context_lens=context_lens, dtype=dtype)
        assert_close(triton_ops.paged_attention(**case), reference_attention(case), dtype)


@interpreted
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_strided_inputs_and_index_dtypes(index_dtype):
    for query_lens, context_lens in (([1, 1, 1], [50, 17, 64]), ([7, 3], [7, 40])):
        case = make_case(block_size=16, num_heads=4, num_kv_heads=1, head_dim=16, query_lens=query_lens,
                         context_lens=context_lens, index_dtype=index_dtype, strided=True)
        assert not case["k_cache"].is_contiguous() and not case["block_tables"].is_contiguous()
        assert_close(triton_ops.paged_attention(**case), reference_attention(case), torch.float32)


@interpreted
@pytest.mark.parametrize("gqa", [3, 8])
def test_uneven_and_large_gqa_ratios(gqa):
    for query_lens, context_lens in (([1, 1], [40, 9]), ([12, 1], [30, 18])):
        case = make_case(block_size=16, num_heads=2 * gqa, num_kv_heads=2, head_dim=16,
                         query_lens=query_lens, context_lens=context_lens)
        assert_close(triton_ops.paged_attention(**case), reference_attention(case), torch.float32)


@interpreted
def test_single_token_batch_with_idle_sequences():
    # max_query_len == 1 but fewer tokens than sequences: not a plain decode batch (prefill kernel).
    case = make_case(block_size=16, num_heads=4, num_kv_heads=2, head_dim=16,
                     query_lens=[1, 0, 1], context_lens=[20, 9, 33], share_first_block=False)
    out = triton_ops.paged_attention(**case)
    active = [0, 2]  # the reference's decode path needs one token per sequence, so drop the idle one
    subset = dict(case, block_tables=case["block_tables"][active], context_lens=case["context_lens"][active],
                  cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32))
    assert_close(out, reference_attention(subset), torch.float32)


@interpreted
def test_gpu_check_script_with_triton_ops():
    script = load_gpu_check_script()
    shapes = script.Shapes(num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    ops = select_attention_backend("triton", torch.device("cpu"))
    results = script.run_checks(ops, shapes, batch=2, max_context=48, device="cpu")
    assert all(r.ok for r in results), script.format_checks(results)


def run_python(*argv: str, interpret: bool = False) -> subprocess.CompletedProcess:
    """Run a fresh Python with TRITON_INTERPRET=1 iff ``interpret``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, *argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.interpreted
@requires_triton
def test_interpreted_tests_in_fresh_process():
    if INTERPRET_IN_PROCESS:
        pytest.skip("the interpreted tests run in this process")
    proc = run_python("-m", "pytest", __file__, "-m", "interpreted", "-q", "-p", "no:cacheprovider", interpret=True)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-5000:] + proc.stderr[-2000:]


@requires_triton
def test_kernels_follow_interpret_set_after_kernel_import():
    """Kernel modules imported while TRITON_INTERPRET was unset interpret once it is set."""
    proc = run_python("-c", textwrap.dedent("""
        import os, torch
        os.environ["TRITON_INTERPRET"] = "1"
        import triton
        del os.environ["TRITON_INTERPRET"]
        from servelab.kernels import reference, triton_ops
        os.environ["TRITON_INTERPRET"] = "1"
        kc, vc = torch.zeros(3, 4, 1, 16), torch.zeros(3, 4, 1, 16)
        key, value = torch.randn(5, 1, 16), torch.randn(5, 1, 16)
        slots = torch.tensor([0, 5, -1, 11, 3])
        triton_ops.store_kv(key, value, kc, vc, slots)
        q = torch.randn(1, 2, 16)
        args = (kc, vc, torch.tensor([[2, 0, 1]]), torch.tensor([0, 1]), torch.tensor([12]), 1, 12, 0.25)
        out, ref = triton_ops.paged_attention(q, *args), reference.paged_attention(q, *args)
        assert torch.allclose(out, ref, atol=1e-5), (out, ref)
        print("OK")
    """))
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


@requires_triton
def test_interpret_set_after_triton_import_is_a_clear_error():
    proc = run_python("-c", textwrap.dedent("""
        import os, torch, triton
        from servelab.kernels import triton_ops
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            triton_ops.store_kv(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 1, 8),
                                torch.zeros(1, 1, 1, 8), torch.tensor([0]))
        except RuntimeError as e:
            print(e)
    """))
    assert proc.returncode == 0 and "set TRITON_INTERPRET before importing triton" in proc.stdout, proc.stderr


@requires_triton
def test_kernels_compile_for_sm90_without_a_gpu():
    """Compile-mode Triton (what a GPU runs) accepts every kernel variant; uses the bundled ptxas."""
    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip("triton has no NVIDIA backend here")
    proc = run_python(str(REPO / "experiments" / "gpu_check_kernels.py"), "--compile-only", "--arch", "90")
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert proc.stdout.count("compiled for sm_90") == 5, proc.stdout


# --- host-side logic (no interpreter) ------------------------------------------------------------

@requires_triton
def test_choose_num_splits():
    choose = triton_decode.choose_num_splits
    assert choose(batch=64, num_kv_heads=8, max_context_len=8192, num_sms=132) == 1  # grid already full
    assert choose(batch=1, num_kv_heads=8, max_context_len=8192, num_sms=132) == 32  # 264/8 = 33, capped
    assert choose(batch=2, num_kv_heads=8, max_context_len=1024, num_sms=132) == 4  # >= 256 keys per split
    assert choose(batch=1, num_kv_heads=1, max_context_len=100, num_sms=132) == 1  # too short to split
    assert choose(batch=1, num_kv_heads=2, max_context_len=4096, num_sms=None) == 16  # CPU target 64


@requires_triton
def test_check_supported():
    for block_size in (1, 2, 16, 256):
        for head_dim in (8, 16, 80, 96, 128, 256):
            triton_ops.check_supported(head_dim, block_size)
    with pytest.raises(ValueError, match=r"block_size=24.*powers of two from 1 to 256"):
        triton_ops.check_supported(128, 24)
    with pytest.raises(ValueError, match=r"block_size=512"):
        triton_ops.check_supported(128, 512)
    with pytest.raises(ValueError, match=r"head_dim=4.*from 8 to 256"):
        triton_ops.check_supported(4, 16)
    with pytest.raises(ValueError, match=r"head_dim=512"):
        triton_ops.check_supported(512, 16)
    with pytest.raises(ValueError, match=r"block_size=3"):  # checked on every call, from the cache shape
        triton_ops.paged_attention(torch.zeros(1, 2, 16), torch.zeros(2, 3, 1, 16), torch.zeros(2, 3, 1, 16),
                                   torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0, 1]),
                                   torch.tensor([1]), 1, 1, 1.0)


@requires_triton
def test_backend_selection(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        select_attention_backend("triton", torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ops = select_attention_backend("triton", torch.device("cpu"))
    assert (ops.name, ops.store_kv, ops.paged_attention) == ("triton", triton_ops.store_kv, triton_ops.paged_attention)


@requires_triton
@requires_interpreter
def test_launch_without_interpret_after_interpreted_import_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET before importing triton"):
        triton_ops.store_kv(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 1, 8),
                            torch.zeros(1, 1, 1, 8), torch.tensor([0]))


def load_gpu_check_script():
    """Import ``experiments/gpu_check_kernels.py`` (not a package) once."""
    name = "servelab_experiments_gpu_check_kernels"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / "gpu_check_kernels.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve their module's annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_gpu_check_bandwidth_arithmetic():
    script = load_gpu_check_script()
    # 64 sequences x 8192 tokens x 8 KV heads x 128 dims x 2 bytes, for K and for V: 2 GiB.
    assert script.kv_bytes_read([8192] * 64, 8, 128, 2) == 2 * 2**30
    assert script.kv_bytes_read([3, 5], 2, 4, 4) == 2 * 8 * 2 * 4 * 4
    assert script.copy_bytes_moved(1000, 4) == 8000
    assert script.bandwidth(4e9, 2e-3) == pytest.approx(2e12)
    row = script.bench_decode({}, script.Shapes(4, 2, 16, 16, torch.float32), 2, 32, "cpu",
                              timer=lambda fn: (fn(), 1e-3)[1], copy_bw=1e6)
    assert [r.impl for r in row] == ["torch SDPA (contiguous)"]
    assert row[0].bytes_per_s == pytest.approx(2 * 2 * 32 * 2 * 16 * 4 / 1e-3)
    assert row[0].fraction_of_copy == pytest.approx(row[0].bytes_per_s / 1e6)


def test_gpu_check_detects_mismatch_and_dry_run(capsys):
    script = load_gpu_check_script()
    shapes = script.Shapes(num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.bfloat16)
    torch_ops = select_attention_backend("torch", torch.device("cpu"))
    assert all(r.ok for r in script.run_checks(torch_ops, shapes, batch=3, max_context=40, device="cpu"))

    def off_by_a_bit(*args):
        return torch_ops.paged_attention(*args) + 0.05

    def stores_nothing(key, value, k_cache, v_cache, slots):
        pass

    broken = script.AttentionOps("broken", stores_nothing, off_by_a_bit)
    results = script.run_checks(broken, shapes, batch=3, max_context=40, device="cpu")
    assert not any(r.ok for r in results), script.format_checks(results)

    code = script.main(["--device", "cpu", "--backend", "torch", "--batch", "2", "--max-context", "32",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--bench-contexts", "16",
                        "--copy-numel", "1000"])
    out = capsys.readouterr().out
    assert code == 0 and "all checks passed" in out and "torch SDPA (contiguous)" in out
