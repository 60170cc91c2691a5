"""Split-KV decode attention (kernels/, package knobkeeper_kernels) in Triton's CPU interpreter.

What is proved here: the split LSE combine is exact, i.e. every split count S gives the
answer of the unsplit computation (S=1) and of an fp64 torch reference, up to fp32 rounding.

Tolerances, and why:
- fp32 inputs, fp32 output: max |kernel - fp64 reference| <= ATOL = 1e-5 on the output and on
  the LSE. Inputs are N(0, 1), so |o| <= max|v| ~ 4 and |lse| ~ 5. fp32 rounding of an online
  softmax over <= 200 tokens (a few exp2/rescale steps per element, each a few eps = 1.2e-7
  relative) measured at most 2.3e-7 on the output and 4.4e-7 on the LSE here, so 1e-5 leaves
  ~20x headroom (and room for a GPU's 3xTF32 matmuls), while a wrong combine is off by 1e-2 .. 1
  (test_uniform_combine_is_detectably_wrong).
- every S against S=1 on the same inputs: max |o_S - o_1| <= SPLIT_ATOL = 2e-6 (measured at most
  1.5e-7, about 1 ulp at |o| ~ 1). The results are NOT bit-identical (the fp32 sums are taken in a
  different order), so "exact" means "equal up to fp32 rounding"; a combine that drops or
  misweights a split changes o by orders of magnitude more.
- bf16/fp16 inputs: the kernel converts every load to fp32 and accumulates in fp32, so with an
  fp32 output it must meet the same ATOL against the fp64 reference computed from the SAME rounded
  inputs. With the output in the input dtype it may differ from the correctly rounded reference
  by 1 ulp of that dtype (the interpreter's fp32->bf16 conversion truncates; a GPU rounds to
  nearest).

Interpreter cost is ~10 ms per program step; the cases are sized so the file runs in well under
60 s. TRITON_INTERPRET must be set before the first `import triton` of the process, hence the
assignment below, ahead of every other import (nothing else in the suite imports triton).
Set TRITON_INTERPRET=0 on a CUDA machine to run the same tests on the GPU.

Run the suite against a deliberately broken combine (uniform weights instead of LSE weights):
    KNOBKEEPER_KERNELS_BROKEN_COMBINE=uniform pytest tests/test_kernels.py
the exactness tests then fail.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") not in ("0", "1"):
    if "triton" in sys.modules:  # too late to switch on the interpreter in this process
        raise RuntimeError("tests/test_kernels.py: triton was imported before TRITON_INTERPRET=1 could be set")
    os.environ["TRITON_INTERPRET"] = "1"

import ast  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

from knobkeeper_kernels.cases import make_case as shared_case  # noqa: E402
from knobkeeper_kernels.reference import combine_ref, decode_attention_ref  # noqa: E402
from knobkeeper_kernels.splitkv import (  # noqa: E402
    BROKEN_COMBINE_ENV,
    TARGET_CTAS_ENV,
    decode_attention,
    num_splits,
    split_bounds,
)

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cpu" if os.environ["TRITON_INTERPRET"] == "1" else "cuda"
ATOL = 1e-5
SPLIT_ATOL = 2e-6
BLOCK_N = 16  # small blocks: several KV blocks (and so several splits) at small L


# ----------------------------------------------------------------------------- the split rule


@pytest.mark.parametrize(
    "target, batch, heads, blocks, expected",
    [
        (256, 1, 8, 512, 32),     # ceil(256 / 8)
        (256, 3, 8, 512, 11),     # ceil(256 / 24) = 11 (rounds up)
        (256, 64, 8, 512, 1),     # grid already >= target: one split
        (1024, 96, 8, 512, 2),    # ceil(1024 / 768)
        (256, 1, 8, 5, 5),        # never more splits than KV blocks
        (1, 1, 1, 1, 1),
        (65536, 1, 1, 3, 3),
    ],
)
def test_num_splits_rule(target, batch, heads, blocks, expected):
    assert num_splits(target, batch, heads, blocks) == expected


def test_num_splits_rejects_nonpositive():
    with pytest.raises(ValueError, match="positive"):
        num_splits(0, 1, 1, 1)


def test_split_bounds_cover_every_block_once_and_are_never_empty():
    for blocks in range(1, 41):
        for splits in range(1, 50):
            bounds = split_bounds(blocks, splits)
            assert len(bounds) == min(blocks, splits)
            assert bounds[0][0] == 0 and bounds[-1][1] == blocks
            assert all(start < end for start, end in bounds), (blocks, splits, bounds)
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


# ----------------------------------------------------------------------------- inputs


def make_case(seq_lens, q_heads, kv_heads, head_dim, page_size, dtype=torch.float32, seed=0):
    """The shared case builder (unused cache slots are NaN: a read outside a sequence poisons the output)."""
    return shared_case(seq_lens, q_heads, kv_heads, head_dim, page_size, dtype=dtype, seed=seed, device=DEVICE)


# name -> (seq_lens, H_q, H_kv, D, page_size or None for contiguous)
CASES = {
    "L1-gqa4-paged16": ([1, 1], 8, 2, 32, 16),
    "ragged-gqa8-paged16": ([1, 17, 50, 129], 8, 1, 32, 16),       # L % block != 0, mixed lengths
    "ragged-gqa2-paged5": ([77, 3, 160], 4, 2, 32, 5),              # page size not dividing the block
    "ragged-mha-contiguous-d24": ([33, 100], 2, 2, 24, None),       # MHA, head dim not a power of two
    "gqa4-paged1-sglang": ([45, 96], 4, 1, 16, 1),                  # page size 1, as SGLang keeps KV
}


def splits_to_try(seq_lens):
    """1, 2, 3, 5 (does not divide most lengths) and the maximum for the longest sequence."""
    most = -(-max(seq_lens) // BLOCK_N)
    return sorted({s for s in (1, 2, 3, 5, most) if s <= most})


def run(q, k, v, bt, lens, splits, **kw):
    """decode_attention with exactly `splits` splits (target = splits * B * H_kv)."""
    target = splits * q.shape[0] * k.shape[2]
    out, lse, parts = decode_attention(q, k, v, bt, lens, target_ctas=target, block_n=BLOCK_N,
                                       return_lse=True, return_partials=True, **kw)
    assert parts["splits"] == splits
    return out, lse, parts


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("name", list(CASES))
def test_every_split_count_matches_the_reference(name):
    seq_lens, q_heads, kv_heads, head_dim, page_size = CASES[name]
    q, k, v, bt, lens = make_case(seq_lens, q_heads, kv_heads, head_dim, page_size)
    ref_o, ref_lse = decode_attention_ref(q, k, v, bt, lens)
    results = {}
    for splits in splits_to_try(seq_lens):
        out, lse, _ = run(q, k, v, bt, lens, splits)
        assert torch.isfinite(out).all(), f"S={splits}: non-finite output"
        err = (out.double() - ref_o).abs().max().item()
        assert err <= ATOL, f"S={splits}: max |o - ref| = {err:.3g} > {ATOL}"
        lse_err = (lse.double() - ref_lse).abs().max().item()
        assert lse_err <= ATOL, f"S={splits}: max |lse - ref| = {lse_err:.3g} > {ATOL}"
        results[splits] = out
    for splits, out in results.items():
        diff = (out - results[1]).abs().max().item()
        assert diff <= SPLIT_ATOL, f"S={splits} vs S=1: max diff {diff:.3g} > {SPLIT_ATOL}"


@pytest.mark.parametrize("name", ["ragged-gqa8-paged16", "ragged-gqa2-paged5"])
def test_each_split_is_a_real_range_and_its_partial_is_exact(name):
    """Stage 1 alone: split i of sequence b is attention over exactly its split_bounds tokens."""
    seq_lens, q_heads, kv_heads, head_dim, page_size = CASES[name]
    q, k, v, bt, lens = make_case(seq_lens, q_heads, kv_heads, head_dim, page_size, seed=1)
    splits = 5
    _, _, parts = run(q, k, v, bt, lens, splits)
    for b, length in enumerate(seq_lens):
        bounds = split_bounds(-(-length // BLOCK_N), splits)
        for i, (start, end) in enumerate(bounds):
            tokens = (start * BLOCK_N, min(end * BLOCK_N, length))
            assert tokens[0] < tokens[1], f"seq {b} split {i}: empty token range {tokens}"
            one = slice(b, b + 1)
            ref_o, ref_lse = decode_attention_ref(q[one], k, v, None if bt is None else bt[one], lens[one],
                                                  token_ranges=[tokens])
            assert torch.isfinite(parts["mid_lse"][b, :, i]).all()
            assert (parts["mid_o"][b, :, i].double() - ref_o[0]).abs().max().item() <= ATOL
            assert (parts["mid_lse"][b, :, i].double() - ref_lse[0]).abs().max().item() <= ATOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_inputs_accumulate_in_fp32(dtype):
    seq_lens, q_heads, kv_heads, head_dim, page_size = [70, 5, 130], 8, 2, 32, 16
    q, k, v, bt, lens = make_case(seq_lens, q_heads, kv_heads, head_dim, page_size, dtype=dtype, seed=2)
    ref_o, _ = decode_attention_ref(q, k, v, bt, lens)  # fp64 from the same rounded inputs
    exact = {}
    for splits in (1, 3, 9):
        out, _, _ = run(q, k, v, bt, lens, splits, out_dtype=torch.float32)
        err = (out.double() - ref_o).abs().max().item()
        assert err <= ATOL, f"{dtype} S={splits}: max |o - ref| = {err:.3g} > {ATOL}"
        exact[splits] = out
        assert (out - exact[1]).abs().max().item() <= SPLIT_ATOL
    native, _, _ = run(q, k, v, bt, lens, 3)
    assert native.dtype == dtype
    ulp = torch.finfo(dtype).eps * ref_o.abs() + torch.finfo(dtype).smallest_normal
    assert ((native.double() - ref_o).abs() <= ulp).all(), f"{dtype} output more than 1 ulp off"


def test_fp16_tensor_core_path_is_fp32_accurate():
    """The GPU's path for bf16/fp16 (q.k in the inputs' type, p.v with p in three 16-bit parts, fp32
    sums), run here with fp16, which the interpreter computes faithfully (its bf16 it does not). With
    p rounded to one fp16 part the error would be ~5e-4."""
    seq_lens, q_heads, kv_heads, head_dim, page_size = [70, 5, 130], 8, 2, 32, 16
    q, k, v, bt, lens = make_case(seq_lens, q_heads, kv_heads, head_dim, page_size, dtype=torch.float16, seed=7)
    ref_o, ref_lse = decode_attention_ref(q, k, v, bt, lens)
    for splits in (1, 3, 9):
        out, lse, _ = run(q, k, v, bt, lens, splits, out_dtype=torch.float32, native_dot=True)
        assert (out.double() - ref_o).abs().max().item() <= ATOL, splits
        assert (lse.double() - ref_lse).abs().max().item() <= ATOL, splits
    with pytest.raises(ValueError, match="native_dot"):
        decode_attention(q.float(), k.float(), v.float(), bt, lens, native_dot=True)


# ----------------------------------------------------------------------------- the combine can fail


def test_combine_algebra_in_torch():
    """The identity the kernel relies on, in fp64: LSE-weighted partials == the whole; uniform != whole."""
    q, k, v, bt, lens = make_case([100], 4, 2, 16, 16, seed=3)
    whole_o, whole_lse = decode_attention_ref(q, k, v, bt, lens)
    ranges = [(0, 7), (7, 64), (64, 100)]  # unequal splits, as for a ragged length
    parts = [decode_attention_ref(q, k, v, bt, lens, token_ranges=[r]) for r in ranges]
    o, lse = combine_ref(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    assert (o - whole_o).abs().max().item() < 1e-12
    assert (lse - whole_lse).abs().max().item() < 1e-12
    wrong, _ = combine_ref(torch.stack([p[0] for p in parts]), None, uniform=True)
    assert (wrong - whole_o).abs().max().item() > 1e-2


def test_uniform_combine_is_detectably_wrong():
    """The exactness check above can fail: averaging splits uniformly (ignoring their LSE) is caught."""
    seq_lens, q_heads, kv_heads, head_dim, page_size = CASES["ragged-gqa2-paged5"]
    q, k, v, bt, lens = make_case(seq_lens, q_heads, kv_heads, head_dim, page_size)
    ref_o, _ = decode_attention_ref(q, k, v, bt, lens)
    one, _, _ = run(q, k, v, bt, lens, 1, combine="uniform")  # one split: nothing to weigh
    assert (one.double() - ref_o).abs().max().item() <= ATOL
    broken, _, _ = run(q, k, v, bt, lens, 3, combine="uniform")
    err = (broken.double() - ref_o).abs().max().item()
    assert err > 1000 * ATOL, f"a uniform combine should be far off, got {err:.3g}"
    assert torch.isfinite(broken).all()  # wrong, not NaN: only a numeric check catches it


def test_broken_combine_switch_reaches_the_kernel(monkeypatch):
    q, k, v, bt, lens = make_case([40, 64], 2, 1, 16, 16, seed=4)
    good = decode_attention(q, k, v, bt, lens, target_ctas=8, block_n=BLOCK_N, combine="lse")
    monkeypatch.setenv(BROKEN_COMBINE_ENV, "uniform")
    bad = decode_attention(q, k, v, bt, lens, target_ctas=8, block_n=BLOCK_N)
    assert (bad - good).abs().max().item() > 1e-3


# ----------------------------------------------------------------------------- the knob and the launcher


def test_target_ctas_comes_from_the_environment(monkeypatch):
    q, k, v, bt, lens = make_case([200], 4, 2, 16, 16, seed=5)  # 13 blocks of 16
    monkeypatch.delenv(TARGET_CTAS_ENV, raising=False)
    _, parts = decode_attention(q, k, v, bt, lens, block_n=BLOCK_N, return_partials=True)
    assert parts["splits"] == 13  # default 256 -> ceil(256 / 2) = 128, clamped to 13 blocks
    monkeypatch.setenv(TARGET_CTAS_ENV, "6")
    _, parts = decode_attention(q, k, v, bt, lens, block_n=BLOCK_N, return_partials=True)
    assert parts["splits"] == 3  # ceil(6 / (1 * 2))
    monkeypatch.setenv(TARGET_CTAS_ENV, "lots")
    with pytest.raises(ValueError, match=TARGET_CTAS_ENV):
        decode_attention(q, k, v, bt, lens, block_n=BLOCK_N)


def test_bad_inputs_get_one_line_errors():
    q, k, v, bt, lens = make_case([20, 30], 3, 2, 16, 16, seed=6)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        decode_attention(q, k, v, bt, lens)
    q, k, v, bt, lens = make_case([20, 30], 4, 2, 16, 16, seed=6)
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention(q, k, v, bt, torch.tensor([0, 30], dtype=torch.int32))
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention(q, k, v, bt, torch.tensor([20, 33], dtype=torch.int32))  # beyond 2 pages of 16
    with pytest.raises(ValueError, match="dtypes"):
        decode_attention(q.half(), k, v, bt, lens)
    with pytest.raises(ValueError, match="block_n"):
        decode_attention(q, k, v, bt, lens, block_n=24)


# ----------------------------------------------------------------------------- GPU compile, no GPU


def test_kernels_compile_for_sm90_and_sm120(tmp_path):
    """triton.compile for Hopper and Blackwell targets in a process without the interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # a real compile, not a cache hit
    from knobkeeper_kernels.splitkv import CANDIDATE_CONFIGS, launch_config

    records = []
    for arch, configs in (("90", "all"), ("120", "table")):  # every tuning candidate for Hopper
        done = subprocess.run([sys.executable, "-m", "knobkeeper_kernels.compile_check", "--arch", arch,
                               "--dtype", "bf16", "--configs", configs], capture_output=True, text=True, env=env,
                              timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        records += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    got = {(r["kernel"], r["arch"]) for r in records}
    assert got == {(kernel, arch) for kernel in ("_splitkv_stage1", "_splitkv_combine")
                   for arch in ("sm_90", "sm_120")}
    assert all(r["cubin_bytes"] > 0 and r["ptx_bytes"] > 0 for r in records), records
    # Every config the GPU check may tune to compiles for Hopper (the table's default among them).
    tuned = {r["config"] for r in records if r["kernel"] == "_splitkv_stage1" and r["arch"] == "sm_90"}
    assert tuned == {c.name for c in CANDIDATE_CONFIGS}
    assert all(r["mma"] for r in records if r["kernel"] == "_splitkv_stage1")
    # No candidate spills registers on Hopper, and the table's tile leaves room for 4 programs per SM
    # (p.v in 16-bit parts; tf32x3 on a widened V spilled at 128-token blocks, 255 registers at 64).
    hopper = [r for r in records if r["kernel"] == "_splitkv_stage1" and r["arch"] == "sm_90"]
    assert all(r["spill_bytes"] == 0 for r in hopper), hopper
    table = launch_config(128, 2).name
    assert [r["registers"] <= 128 for r in hopper if r["config"] == table] == [True, True], hopper
    # The combine for one split, a few, and the 256 a batch of 1 gets at 2048 targets.
    assert {r["block_s"] for r in records if r["kernel"] == "_splitkv_combine" and r["arch"] == "sm_90"} == {1, 16, 256}


# ----------------------------------------------------------------------------- the benchmark


def test_bench_smoke_writes_valid_evidence(tmp_path):
    from knobkeeper.evidence.schema import validate

    env = {key: value for key, value in os.environ.items() if key != BROKEN_COMBINE_ENV}
    done = subprocess.run([sys.executable, "-m", "knobkeeper_kernels.bench", "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(tmp_path.glob("*.json"))
    # smoke: candidates 2 and 8 against baseline 4, contexts 24 and 40 -> 4 files
    assert len(files) == 4, done.stdout
    for path in files:
        doc = json.loads(path.read_text())
        assert validate(doc) == [], (path.name, validate(doc))
        assert path.stem.endswith(doc["id"])
        assert doc["knob"] == "KNOBKEEPER_SPLITKV_TARGET_CTAS" and doc["role"] == "decode"
        assert doc["arms"]["A"]["knobs"] == {doc["knob"]: 4}
        assert doc["setup"]["engine"] == "knobkeeper-kernels" and doc["setup"]["workload"]["api"] == "kernel"
        assert doc["setup"]["device"] == "cpu-interpreter"
        assert {(r["arm"], r["concurrency"]) for r in doc["runs"]} == {(a, b) for a in "AB" for b in (1, 2)}
        for r in doc["runs"]:
            assert r["output_tokens_per_s"] == pytest.approx(r["concurrency"] / (r["time_per_call_us"] * 1e-6))
            shape = doc["setup"]["kernel"]
            assert shape["dtype"] == "bf16"
            assert r["kv_bytes"] == r["concurrency"] * r["context"] * shape["kv_heads"] * shape["head_dim"] * 2 * 2
            assert r["ctas"] == r["concurrency"] * shape["kv_heads"] * r["num_splits"]
            assert r["bandwidth_fraction"] is None and r["sdpa_time_per_call_us"] > 0
            assert r["max_abs_diff_vs_sdpa"] <= 2 ** -5  # both bf16 outputs: an ulp or two apart
            assert r["target_ctas"] == doc["arms"][r["arm"]]["knobs"][doc["knob"]]


# ----------------------------------------------------------------------------- packaging and boundaries


def _imported_modules(path: Path) -> set[str]:
    """The dotted names `path` imports from (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_controller_never_imports_torch_or_triton_and_kernels_never_import_the_controller():
    # knobkeeper/engine/child/ holds scripts run in an engine environment (the tiny model's builder
    # imports torch there); no module of the controller may import them.
    child = ROOT / "knobkeeper" / "engine" / "child"
    scripts = sorted(child.glob("*.py"))
    assert child / "tiny_model_build.py" in scripts
    for path in sorted((ROOT / "knobkeeper").rglob("*.py")):
        if path.parent == child:
            continue
        imported = _imports(path) | _imported_modules(path)
        assert not imported & {"torch", "triton"}, f"{path.relative_to(ROOT)} imports torch/triton"
        assert not any(m.startswith("knobkeeper.engine.child") for m in imported), \
            f"{path.relative_to(ROOT)} imports a script of knobkeeper/engine/child/"
    kernel_files = sorted((ROOT / "kernels").rglob("*.py"))
    assert ROOT / "kernels" / "gpu_check.py" in kernel_files  # the GPU check runs on a machine with kernels/ only
    for path in kernel_files:
        assert "knobkeeper" not in _imports(path), f"{path.relative_to(ROOT)} imports the controller"


def test_torch_and_triton_pins_agree():
    from knobkeeper.engine.versions import TORCH_VERSION

    text = (ROOT / "kernels" / "pyproject.toml").read_text()
    assert f'"torch=={TORCH_VERSION}"' in text and '"triton==3.7.1"' in text
    assert metadata.version("triton") == "3.7.1"
    assert metadata.version("torch").split("+")[0] == TORCH_VERSION
