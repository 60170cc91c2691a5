"""`make gpu-check` (kernels/gpu_check.py) without a GPU: its arguments, its no-CUDA exit, and its
whole path with --fake-timing (Triton interpreter, tiny shapes, FAKE timings): the tests phase, the
tuning pass, the sweep, the files it writes, and the evidence they hold, through `knobkeeper ab
import --format kernels` and `set --evidence`.

The fake run is one subprocess shared by the module (~20 s on a quiet machine): it must import
triton with TRITON_INTERPRET=1, which this process (and tests/test_kernels.py) may already have
imported otherwise. Timings of a fake run are a made-up model; nothing here asserts speed.
"""

from __future__ import annotations

import os
import sys

# As tests/test_kernels.py: whichever of the two is collected first, triton (imported by the tests
# below through knobkeeper_kernels.splitkv) must come up in interpreter mode.
if os.environ.get("TRITON_INTERPRET") not in ("0", "1"):
    if "triton" in sys.modules:
        raise RuntimeError("tests/test_gpu_check.py: triton was imported before TRITON_INTERPRET=1 could be set")
    os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from knobkeeper.evidence import importers, store  # noqa: E402
from knobkeeper.evidence.schema import validate  # noqa: E402
from knobkeeper.knobs.catalog import load_catalog  # noqa: E402
from knobkeeper_kernels import gpu_check  # noqa: E402
from knobkeeper_kernels.bench import KNOB, ROLE  # noqa: E402
from tests.infra import kk  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kernels" / "gpu_check.py"
CANDIDATES = [132, 264, 512, 1024, 2048]  # the issue's values besides unset (the default --targets)
FAKE_ARGS = ["--fake-timing", "--batch", "1,2", "--context", "64,300", "--repeats", "3", "--iters", "4"]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KNOBKEEPER_KERNELS_BROKEN_COMBINE")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # even on a GPU machine, these tests take the CPU paths
    env.update(extra)
    return env


def _run(args, cwd, python=None, timeout=300):
    return subprocess.run([python or sys.executable, *args], capture_output=True, text=True, env=_env(),
                          cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu_check")
    out, loose = base / "out", base / "loose"
    done = _run([str(SCRIPT), *FAKE_ARGS, "--out", str(out), "--evidence-dir", str(loose)], cwd=base)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, out, loose


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("argv, needle", [
    (["--targets", "0"], "outside KNOBKEEPER_SPLITKV_TARGET_CTAS's range 1..65536"),
    (["--targets", "70000"], "outside"),
    (["--targets", "unset,lots"], "'lots' is neither 'unset' nor an integer"),
    (["--targets", "unset"], "at least one candidate"),
    (["--batch", "8,x"], "--batch '8,x'"),
    (["--context", "-4"], "--context '-4'"),
    (["--repeats", "1"], "--repeats 1: expected at least 2"),
    (["--iters", "5"], "--iters 5: expected at least 20"),   # a GPU median needs >= 20 calls
    (["--budget-s", "0"], "--budget-s 0.0"),
    (["--budget-s", "nan"], "--budget-s nan"),
    (["--head-dim", "512"], "--head-dim 512"),
    (["--kv-heads", "0"], "--kv-heads 0"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--budget-s"], "expected one argument"),
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    assert gpu_check.main([*argv, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: ") and needle in lines[0], captured.err
    assert captured.out == "" and not (tmp_path / "out").exists()


def test_fake_mode_accepts_few_iterations():
    args = gpu_check.parse_args(["--fake-timing", "--iters", "2"])
    assert args.iters == 2 and args.q_heads == gpu_check.GQA * args.kv_heads


def test_out_must_be_a_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert gpu_check.main(["--out", str(tmp_path / "file")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_defaults_are_the_issues_sweep_and_the_catalogs_knob():
    from knobkeeper_kernels.splitkv import DEFAULT_TARGET_CTAS

    args = gpu_check.parse_args([])
    assert args.targets == CANDIDATES and args.batch == [1, 8, 64, 128] and args.context == [4096, 32768, 131072]
    assert (args.q_heads, args.kv_heads, args.head_dim) == (64, 8, 128)   # GQA 8
    assert args.iters >= 20 and args.repeats >= 2
    knob = load_catalog(ROOT / "inventory" / "catalog.toml").for_role(KNOB, ROLE)
    assert gpu_check.KNOB_RANGE == (knob.min, knob.max) and knob.default == DEFAULT_TARGET_CTAS
    for value in CANDIDATES:
        assert knob.check(value) == value


def test_headline_shapes_are_measured_first():
    order = gpu_check.shape_order([1, 8, 64, 128], [4096, 32768, 131072])
    assert order[:4] == [(128, 131072), (64, 131072), (128, 32768), (64, 32768)]
    assert sorted(order) == sorted((b, c) for b in (1, 8, 64, 128) for c in (4096, 32768, 131072))


# ----------------------------------------------------------------------------- no CUDA


def test_without_cuda_one_line_exit_0_nothing_written(tmp_path):
    done = _run([str(SCRIPT), "--out", str(tmp_path / "out")], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [done.stdout.strip()] and "no CUDA device" in done.stdout
    assert not (tmp_path / "out").exists()


def test_make_gpu_check_runs_the_machines_python3(tmp_path):
    """`make gpu-check` with $OUT set (as on a lent device): the machine's python3, not .venv. Here
    that python3 has no CUDA (and maybe no torch): one line, exit 0, nothing written."""
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "gpu-check"], capture_output=True, text=True,
                          env=_env(OUT=str(tmp_path / "out")), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA device" in done.stdout and len(done.stdout.strip().splitlines()) == 1, done.stdout
    assert not (tmp_path / "out").exists()


def test_bare_python_needs_no_install(tmp_path):
    """python -S: no site-packages at all (no torch, no editable install): the wrapper still finds the
    package beside it and says there is nothing to check."""
    done = subprocess.run([sys.executable, "-S", str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, env=_env(PYTHONPATH=""), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "torch is not importable" in done.stdout and len(done.stdout.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- the fake run


def test_fake_run_labels_every_line_and_file_fake(fake_run):
    done, out, _ = fake_run
    assert sorted(p.name for p in out.iterdir()) == ["evidence-FAKE.tar", "gpu_check-FAKE.json", "gpu_check-FAKE.txt"]
    lines = done.stdout.strip().splitlines()
    assert lines and all(line.startswith("FAKE ") for line in lines), [x for x in lines if not x.startswith("FAKE")]
    assert (out / "gpu_check-FAKE.txt").read_text().strip().splitlines() == lines
    doc = json.loads((out / "gpu_check-FAKE.json").read_text())
    assert doc["fake_timing"] is True and doc["timing"].startswith("FAKE") and "FAKE" in doc["device"]
    assert all(shape["fake"] for shape in doc["shapes"])


def test_fake_run_checks_every_dtype_and_tuning_candidate(fake_run):
    from knobkeeper_kernels.splitkv import CANDIDATE_CONFIGS

    doc = json.loads((fake_run[1] / "gpu_check-FAKE.json").read_text())
    assert doc["tests_passed"] is True and doc["finished"] is True and doc["errors"] == []
    assert {t["dtype"] for t in doc["tests"]} == {"fp32", "fp16", "bf16"}
    assert {t["config"] for t in doc["tests"] if t["case"] == "sweep-shape"} == {c.name for c in CANDIDATE_CONFIGS}
    assert all(t["passed"] and t["rel_err"] <= gpu_check.REL_FP32_OUT for t in doc["tests"])
    assert any(t["splits"] > 1 for t in doc["tests"])


def test_fake_run_sweeps_every_shape_and_target(fake_run):
    from knobkeeper_kernels.splitkv import CANDIDATE_CONFIGS

    doc = json.loads((fake_run[1] / "gpu_check-FAKE.json").read_text())
    assert [(s["batch"], s["context"]) for s in doc["shapes"]] == gpu_check.shape_order([1, 2], [64, 300])
    for shape in doc["shapes"]:
        assert set(shape["arms"]) == {"unset", *map(str, CANDIDATES)}
        assert {t["config"] for t in shape["tune"]} == {c.name for c in CANDIDATE_CONFIGS}
        assert shape["config"] == min(shape["tune"], key=lambda t: t["median_us"])["config"]
        assert shape["recommended"] == "unset" or shape["recommended"] in CANDIDATES
        kv = shape["batch"] * shape["context"] * 1 * 16 * 2 * 2          # H_kv=1, D=16, bf16, K and V
        assert shape["bytes_moved"] == kv + shape["batch"] * 8 * 16 * 2 * 2  # + q and o (H_q=8)
        for arm in shape["arms"].values():
            assert len(arm["repeats_us"]) == 3 and arm["median_us"] > 0
            assert arm["bandwidth_gbps"] == pytest.approx(shape["bytes_moved"] / (arm["median_us"] * 1e-6) / 1e9)
            assert arm["max_abs_diff_vs_sdpa"] <= 2 ** -5
        assert shape["sdpa"]["median_us"] > 0


def _evidence(fake_run) -> list[dict]:
    _, out, loose = fake_run
    with tarfile.open(out / "evidence-FAKE.tar") as tar:
        members = {m.name: json.loads(tar.extractfile(m).read()) for m in tar.getmembers()}
    assert sorted(members) == sorted(p.name for p in loose.glob("*.json"))
    return list(members.values())


def test_fake_evidence_one_file_per_candidate_and_context(fake_run):
    from knobkeeper_kernels.splitkv import DEFAULT_TARGET_CTAS

    docs = _evidence(fake_run)
    assert sorted((d["arms"]["B"]["knobs"][KNOB], d["setup"]["workload"]["input_len"]) for d in docs) == sorted(
        (c, ctx) for c in CANDIDATES for ctx in (64, 300))
    knob = load_catalog(ROOT / "inventory" / "catalog.toml").for_role(KNOB, ROLE)
    for doc in docs:
        assert validate(doc) == [], validate(doc)
        assert doc["knob"] == KNOB and doc["role"] == ROLE
        assert doc["arms"]["A"]["knobs"] == {KNOB: None}                 # the baseline is the knob unset
        knob.check(doc["arms"]["B"]["knobs"][KNOB])
        assert "FAKE" in doc["setup"]["device"] and "FAKE" in doc["source"]["tool"]
        assert doc["setup"]["kernel"]["fake_timing"] is True
        levels = {(r["arm"], r["concurrency"]) for r in doc["runs"]}
        assert levels == {(a, b) for a in "AB" for b in (1, 2)}
        for run in doc["runs"]:
            assert run["fake_timing"] is True
            assert math.isfinite(run["output_tokens_per_s"]) and run["output_tokens_per_s"] > 0
            assert run["output_tokens_per_s"] == pytest.approx(run["concurrency"] / (run["time_per_call_us"] * 1e-6))
            assert run["target_ctas"] == doc["arms"][run["arm"]]["knobs"][KNOB]
            assert run["effective_target_ctas"] == (run["target_ctas"] or DEFAULT_TARGET_CTAS)
        per_level = {}
        for run in doc["runs"]:
            per_level.setdefault((run["arm"], run["concurrency"]), []).append(run["repeat"])
        assert all(sorted(reps) == [0, 1, 2] for reps in per_level.values())


def test_fake_evidence_imports_and_links_to_a_set(fake_run, project):
    _, _, loose = fake_run
    path = next(p for p in sorted(loose.glob("*.json"))
                if json.loads(p.read_text())["arms"]["B"]["knobs"][KNOB] == 512)
    fmt, imported = importers.read(path)
    assert fmt == "kernels" and imported.arm_runs["A"] and imported.arm_runs["B"]
    result = kk(project, "ab", "import", "--format", "kernels", "--baseline", str(path), "--role", "decode")
    assert result.exit_code == 0, result.output
    ident = result.output.split()[1]
    doc = store.load(project, ident)
    assert [lv.concurrency for lv in doc.judgement.levels] == [1, 2]
    assert doc.arms["B"].knobs == {KNOB: 512} and "FAKE" in doc.setup.device
    result = kk(project, "set", f"{KNOB}=512", "--role", "decode", "--reason", "kernel sweep (fake)",
                "--evidence", ident)
    assert result.exit_code == 0, result.output
    log = kk(project, "log")
    assert f"evidence {ident}" in log.output and KNOB in log.output


def test_fake_and_real_output_never_share_a_folder(fake_run, capsys):
    _, out, _ = fake_run
    assert gpu_check.main(["--out", str(out)]) == 2
    assert "holds FAKE gpu_check output" in capsys.readouterr().err
    real = out.parent / "real"
    real.mkdir()
    (real / "gpu_check.json").write_text("{}")
    assert gpu_check.main(["--fake-timing", "--out", str(real)]) == 2
    assert "holds real gpu_check output" in capsys.readouterr().err


def test_budget_stops_cleanly_and_still_writes(tmp_path):
    out = tmp_path / "out"
    done = _run([str(SCRIPT), *FAKE_ARGS, "--skip-tests", "--budget-s", "1", "--out", str(out)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "gpu_check-FAKE.json").read_text())
    assert doc["shapes"] == [] and doc["finished"] is True
    assert [(s["batch"], s["context"]) for s in doc["skipped"]] == gpu_check.shape_order([1, 2], [64, 300])
    assert all(s["why"].startswith("budget") for s in doc["skipped"])
    with tarfile.open(out / "evidence-FAKE.tar") as tar:
        assert tar.getmembers() == []


# ----------------------------------------------------------------------------- GPU-only pieces, on stand-ins


class _Event:
    clock = 0.0

    def __init__(self, enable_timing):
        assert enable_timing is True
        self.at = None

    def record(self):
        _Event.clock += 1.0
        self.at = _Event.clock

    def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event's
        return (end.at - self.at) * 0.5


class _Flush:
    def __init__(self, log):
        self.log = log

    def zero_(self):
        self.log.append("flush")


def test_cuda_timer_flushes_before_every_call_and_times_each_call():
    """The events branch of Check.time_us on a stand-in torch.cuda: warm-up untimed, the L2 flush
    outside each timed region, one event pair per call, a GPU sleep queued first."""
    from types import SimpleNamespace

    log = []
    cuda = SimpleNamespace(Event=_Event, synchronize=lambda: log.append("sync"),
                           _sleep=lambda cycles: log.append(("sleep", cycles)))
    check = gpu_check.Check.__new__(gpu_check.Check)
    check.fake, check.torch, check.flush = False, SimpleNamespace(cuda=cuda), _Flush(log)
    check.args = SimpleNamespace(warmup=2)
    times = check.time_us(lambda: log.append("call"), iters=3)
    assert times == [pytest.approx(500.0)] * 3  # each pair: start, (call), end = 1 tick = 0.5 ms
    assert log[:3] == ["call", "call", "sync"] and log[3][0] == "sleep" and log[3][1] > 0
    assert log[4:] == ["flush", "call"] * 3 + ["sync"]


def test_sdpa_backends_are_pinned_one_at_a_time():
    """On the GPU each SDPA backend is tried alone (no silent fallback to math's 8x K/V copy); at
    least one runs here on CPU tensors and gives plain SDPA's answer."""
    torch = pytest.importorskip("torch")
    variants = gpu_check._sdpa_variants(torch, fake=False)
    assert variants and all(name != "math" for name, _ in variants)
    q, k, v = torch.randn(2, 8, 32), torch.randn(2, 2, 40, 32), torch.randn(2, 2, 40, 32)
    plain = gpu_check._sdpa_variants(torch, fake=True)[0][1](q, k, v)
    ran = []
    for name, call in variants:
        try:
            out = call(q, k, v)
        except RuntimeError:
            continue
        ran.append(name)
        assert (out - plain).abs().max().item() < 1e-5
    assert ran, "no pinned SDPA backend runs on CPU tensors"


STAND_IN = r'''
import os, sys, time
os.environ["TRITON_INTERPRET"] = "1"
import torch

class Event:
    def __init__(self, enable_timing):
        self.at = None
    def record(self):
        self.at = time.perf_counter()
    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3

cuda = torch.cuda
cuda.is_available = lambda: True
cuda.get_device_name = lambda *a: "NVIDIA H200 (stand-in: CPU tensors, interpreter)"
cuda.Event, cuda.synchronize, cuda.empty_cache = Event, lambda: None, lambda: None
cuda.mem_get_info = lambda *a: (8 << 30, 141 << 30)
if os.environ.get("STAND_IN_BROKEN_MEMINFO"):
    def broken(*a):
        raise RuntimeError("CUDA error: stand-in failure")
    cuda.mem_get_info = broken
cuda._sleep = lambda cycles: None
from knobkeeper_kernels import gpu_check
gpu_check.Check.gpu_device = "cpu"
gpu_check.select_triton_mode = lambda fake: None  # keep the interpreter a real run would switch off
sys.exit(gpu_check.main(sys.argv[1:]))
'''


def test_real_path_runs_on_a_stand_in_cuda(tmp_path):
    """Everything of a GPU run but the GPU: the events timer, the memory check, the pools, the L2
    flush buffer, SDPA with pinned backends, real (not FAKE) labels, on CPU tensors in the interpreter
    behind a stand-in torch.cuda. One small shape: the path, not the figures."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--skip-tests", "--no-tune",
                           "--batch", "1", "--context", "64", "--kv-heads", "1", "--head-dim", "16",
                           "--page-size", "8", "--targets", "2048", "--repeats", "2", "--warmup", "0"],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["evidence.tar", "gpu_check.json", "gpu_check.txt"]
    assert "FAKE" not in done.stdout
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["fake_timing"] is False and doc["peak_bandwidth_gbps"] == 4800 and doc["errors"] == []
    (shape,) = doc["shapes"]
    assert shape["sdpa_backend"] in ("flash_attention", "cudnn_attention", "efficient_attention")
    assert shape["sdpa_layout"] == "view" and shape["sdpa"]["median_us"] > 0
    assert shape["config"] == shape["table_config"]
    assert all(len(a["runs"]) == 2 and a["median_us"] > 0 and a["max_abs_diff_vs_sdpa"] <= 2 ** -5
               for a in shape["arms"].values())
    with tarfile.open(out / "evidence.tar") as tar:
        docs = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers()]
    assert [d["arms"]["B"]["knobs"][KNOB] for d in docs] == [2048]
    assert all(validate(d) == [] and not d["setup"]["kernel"]["fake_timing"] for d in docs)


def test_a_phase_that_breaks_is_recorded_and_exits_1(tmp_path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--skip-tests", "--batch", "2",
                           "--context", "64", "--kv-heads", "1", "--head-dim", "16"], capture_output=True, text=True,
                          env=_env(STAND_IN_BROKEN_MEMINFO="1"), cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["finished"] is True and doc["errors"][0]["phase"] == "sweep"
    assert "stand-in failure" in doc["errors"][0]["error"] and "sweep stopped" in done.stdout
