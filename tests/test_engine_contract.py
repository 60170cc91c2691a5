"""The rendered sglang launch commands through sglang's own parser (prepare_server_args of the version
the inventory pins, in a side environment cached under the user's cache dir: the first run on a new
machine installs it, later runs reuse it), and the prefill/decode pairing invariants; the side environment
repairing itself. vLLM's side is tests/test_vllm_contract.py."""

from __future__ import annotations

import json
import zipfile
from types import SimpleNamespace

import pytest

from knobkeeper.deploy.stack import load_stack
from knobkeeper.engine import contract
from knobkeeper.engine import sideenv
from knobkeeper.engine.family import Parsed, ParserSpec
from knobkeeper.engine.routers import SGLANG_ROUTER
from knobkeeper.engine.sglang import FAMILY as SGLANG
from knobkeeper.errors import UserError
from tests.infra import git

PROD = "inventory/example_prod.py"


def _edit_prod(project, old: str, new: str) -> None:
    path = project.inventory_dir / "example_prod.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    git(project.root, "commit", "-q", "-am", "edit example_prod")


def _contract(project):
    return contract.contract_problems(load_stack(project.root, PROD), PROD)


def test_the_fixed_example_inventory_passes_the_real_parser(project):
    assert _contract(project) == ([], [], [])


def test_the_real_parser_rejects_bad_flags_naming_host_service_flag_and_message(project):
    # The flag as example_prod had it for sglang 0.5.6: 0.5.23 has two flags it could be short for.
    _edit_prod(project, '"--cuda-graph-max-bs-decode", "128"]', '"--cuda-graph-max-bs", "128"]')
    _edit_prod(project, '"prefill": ["--trust-remote-code",', '"prefill": ["--page-sz", "64", "--trust-remote-code",')
    problems, skipped, _ = _contract(project)
    assert skipped == []
    assert [p for p in problems if "rejected by" in p] == [
        f"{PROD}: prefill-1/knobkeeper-prefill: --page-sz: rejected by sglang 0.5.23's parser: unrecognized arguments: --page-sz 64",
        f"{PROD}: prefill-2/knobkeeper-prefill: --page-sz: rejected by sglang 0.5.23's parser: unrecognized arguments: --page-sz 64",
        f"{PROD}: decode-1/knobkeeper-decode: --cuda-graph-max-bs: rejected by sglang 0.5.23's parser: ambiguous option: "
        "--cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
        f"{PROD}: decode-2/knobkeeper-decode: --cuda-graph-max-bs: rejected by sglang 0.5.23's parser: ambiguous option: "
        "--cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
    ]


def test_pairing_mismatches_from_the_real_parser(project):
    _edit_prod(project, '"decode": ["--trust-remote-code",',
               '"decode": ["--page-size", "64", "--kv-cache-dtype", "fp8_e4m3", "--trust-remote-code",')
    problems, skipped, _ = _contract(project)
    assert skipped == []
    assert f"{PROD}: PD pairing: page size differs: prefill-1/knobkeeper-prefill has None, decode-1/knobkeeper-decode has 64" in problems
    assert (f"{PROD}: PD pairing: KV cache dtype differs: prefill-1/knobkeeper-prefill has 'auto', "
            f"decode-2/knobkeeper-decode has 'fp8_e4m3'") in problems
    assert len(problems) == 4  # page size and dtype, on each of the two decode hosts


def test_no_parser_means_skipped_never_a_silent_pass(project, tmp_path, monkeypatch):
    monkeypatch.setenv("KNOBKEEPER_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network, no wheelhouse
    problems, skipped, _ = _contract(project)
    assert problems == []
    (line,) = skipped
    assert line.startswith(f"skipped: {PROD}: sglang 0.5.23's parser: sglang==0.5.23: not found in the package index")


def test_an_unpinned_sglang_host_is_skipped_by_name(project):
    _edit_prod(project, '"prefill": "sglang==0.5.23", "decode": "sglang==0.5.23"', '"prefill": "sglang", "decode": "sglang"')
    problems, skipped, _ = _contract(project)
    assert problems == [] and len(skipped) == 4
    assert skipped[0] == (f"skipped: {PROD}: prefill-1/knobkeeper-prefill: no sglang version pinned (sglang_version or "
                          f"engines['prefill'] = 'sglang==V'), so no parser to check it with")


# --- the pairing rules, each mismatch on its own ------------------------------------------------

BASE = {"model_path": "/models/m", "served_model_name": "m", "page_size": 64, "kv_cache_dtype": "auto",
        "disaggregation_transfer_backend": "mooncake", "disaggregation_bootstrap_port": 8998}
ROUTER = {"router-1/knobkeeper-router": ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation",
                                         "--prefill", "http://10.0.0.11:30000", "8998", "--decode", "http://10.0.0.21:30001"]}


def _pair(**decode_args) -> list[Parsed]:
    return [Parsed("prefill-1/p", "prefill", "http://10.0.0.11:30000", "10.0.0.11", "0.5.23", True, dict(BASE)),
            Parsed("decode-1/d", "decode", "http://10.0.0.21:30001", "10.0.0.21", "0.5.23", True, {**BASE, **decode_args})]


def pd_pairing_problems(label, parsed, routers):
    problems, warnings = SGLANG.pairing_problems(label, parsed, {k: (SGLANG_ROUTER, v) for k, v in routers.items()})
    assert warnings == []
    return problems


def test_a_matching_pair_has_no_problems():
    assert pd_pairing_problems("inv", _pair(), ROUTER) == []


@pytest.mark.parametrize("attr, words, value", [
    ("model_path", "model path", "/models/other"),
    ("served_model_name", "served model name", "other"),
    ("page_size", "page size", 32),
    ("kv_cache_dtype", "KV cache dtype", "fp8_e5m2"),
    ("disaggregation_transfer_backend", "transfer backend", "nixl"),
])
def test_each_pairing_mismatch_names_both_values(attr, words, value):
    assert pd_pairing_problems("inv", _pair(**{attr: value}), ROUTER) == [
        f"inv: PD pairing: {words} differs: prefill-1/p has {BASE[attr]!r}, decode-1/d has {value!r}"]


def test_the_router_names_bootstrap_ports_prefill_really_has():
    wrong_port = {k: [a if a != "8998" else "9000" for a in v] for k, v in ROUTER.items()}
    assert pd_pairing_problems("inv", _pair(), wrong_port) == [
        "inv: PD pairing: router-1/knobkeeper-router names bootstrap port 9000 for http://10.0.0.11:30000, "
        "but prefill-1/p listens on 8998"]
    unknown = {k: [a.replace("10.0.0.11", "10.0.0.99") for a in v] for k, v in ROUTER.items()}
    assert pd_pairing_problems("inv", _pair(), unknown) == [
        "inv: PD pairing: router-1/knobkeeper-router names prefill http://10.0.0.99:30000, which no parsed "
        "prefill server of this inventory serves"]


# --- the side environment repairs itself (issue 25, finding 9) ---------------------------------
# A verdict cache holding `[]` or integers is ignored with one note and rewritten; a "ready"
# environment whose parser module was deleted is rebuilt once, and when the rebuild does not help the
# error names the folder to delete (and the next call says so without rebuilding again); a killed
# build's `site-XXXX` folder is removed. The engine is a tiny local wheel (no network): pip installs
# it for real, the parser runs in its own process, as sglang's and vLLM's do.

CHILD = ("import json, sys\nfrom fakeparser import args\n"
         "json.dump([args.verdict(a) for a in json.load(open(sys.argv[1]))], open(sys.argv[2], 'w'))\n")
ARGS = "def verdict(argv):\n    return {'ok': '--bad' not in argv, 'args': {'n': len(argv)}, 'message': ''}\n"


def _wheel(folder, with_args: bool = True):
    """fakeparser 1.0 as a wheel; without args.py when `with_args` is False (a broken release)."""
    path = folder / ("good" if with_args else "broken") / "fakeparser-1.0-py3-none-any.whl"
    path.parent.mkdir()
    files = {"fakeparser/__init__.py": "", "fakeparser-1.0.dist-info/METADATA":
             "Metadata-Version: 2.1\nName: fakeparser\nVersion: 1.0\n",
             "fakeparser-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if with_args:
        files["fakeparser/args.py"] = ARGS
    files["fakeparser-1.0.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + "fakeparser-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_the_side_environment_repairs_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("KNOBKEEPER_CACHE", str(tmp_path / "cache"))
    spec = ParserSpec(wheels=("fakeparser",), deps=(), child=CHILD)
    monkeypatch.setattr(sideenv, "family", lambda name: SimpleNamespace(parser=spec))
    good, broken = _wheel(tmp_path), _wheel(tmp_path, with_args=False)
    home = sideenv.side_env_dir("fake", "1.0")

    def parse(argvs, wheel=good):
        notes: list[str] = []
        return sideenv.parse_launch_args("fake", "1.0", argvs, wheel=wheel, notes=notes), notes

    assert parse([["--x"], ["--bad"]]) == ([{"ok": True, "args": {"n": 1}, "message": ""},
                                            {"ok": False, "args": {"n": 1}, "message": ""}], [])

    # A killed build's temp folder is removed on the next use.
    stale = home / "site-k1ll3d"
    (stale / "torch").mkdir(parents=True)
    (stale / "torch" / "big.so").write_bytes(b"\0" * 1_000_000)
    assert parse([["--x"]])[0][0]["ok"] and not stale.exists()

    # verdicts.json holding [] or integers: one note, the parser asked again, the cache rewritten.
    for junk in ("[]", "[1, 2]", "7", json.dumps({json.dumps(["--x"]): 5}), "{not json"):
        (home / "verdicts.json").write_text(junk)
        results, notes = parse([["--x"]])
        assert results == [{"ok": True, "args": {"n": 1}, "message": ""}], junk
        assert len(notes) == 1 and "verdicts.json: not a verdict cache" in notes[0], (junk, notes)
        assert isinstance(json.loads((home / "verdicts.json").read_text()), dict)

    # The parser's module deleted, ready.json kept: rebuilt once, and it works again.
    (home / "site" / "fakeparser" / "args.py").unlink()
    results, notes = parse([["--y", "1"]])
    assert results[0]["ok"] and (home / "site" / "fakeparser" / "args.py").exists()
    assert len(notes) == 1 and "parser did not import" in notes[0] and "rebuilt the side environment" in notes[0]

    # A rebuild that does not help (the release itself lacks the module): the folder to delete, once;
    # the next call says the same without building again.
    (home / "site" / "fakeparser" / "args.py").unlink()
    with pytest.raises(UserError, match=f"even after a rebuild: .*; delete {home} and run the command again"):
        parse([["--z"]], wheel=broken)
    built = (home / "ready.json").stat().st_mtime_ns
    with pytest.raises(UserError, match=f"delete {home}"):
        parse([["--z"]], wheel=broken)
    assert (home / "ready.json").stat().st_mtime_ns == built
