# ruff: noqa: E501  (the table of cases reads best one case a line)
"""Every hostile-input reproduction (no input may hang, crash or silently mislead), run as written.

    python benchmarks/hardening.py [--timeout 30] [--only R4] [--pythonpath DIR]

Each case runs in a fresh process (the CLI through the installed `lmcore` script, the rest
through `python -c`), with the fake distributions it needs on PYTHONPATH. The table gives the
exit status, the wall-clock seconds, the peak RSS of that process and the first line of what it
said (stderr for the CLI, the printed outcome for Python snippets). `lmcore build cs336-tiny
--device meta` and `python -c "import lmcore.model.transformer"` are timed too: the least a command costs.

`--pythonpath DIR` puts DIR (and DIR/plugins) first on the children's path, to run the same
cases against another checkout (e.g. `git archive main | tar -x -C /tmp/base`).

Never run by the test suite; the tests reproduce each case on its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

SHOW = 110  # characters of the outcome shown per row


@dataclass
class Case:
    id: str
    what: str
    argv: list[str] | None = None  # lmcore CLI arguments
    code: str | None = None  # a Python snippet
    env: dict[str, str] = field(default_factory=dict)
    sites: tuple[str, ...] = ()  # fake distributions to put on the path
    stdout: str | None = None  # a file to send stdout to (e.g. /dev/full)
    timeout: float | None = None  # seconds, when the default is too short (torch.compile)


# ------------------------------------------------------------------ fake distributions

HEADER = "import torch\nfrom torch import nn\nfrom lmcore import Arg, Component, Preset, hookimpl\n"
NORM = "from lmcore_rmsnorm import RMSNorm\n"

SITES: dict[str, dict[str, object]] = {
    # name: {"dist": distribution name, "eps": {entry point: module}, "modules": {...}}
    "unrelated-bad-ep": {
        "dist": "unrelated-tool",
        "raw_entry_points": "[console_scripts]\nbroken-line-without-equals\n",
        "modules": {},
    },
    "bad-utf8": {
        "dist": "lmcore-latin",
        "metadata": b"Metadata-Version: 2.1\nName: lmcore-latin\nVersion: 1.0\nSummary: caf\xe9\n",
        "eps": {"latin": "latin_mod"},
        "modules": {
            "latin_mod": HEADER
            + NORM
            + textwrap.dedent("""
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="latin", build=RMSNorm,
                                  params=lambda d_model: d_model)]
        """)
        },
    },
    "kbint-import": {
        "dist": "lmcore-kbi",
        "eps": {"kbi": "kbi_mod"},
        "modules": {"kbi_mod": "raise KeyboardInterrupt\n"},
    },
    "kbint-hook": {
        "dist": "lmcore-kbh",
        "eps": {"kbh": "kbh_mod"},
        "modules": {
            "kbh_mod": HEADER
            + textwrap.dedent("""
            @hookimpl
            def lmcore_components():
                raise KeyboardInterrupt
        """)
        },
    },
    "faults": {
        "dist": "lmcore-faults",
        "eps": {"faults": "faults_mod"},
        "modules": {
            "faults_mod": HEADER
            + NORM
            + textwrap.dedent("""
            def boom(d_model, device=None, dtype=None):
                raise RuntimeError("factory exploded")

            def picky(d_model):
                raise TypeError("validate tripped over its own feet")

            def countless(d_model):
                raise ZeroDivisionError("division by zero")

            class Squash(nn.Module):
                def forward(self, x):
                    return x[..., :1]

            def norm(name, build=RMSNorm, **kw):
                kw.setdefault("params", lambda d_model: d_model)
                return Component(kind="norm", name=name, build=build, **kw)

            @hookimpl
            def lmcore_components():
                return [
                    norm("boom", build=boom),
                    norm("picky", validate=picky),
                    norm("countless", params=countless),
                    norm("void", build=lambda d_model: None),
                    norm("squash", build=Squash, params=lambda: 0),
                    Component(kind="ffn", name="zeroff", build=lambda d_model, d_ff: None,
                              default_d_ff=lambda d_model: 0),
                    Component(kind="ffn", name="fracff", build=lambda d_model, d_ff: None,
                              default_d_ff=lambda d_model: 1382.4),
                ]
        """)
        },
    },
    "argname": {
        "dist": "lmcore-argname",
        "eps": {"argname": "argname_mod"},
        "modules": {
            "argname_mod": HEADER
            + textwrap.dedent("""
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="odd", build=nn.Identity,
                                  args=(Arg(name=5, type=int, default=1),))]
        """)
        },
    },
    "2norms": {
        "dist": "2norms",
        "eps": {"twonorm": "twonorm_mod"},
        "modules": {
            "twonorm_mod": HEADER
            + NORM
            + textwrap.dedent("""
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="rmsnorm", build=RMSNorm,
                                  params=lambda d_model: d_model)]
        """)
        },
    },
    "my-norms": {
        "dist": "my norms",
        "eps": {"mynorm": "mynorm_mod"},
        "modules": {
            "mynorm_mod": HEADER
            + NORM
            + textwrap.dedent("""
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="rmsnorm", build=RMSNorm,
                                  params=lambda d_model: d_model)]
        """)
        },
    },
    "other-rmsnorm-ep": {
        "dist": "other-norms",
        "eps": {"rmsnorm": "othernorm_mod"},
        "modules": {
            "othernorm_mod": HEADER
            + NORM
            + textwrap.dedent("""
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="rmsnorm", build=RMSNorm,
                                  params=lambda d_model: d_model)]
        """)
        },
    },
    "quiet": {
        "dist": "lmcore-quiet",
        "eps": {"quiet": "quiet_mod"},
        "modules": {
            "quiet_mod": HEADER
            + textwrap.dedent("""
            torch.set_default_dtype(torch.float64)

            @hookimpl
            def lmcore_components():
                return []
        """)
        },
    },
    "sleepy": {
        "dist": "lmcore-sleepy",
        "eps": {"sleepy": "sleepy_mod"},
        "modules": {"sleepy_mod": "import time\ntime.sleep(4)\n"},
    },
}


def make_site(root: Path, name: str) -> Path:
    spec = SITES[name]
    site = root / name
    dist = str(spec["dist"])
    info = site / f"{dist.replace('-', '_').replace(' ', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    metadata = spec.get("metadata") or f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n"
    (info / "METADATA").write_bytes(
        metadata if isinstance(metadata, bytes) else str(metadata).encode()
    )
    raw = spec.get("raw_entry_points")
    if raw is None:
        eps = dict(spec.get("eps", {}))  # type: ignore[call-overload]
        raw = "[lmcore]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
    (info / "entry_points.txt").write_text(str(raw), encoding="utf-8")
    for mod, source in dict(spec["modules"]).items():  # type: ignore[call-overload]
        (site / f"{mod}.py").write_text(str(source), encoding="utf-8")
    return site


# ------------------------------------------------------------------ the cases

BIG = 10**40
ARGS_100K = "' + ', '.join(f'a{i}=1' for i in range(100_000)) + '"
THREADS = textwrap.dedent("""
    import threading, lmcore
    errors, barrier = [], threading.Barrier(8)
    def go():
        barrier.wait()
        try:
            lmcore.parse_spec("tinystories")
        except Exception as e:
            errors.append(e)
    ts = [threading.Thread(target=go) for _ in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(f"{len(errors)} of 8 threads failed" + (f": {errors[0]}" if errors else ""))
""")
TIED = textwrap.dedent("""
    import torch, lmcore
    cs336 = lmcore.build_model("cs336-tiny").state_dict()
    tied = lmcore.build_model("cs336-tiny, tie_embeddings=true")
    tied.load_state_dict(cs336, strict=True)
    same = torch.equal(tied.token_embeddings.weight, cs336["token_embeddings.weight"])
    print("loaded; embedding kept:", same)
""")


def model_case(call: str) -> str:
    return textwrap.dedent(f"""
        import torch, lmcore
        m = lmcore.build_model("cs336-tiny")
        out = {call}
        print("returned", tuple(out.shape), "finite:", bool(torch.isfinite(out).all()))
    """)


def compiled(backend: str, token: int) -> str:
    return textwrap.dedent(f"""
        import torch, lmcore
        torch.manual_seed(0)
        m = lmcore.build_model("cs336-tiny")
        ids = torch.zeros(1, 4, dtype=torch.long); ids[0, 1] = {token}
        c = torch.compile(m, backend="{backend}")
        out = c(ids)
        print("returned logits; equal to id 9999's:",
              torch.allclose(out[0, 1], m(torch.tensor([[0, 9999, 0, 0]]))[0, 1]))
    """)


def cases() -> list[Case]:
    sp = "lmcore.parse_spec"
    return [
        Case("peer", "build cs336-tiny on meta (the least a command costs)",
             ["build", "cs336-tiny", "--device", "meta"]),
        Case("R1", "describe gpt2-small, d_model=2**40", ["describe", "gpt2-small, d_model=1099511627776"]),
        Case("R2", "rmsnorm(a0=1, ..., a99999=1): 0.9 MB of arguments",
             code=f"{sp}('tinystories, norm=rmsnorm({ARGS_100K})')"),
        Case("R2b", "a 1 MB quoted string", code=f"{sp}('tinystories, norm=rmsnorm(eps=\"' + 'x' * 10**6 + '\")')"),
        Case("R3", "8 threads parse_spec('tinystories') at once", code=THREADS),
        Case("R4a", "build tinystories, num_layers=1000000", ["build", "tinystories, num_layers=1000000"]),
        Case("R4b", "... --device meta", ["build", "tinystories, num_layers=1000000", "--device", "meta"]),
        Case("R4c", "build d_model=1000000000", ["build", "tinystories, d_model=1000000000"]),
        Case("R4d", "build vocab_size=2**40", ["build", "tinystories, vocab_size=1099511627776"]),
        Case("R4e", "build d_ff=10**12", ["build", "tinystories, d_ff=1000000000000"]),
        Case("R4f", "build d_model=10**40", ["build", f"tinystories, d_model={BIG}"]),
        Case("R5a", "build pos=sinusoidal, context_length=2000000 on meta",
             ["build", "tinystories, pos=sinusoidal, context_length=2000000", "--device", "meta"]),
        Case("R5b", "describe gpt2-xl, context_length=10000000", ["describe", "gpt2-xl, context_length=10000000"]),
        Case("R5c", "describe gpt2-xl (its peer)", ["describe", "gpt2-xl"]),
        Case("R6a", "rope(theta=<401 digits>)", code=f"{sp}('tinystories, pos=rope(theta=1' + '0' * 400 + ')')"),
        Case("R6b", "SwiGLU default width of a 400-digit d_model",
             code=f"{sp}('vocab_size=10, context_length=8, num_layers=1, num_heads=1, d_model=1' + '0' * 399)"),
        Case("R6c", "a 5000-digit integer", code=f"{sp}('tinystories, d_model=' + '1' * 5000)"),
        Case("R7a", "plugin default_d_ff returning 0", sites=("faults",),
             code=f"s = {sp}('cs336-tiny, ffn=zeroff'); print(s.d_ff); {sp}(str(s)); print('round trip ok')"),
        Case("R7b", "plugin default_d_ff returning 1382.4", sites=("faults",),
             code=f"print({sp}('cs336-tiny, ffn=fracff').d_ff)"),
        Case("R8a", "a (0, 8) batch", code=model_case("m(torch.zeros(0, 8, dtype=torch.long))")),
        Case("R8b", "int8 ids", code=model_case("m(torch.zeros(1, 8, dtype=torch.int8))")),
        Case("R8c", "int16 positions",
             code=model_case("m(torch.zeros(1, 8, dtype=torch.long), torch.arange(8, dtype=torch.int16))")),
        Case("R8d", "positions as a list", code=model_case("m(torch.zeros(1, 4, dtype=torch.long), [0, 1, 2, 3])")),
        Case("R8e", "0-D positions", code=model_case("m(torch.zeros(1, 1, dtype=torch.long), torch.tensor(0))")),
        Case("R8f", "complex positions",
             code=model_case("m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(4, dtype=torch.complex64))")),
        Case("R8g", "sparse ids", code=model_case("m(torch.zeros(1, 4, dtype=torch.long).to_sparse())")),
        Case("R8h", "ids on meta, model on cpu", code=model_case("m(torch.zeros(1, 4, dtype=torch.long, device='meta'))")),
        Case("R8i", "build_model(dtype=torch.int64)", code="import torch, lmcore; lmcore.build_model('cs336-tiny', dtype=torch.int64)"),
        Case("R9a", "compiled (eager backend), id -1", code=compiled("eager", -1)),
        Case("R9b", "compiled (inductor), id -1", code=compiled("inductor", -1), timeout=120),
        Case("R9c", "compiled (inductor), id 10000", code=compiled("inductor", 10000), timeout=120),
        Case("R10a", "build --device bogus", ["build", "cs336-tiny", "--device", "bogus"]),
        Case("R10b", "build --device cuda (CPU torch)", ["build", "cs336-tiny", "--device", "cuda"]),
        Case("R10c", "run --batch 10**12", ["run", "tinystories", "--batch", "1000000000000"]),
        Case("R10d", "run --seed 2**70", ["run", "cs336-tiny", "--steps", "1", "--seed", "1180591620717411303424"]),
        Case("R10e", "LMCORE_STRICT_PLUGINS=maybe", ["build", "cs336-tiny"], env={"LMCORE_STRICT_PLUGINS": "maybe"}),
        Case("R10f", "LMCORE_DISABLE_PLUGIN_AUTOLOAD=2", ["plugins"], env={"LMCORE_DISABLE_PLUGIN_AUTOLOAD": "2"}),
        Case("R10g", "plugins > /dev/full", ["plugins"], stdout="/dev/full"),
        Case("R10h", "describe, PYTHONIOENCODING=ascii", ["describe", "cs336-tiny"], env={"PYTHONIOENCODING": "ascii"}),
        Case("R10i", "run, PYTHONIOENCODING=ascii", ["run", "cs336-tiny", "--steps", "1"], env={"PYTHONIOENCODING": "ascii"}),
        Case("R11a", "an unrelated dist with a malformed entry_points.txt", ["build", "cs336-tiny"], sites=("unrelated-bad-ep",)),
        Case("R11b", "invalid UTF-8 in a plugin's METADATA", ["build", "cs336-tiny, norm=latin"], sites=("bad-utf8",)),
        Case("R11c", "KeyboardInterrupt at a plugin's import", ["build", "cs336-tiny"], sites=("kbint-import",)),
        Case("R11d", "KeyboardInterrupt in a plugin's hook", ["build", "cs336-tiny"], sites=("kbint-hook",)),
        Case("R12a", "a factory that raises", ["build", "cs336-tiny, norm=boom"], sites=("faults",)),
        Case("R12b", "validate raising TypeError", ["build", "cs336-tiny, norm=picky"], sites=("faults",)),
        Case("R12c", "a params declaration that raises", ["describe", "cs336-tiny, norm=countless"], sites=("faults",)),
        Case("R12d", "a factory returning None", ["run", "cs336-tiny, norm=void", "--steps", "1"], sites=("faults",)),
        Case("R12e", "a norm that changes the shape: describe", ["describe", "cs336-tiny, norm=squash"], sites=("faults",)),
        Case("R12f", "... describe --measure", ["describe", "cs336-tiny, norm=squash", "--measure"], sites=("faults",)),
        Case("R12g", "... run", ["run", "cs336-tiny, norm=squash", "--steps", "1"], sites=("faults",)),
        Case("R12h", "Arg(name=5)", ["plugins"], sites=("argname",)),
        Case("R13a", "dist '2norms': the suggestion", ["build", "cs336-tiny"], sites=("2norms",)),
        Case("R13b", "... typed as suggested", ["build", 'cs336-tiny, norm="2norms":rmsnorm'], sites=("2norms",)),
        Case("R13c", "dist 'my norms', typed as suggested", ["build", 'cs336-tiny, norm="my norms":rmsnorm'], sites=("my-norms",)),
        Case("R13d", "LMCORE_DISABLE_PLUGINS=rmsnorm, two dists", ["build", "cs336-tiny"],
             env={"LMCORE_DISABLE_PLUGINS": "rmsnorm"}, sites=("other-rmsnorm-ep",)),
        Case("R13e", "LMCORE_DISABLE_PLUGINS=other-norms:rmsnorm", ["build", "cs336-tiny"],
             env={"LMCORE_DISABLE_PLUGINS": "other-norms:rmsnorm"}, sites=("other-rmsnorm-ep",)),
        Case("R14a", "a plugin that sets float64 and declares nothing: plugins", ["plugins"], sites=("quiet",)),
        Case("R14b", "... and build", code="import lmcore; print(lmcore.build_model('cs336-tiny').lm_head.weight.dtype)",
             sites=("quiet",)),
        Case("R14c", "a plugin that sleeps 4 s at import", ["build", "cs336-tiny"], sites=("sleepy",)),
        Case("R15", "CS336 state dict into tie_embeddings=true", code=TIED),
    ]  # fmt: skip


# ------------------------------------------------------------------ running


def run(
    case: Case, root: Path, timeout: float, pythonpath: list[str]
) -> tuple[str, float, float, str]:
    script = shutil.which("lmcore", path=str(Path(sys.executable).parent))
    if case.argv is not None:
        command = [script or "lmcore", *case.argv]
    else:
        wrapped = (
            "import lmcore\ntry:\n"
            + textwrap.indent(textwrap.dedent(case.code or ""), "    ")
            + "\nexcept BaseException as e:\n"
            "    line = (str(e).splitlines() or [''])[0]\n"
            "    print(f'{type(e).__name__}: {line}')\n"
        )
        command = [sys.executable, "-c", wrapped]
    paths = [*pythonpath, *(str(make_site(root / case.id, s)) for s in case.sites)]
    env = {**os.environ, **case.env}
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out_file = open(case.stdout, "w") if case.stdout else subprocess.PIPE  # noqa: SIM115
    start = time.perf_counter()
    # From a directory of its own: `python -c` would otherwise import ./lmcore of the checkout.
    proc = _Popen(command, env=env, stdout=out_file, stderr=subprocess.PIPE, cwd=root)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "timeout", timeout, float("nan"), f"still running after {timeout:.0f} s (killed)"
    finally:
        if case.stdout:
            out_file.close()  # type: ignore[union-attr]
    seconds = time.perf_counter() - start
    # Peak RSS of that child alone: ru_maxrss of RUSAGE_CHILDREN is a max over all of them.
    rss = _child_rss(proc)
    text = (err if case.argv is not None else out or err).decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if case.argv is not None and proc.returncode == 0 and out:
        # A warning on stderr says more than the output; else the output's last line.
        lines = (
            lines[:1]
            or [line for line in out.decode(errors="replace").splitlines() if line.strip()][-1:]
        )
    shown = lines[0] if len(lines) == 1 or proc.returncode in (0, 2) else _last_error(lines)
    return str(proc.returncode), seconds, rss, shown


def _child_rss(proc: subprocess.Popen[bytes]) -> float:
    return getattr(proc, "_rss_mb", float("nan"))


def _last_error(lines: list[str]) -> str:
    """For a traceback, its last line (the exception); else the first."""
    if any(line.startswith("Traceback") for line in lines):
        return "traceback: " + lines[-1]
    return lines[0] if lines else ""


class _Popen(subprocess.Popen):  # type: ignore[type-arg]
    """Popen that records the child's own peak RSS from wait4."""

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0
        if pid:
            self._rss_mb = usage.ru_maxrss / 1024
        return pid, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--only", nargs="*", default=[], help="case ids, e.g. R4a R10")
    parser.add_argument("--pythonpath", help="a checkout to run instead of the installed lmcore")
    args = parser.parse_args()
    extra = [args.pythonpath, str(Path(args.pythonpath) / "plugins")] if args.pythonpath else []
    chosen = [c for c in cases() if not args.only or any(c.id.startswith(o) for o in args.only)]
    print("| case | input | exit | s | peak RSS MB | outcome |\n|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in chosen:
            code, seconds, rss, shown = run(case, Path(tmp), case.timeout or args.timeout, extra)
            shown = shown.replace("|", "\\|")
            if len(shown) > SHOW:
                shown = shown[: SHOW - 3] + "..."
            print(f"| {case.id} | {case.what} | {code} | {seconds:.2f} | {rss:.0f} | {shown} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
