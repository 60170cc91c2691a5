"""Issue 25 finding 9: the side environment repairs itself. A verdict cache holding `[]` or
integers is ignored with one note and rewritten; a "ready" environment whose parser module was
deleted is rebuilt once, and when the rebuild does not help the error names the folder to delete
(and the next call says so without rebuilding again); a killed build's `site-XXXX` folder is removed.

The engine is a tiny local wheel (no network): pip installs it for real, the parser runs in its
own process, as sglang's and vLLM's do."""

from __future__ import annotations

import json
import zipfile
from types import SimpleNamespace

import pytest

from knobkeeper.engine import sideenv
from knobkeeper.engine.family import ParserSpec
from knobkeeper.errors import UserError

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
