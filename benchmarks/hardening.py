# ruff: noqa: E501  (the table of cases reads best one case a line)
"""Every hostile-input reproduction (no input may hang, crash or silently mislead), run as written.

    python benchmarks/hardening.py [--timeout 30] [--only R4] [--pythonpath DIR] [--before DIR]
                                   [--max-rss-mb 3000]

Each case runs in a fresh process (the CLI through the installed `lmcore` script, the rest
through `python -c`), with the fake distributions it needs on PYTHONPATH. The table gives the
exit status, the wall-clock seconds, the peak RSS of that process and the first line of what it
said (stderr for the CLI, the printed outcome for Python snippets). `lmcore build cs336-tiny
--device meta` and `python -c "import lmcore.model.transformer"` are timed too: the least a command costs.

A case runs in a session of its own; every 0.2 s the resident memory of it and of every process
it started is read from /proc, and all of them are killed ("killed at N MB") when together they
hold more than --max-rss-mb (0: no limit), when the case's timeout passes ("timeout"), and
when the case has ended (what it left running). Peak RSS is the larger of the process's own
(wait4) and of those readings. A case may feed its stdin (bytes, a file, or closed).

`--pythonpath DIR` puts DIR (and DIR/plugins) first on the children's path, to run the same
cases against another checkout (e.g. `git archive main | tar -x -C /tmp/base`); `--before DIR`
runs each case against DIR first and prints one before -> after table. The H cases (files,
runs and data directories, checkpoint integrity, the command-line contract) prepare their
files first; H3, H5f's generation aside, H6a-b, H7k and H8e-f need transformers (the test
extra), H7a-b mount a 2 MB tmpfs (root only; else they report the setup's error).

Never run by the test suite; the tests reproduce each case on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHOW = 110  # characters of the outcome shown per row


@dataclass
class Case:
    id: str
    what: str
    argv: list[str] | None = None  # lmcore CLI arguments
    code: str | None = None  # a Python snippet
    env: dict[str, str] = field(default_factory=dict)
    sites: tuple[str, ...] = ()  # fake distributions to put on the path
    stdout: str | None = None  # a file to send stdout to (e.g. /dev/full), or "closed"
    stdin: str | bytes | None = None  # bytes to send, a file to read, "closed"; None: inherited
    timeout: float | None = None  # seconds, when the default is too short (torch.compile)
    setup: str | None = None  # Python run first in the case's directory (PRELUDE's helpers)
    teardown: str | None = None  # Python run after it, whatever happened


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


# ------------------------------------------------------------------ files, runs and data
# The cases below reproduce "Nothing lost, nothing silently wrong": run and data directories,
# overwrites, checkpoint integrity, confinement and the command-line contract. Each prepares
# its files with PRELUDE's helpers (run with the checkout under test), then runs as written.

S = "vocab_size=300, context_length=32, d_model=32, num_layers=1, num_heads=2"
TRAIN = ["--steps", "100000", "--batch-size", "2", "--eval-every", "0", "--eval-batches", "1",
         "--save-every", "1", "--keep", "0", "--log-every", "1"]  # fmt: skip
PRELUDE = textwrap.dedent(f"""
    import json, os, shutil, signal, struct, subprocess, sys, time
    from pathlib import Path
    S = {S!r}
    TRAIN = {TRAIN!r}
    LMCORE = str(Path(sys.executable).parent / "lmcore")

    def text(root="text", n=24):
        root = Path(root); root.mkdir(exist_ok=True)
        for i in range(n):
            lines = [f"def f{{(i + k) % 5}}(x):\\n    return x * {{k % 3}} + {{(i * k) % 4}}\\n"
                     for k in range(12)]
            (root / f"doc{{i:02d}}.py").write_text("".join(lines))
        return root

    def data(out="d300"):
        subprocess.run([LMCORE, "data", "prepare", str(text()), "--out", out, "--vocab-size",
                        "300", "--val-fraction", "0.2", "--split-block", "64"], check=True,
                       capture_output=True)
        return out

    def words(path, mb):  # mb megabytes of random words, slow enough to overlap another run
        import random
        rng = random.Random(0)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for _ in range(mb * 100):
                f.write(" ".join("".join(rng.choices("abcdefgh", k=rng.randint(1, 8)))
                                 for _ in range(2000)) + "\\n")

    def ckpt(path="m.safetensors", spec=S, change=None):
        import torch, lmcore
        torch.manual_seed(0)
        model = lmcore.build_model(spec)
        if change:
            with torch.no_grad():
                change(model)
        return str(model.save(path))

    def edit(src, out, header=None, data=None):  # the bytes changed, the checksums not
        raw = Path(src).read_bytes(); (n,) = struct.unpack("<Q", raw[:8])
        h, body = json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])
        header and header(h); data and data(h, body)
        t = json.dumps(h).encode(); t += b" " * (-len(t) % 8)
        Path(out).write_bytes(struct.pack("<Q", len(t)) + t + bytes(body))

    def llama(d, shard=False):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=32, rms_norm_eps=1e-5)
        m = LlamaForCausalLM(cfg)
        m.save_pretrained(d, max_shard_size="20KB" if shard else "5GB")
        m.generation_config.save_pretrained(d)

    def background(*argv, wait_for=None, seconds=60):  # a second process, recorded for teardown
        p = subprocess.Popen([LMCORE, *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        Path("background.pid").write_text(str(p.pid))
        end = time.time() + seconds
        while wait_for is not None and not wait_for() and time.time() < end:
            time.sleep(0.2)
        return p

    def stop_background():
        f = Path("background.pid")
        if f.exists():
            try:
                os.kill(int(f.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def running(run):
        try:
            return json.loads(Path(run, "run.json").read_text())["status"]["state"] == "running"
        except Exception:
            return False

    def tmpfs(d, size="2m"):  # a small full-able disk; needs root
        Path(d).mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={{size}}", "tmpfs", d], check=True)
""")


def integrity(tensor_change: str) -> str:
    return f"data(); ckpt(); edit('m.safetensors', 'bad.safetensors', {tensor_change})"


FLIP = "data=lambda h, b: b.__setitem__(h['lm_head.weight']['data_offsets'][0] + 100, 0)"
NAN_BYTES = ("data=lambda h, b: b.__setitem__(slice(h['ln_final.weight']['data_offsets'][0], "
             "h['ln_final.weight']['data_offsets'][0] + 4), struct.pack('<f', float('nan')))")  # fmt: skip
SWAP = textwrap.dedent("""
    def swap(h):
        q, k = h['layers.0.attn.q_proj.weight'], h['layers.0.attn.k_proj.weight']
        q['data_offsets'], k['data_offsets'] = k['data_offsets'], q['data_offsets']
    data(); ckpt(); edit('m.safetensors', 'bad.safetensors', header=swap)
""")
TIE = ("data(); ckpt(); edit('m.safetensors', 'bad.safetensors', header=lambda h: "
       "h['__metadata__'].__setitem__('lmcore.tied', json.dumps({'lm_head.weight': "
       "'token_embeddings.weight'})))")  # fmt: skip
INT32 = textwrap.dedent("""
    import torch
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    ckpt()
    with safe_open('m.safetensors', 'pt') as f:
        meta = dict(f.metadata())
    t = load_file('m.safetensors'); t['ln_final.weight'] = torch.full((32,), 2, dtype=torch.int32)
    if 'lmcore.checksums' in meta:  # a file consistent in itself: only the dtype is wrong
        from lmcore.model.saving import checksums_json
        meta['lmcore.checksums'] = checksums_json(t)
    save_file(t, 'bad.safetensors', metadata=meta)
""")
NAN_SAVED = (
    "data(); ckpt('nan.safetensors', change=lambda m: m.ln_final.weight.fill_(float('nan')))"
)
SHARD = textwrap.dedent("""
    llama('hf', shard=True)
    index = Path('hf/model.safetensors.index.json'); d = json.loads(index.read_text())
    last = sorted(set(d['weight_map'].values()))[-1]
    Path('hf', last).rename('other.safetensors')
    target = {target!r} or str(Path('other.safetensors').resolve())
    d['weight_map'] = {{k: target if v == last else v for k, v in d['weight_map'].items()}}
    index.write_text(json.dumps(d))
""")
META_EDIT = "data(); m = json.loads(Path('d300/meta.json').read_text()); {0}; Path('d300/meta.json').write_text(json.dumps(m))"
KILLED_PREPARE = textwrap.dedent("""
    words('big/a.txt', 30)
    p = subprocess.Popen([LMCORE, 'data', 'prepare', 'big', '--out', 'out', '--vocab-size', '300'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def growing():  # a temporary token file being written: the encoding pass is under way
        return [q for q in Path('.').rglob('*.tmp') if q.is_file() and q.stat().st_size > 0]
    end = time.time() + 100
    while not growing() and time.time() < end and p.poll() is None:
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL); p.wait()
    killed = sum(q.stat().st_size for q in growing())
    r = subprocess.run([LMCORE, 'data', 'prepare', str(text()), '--out', 'out', '--vocab-size',
                        '300', '--force'], capture_output=True, text=True)
    left = [str(q) for q in Path('.').rglob('*.tmp')]
    print(f"killed with {killed:,} bytes of temporary files; the next prepare exit "
          f"{r.returncode}; left: {len(left)} ({sum(Path(q).stat().st_size if Path(q).is_file() else 0 for q in left):,} bytes)")
""")


def file_cases() -> list[Case]:
    return [
        Case("H1a", "train --resume RUN while RUN trains", ["train", "--resume", "runs/dual", "--steps", "100000"],
             setup="data(); background('train', S, '--data', 'd300', '--out', 'runs/dual', *TRAIN, wait_for=lambda: running('runs/dual'))",
             teardown="stop_background()", timeout=20),
        Case("H1b", "data prepare into DIR while another prepares it",
             ["data", "prepare", "text", "--out", "shared", "--vocab-size", "300"],
             setup="text(); words('big/a.txt', 30); background('data', 'prepare', 'big', '--out', 'shared', '--vocab-size', '300'); time.sleep(3)",
             teardown="stop_background()", timeout=60),
        Case("H2", "prepare --force from a non-UTF-8 path over good data",
             ["data", "prepare", os.fsdecode(b"src/dir\xff"), "--out", "d300", "--vocab-size", "300", "--force"],
             setup="data(); shutil.copytree('text', os.fsdecode(b'src/dir\\xff'))",
             teardown="print(sorted(os.listdir('d300')))"),
        Case("H3a", "convert --to-hf into a copy of another model's directory", ["convert", "--to-hf", "m.safetensors", "hf"],
             setup="ckpt(); llama('hf')", teardown="print(sorted(os.listdir('hf')))"),
        Case("H3b", "convert --to-hf into a directory with an unrelated config.json", ["convert", "--to-hf", "m.safetensors", "u"],
             setup="ckpt(); Path('u').mkdir(); Path('u/config.json').write_text('{}')"),
        Case("H4", "prepare 50 MB of letters without whitespace",
             ["data", "prepare", "nows", "--out", "d", "--vocab-size", "10000"], timeout=300,
             setup="import numpy as np; Path('nows').mkdir(); Path('nows/a.txt').write_bytes(np.random.default_rng(0).integers(97, 123, 50_000_000, dtype=np.uint8).tobytes())"),
        Case("H5a", "a flipped byte in lm_head.weight: load", code="lmcore.load('bad.safetensors'); print('loaded')", setup=integrity(FLIP)),
        Case("H5b", "a NaN written into ln_final's bytes: load", code="lmcore.load('bad.safetensors'); print('loaded')", setup=integrity(NAN_BYTES)),
        Case("H5c", "q_proj and k_proj offsets swapped: load", code="lmcore.load('bad.safetensors'); print('loaded')", setup=SWAP),
        Case("H5d", "lmcore.tied added to an untied model: load",
             code="import torch; m = lmcore.load('bad.safetensors'); print('loaded; lm_head kept:', torch.equal(m.lm_head.weight, lmcore.load('m.safetensors').lm_head.weight))",
             setup=TIE),
        Case("H5e", "an int32 tensor: load", code="m = lmcore.load('bad.safetensors'); print('loaded as', m.ln_final.weight.dtype)", setup=INT32),
        Case("H5f", "NaN in ln_final (saved so): greedy generate",
             ["generate", "nan.safetensors", "--prompt-ids", "1,2", "--temperature", "0", "--max-new-tokens", "4", "--tokenizer", "d300/tokenizer.json"],
             setup=NAN_SAVED),
        Case("H6a", "an index naming /abs/other.safetensors: --from-hf", ["convert", "--from-hf", "hf", "out.safetensors"], setup=SHARD.format(target=None)),
        Case("H6b", "an index naming ../other.safetensors: --from-hf", ["convert", "--from-hf", "hf", "out.safetensors"], setup=SHARD.format(target="../other.safetensors")),
        Case("H6c", "meta.json's train split an absolute path elsewhere: train", ["train", S, "--data", "d300", "--out", "r", "--steps", "1"],
             setup=META_EDIT.format("shutil.copy('d300/train.bin', 'elsewhere.bin'); m['splits']['train']['file'] = str(Path('elsewhere.bin').resolve())")),
        Case("H7a", "a checkpoint save onto a full disk (2 MB tmpfs)", ["train", S.replace("d_model=32", "d_model=256"), "--data", "d300", "--out", "full/run", "--steps", "3", "--batch-size", "2", "--eval-batches", "1", "--save-every", "1"],
             setup="data(); tmpfs('full')", teardown="subprocess.run(['umount', 'full'])"),
        Case("H7b", "build --save onto a full disk (2 MB tmpfs)", ["build", "vocab_size=2000, context_length=32, d_model=512, num_layers=1, num_heads=2", "--save", "full/m.safetensors"],
             setup="tmpfs('full')", teardown="subprocess.run(['umount', 'full'])"),
        Case("H7c", "data prepare --vocab-size 1000000000", ["data", "prepare", "text", "--out", "d", "--vocab-size", "1000000000"], setup="text()"),
        Case("H7d", "train --batch-size 1000000000", ["train", S, "--data", "d300", "--out", "r", "--batch-size", "1000000000"],
             setup="data()", teardown="print('run left:', os.path.exists('r'))"),
        Case("H7e", "generate --temperature 1e-40", ["generate", "m.safetensors", "--prompt-ids", "1,2", "--temperature", "1e-40", "--max-new-tokens", "3"], setup="ckpt()"),
        Case("H7f", "generate --temperature 5e-324", ["generate", "m.safetensors", "--prompt-ids", "1,2", "--temperature", "5e-324", "--max-new-tokens", "3"], setup="ckpt()"),
        Case("H7g", "invalid UTF-8 in --prompt", ["generate", "m.safetensors", "--prompt", os.fsdecode(b"a\xffb"), "--tokenizer", "d300/tokenizer.json"], setup="data(); ckpt()"),
        Case("H7h", "generate with stdout closed", ["generate", "m.safetensors", "--prompt-ids", "1,2", "--max-new-tokens", "2"], setup="ckpt()", stdout="closed"),
        Case("H7i", "plugins with stdout closed", ["plugins"], stdout="closed"),
        Case("H7j", "lmcore.components nested 50,000 deep: describe", ["describe", "bad.safetensors"],
             setup="ckpt(); edit('m.safetensors', 'bad.safetensors', header=lambda h: h['__metadata__'].__setitem__('lmcore.components', '[' * 50000 + ']' * 50000))"),
        Case("H7k", "config.json nested 100,000 deep: --from-hf", ["convert", "--from-hf", "hf", "o.safetensors"],
             setup="llama('hf'); Path('hf/config.json').write_text('{\"a\": ' * 100000 + '1' + '}' * 100000)"),
        Case("H8a", "meta.json eot_id = vocab_size: train", ["train", S, "--data", "d300", "--out", "r", "--steps", "1"],
             setup=META_EDIT.format("m['eot_id'] = m['vocab_size']")),
        Case("H8b", "a spec vocab of 200 on 277-token data", ["train", S.replace("vocab_size=300", "vocab_size=200"), "--data", "d300", "--out", "r"], setup="data()"),
        Case("H8c", "a self-looping symlink as SOURCE", ["data", "prepare", "self", "--out", "d"], setup="Path('a.txt').write_text('x'); os.symlink('self', 'self')"),
        Case("H8d", "build --save onto a directory", ["build", S, "--save", "adir"], setup="Path('adir').mkdir()"),
        Case("H8e", "rms_norm_eps NaN in config.json: --from-hf", ["convert", "--from-hf", "hf", "o.safetensors"],
             setup="llama('hf'); c = json.loads(Path('hf/config.json').read_text()); c['rms_norm_eps'] = float('nan'); Path('hf/config.json').write_text(json.dumps(c))"),
        Case("H8f", "missing + extra + misshapen tensors: --from-hf", ["convert", "--from-hf", "hf", "o.safetensors"],
             setup="import torch; from safetensors.torch import load_file, save_file; llama('hf'); t = load_file('hf/model.safetensors'); del t['model.layers.1.mlp.up_proj.weight']; t['x.bias'] = torch.zeros(3); t['model.norm.weight'] = torch.ones(31); save_file(t, 'hf/model.safetensors', metadata={'format': 'pt'})"),
        Case("H8h", "a prompt longer than the context", ["generate", "m.safetensors", "--prompt-ids", ",".join(["1"] * 40)], setup="ckpt()"),
        Case("H8i", "an ANSI escape in lmcore.lmcore_version: describe", ["describe", "bad.safetensors"],
             setup="ckpt(); edit('m.safetensors', 'bad.safetensors', header=lambda h: h['__metadata__'].__setitem__('lmcore.lmcore_version', '\x1b[31mred\x1b[0m' + '9' * 1000))"),
        Case("H8j", "a SIGKILLed prepare, then prepare --force", code=KILLED_PREPARE, timeout=120),
        Case("H8k", "train into a stub run left by a killed start", ["train", S, "--data", "d300", "--out", "r", "--steps", "1", "--eval-batches", "1"],
             setup="data(); Path('r').mkdir(); Path('r/run.json').write_text(json.dumps({'format': 'lmcore-run', 'version': 1, 'tag': 't', 'status': {'state': 'starting'}}))"),
        Case("H8l", "meta vocab 100 with a 277-token tokenizer: train", ["train", S, "--data", "d300", "--out", "r", "--steps", "1", "--eval-batches", "1"],
             setup=META_EDIT.format("m['vocab_size'] = 100")),
    ]  # fmt: skip


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
        *file_cases(),
    ]  # fmt: skip


# ------------------------------------------------------------------ running

POLL_S = 0.2  # how often the memory of a case's processes is read
MAX_RSS_MB = 3000.0  # a case whose processes together hold more is killed (--max-rss-mb)
SETUP_TIMEOUT = 300.0  # seconds for a case's setup or teardown


def run(
    case: Case,
    root: Path,
    timeout: float,
    pythonpath: list[str],
    max_rss_mb: float = MAX_RSS_MB,
) -> tuple[str, float, float, str]:
    script = shutil.which("lmcore", path=str(Path(sys.executable).parent))
    if case.argv is not None:
        command = [script or "lmcore", *case.argv]
    else:
        wrapped = (
            PRELUDE
            + "import lmcore\ntry:\n"
            + textwrap.indent(textwrap.dedent(case.code or ""), "    ")
            + "\nexcept BaseException as e:\n"
            "    line = (str(e).splitlines() or [''])[0]\n"
            "    print(f'{type(e).__name__}: {line}')\n"
        )
        command = [sys.executable, "-c", wrapped]
    # From a directory of its own: `python -c` would otherwise import ./lmcore of the checkout.
    here = root / case.id
    here.mkdir(parents=True, exist_ok=True)
    paths = [*pythonpath, *(str(make_site(here, s)) for s in case.sites)]
    env = {**os.environ, **case.env}
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if case.setup is not None:
        done = supervise([sys.executable, "-c", PRELUDE + case.setup], env, here,
                         SETUP_TIMEOUT, max_rss_mb, leave=True)  # fmt: skip
        if done.returncode != 0:
            said = done.err.decode(errors="replace").splitlines()
            return "setup", 0.0, done.rss, done.problem or _last_error(said)
    try:
        code, seconds, rss, shown = _run(case, command, env, here, timeout, max_rss_mb)
    finally:
        after = ""
        if case.teardown is not None:
            done = supervise([sys.executable, "-c", PRELUDE + case.teardown], env, here,
                             SETUP_TIMEOUT, max_rss_mb)  # fmt: skip
            after = done.problem or done.out.decode(errors="replace").strip().replace("\n", "; ")
    return code, seconds, rss, shown + (f" [then: {after}]" if after else "")


def _run(
    case: Case, command: list[str], env: dict[str, str], here: Path, timeout: float,
    max_rss_mb: float = MAX_RSS_MB,
) -> tuple[str, float, float, str]:  # fmt: skip
    done = supervise(command, env, here, timeout, max_rss_mb, stdin=case.stdin,
                     stdout=case.stdout)  # fmt: skip
    text = (done.err if case.argv is not None else done.out or done.err).decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if done.killed_mb is not None or done.timed_out:
        traceback = any(line.startswith("Traceback") for line in lines[-60:])
        said = f"; its last line: {'traceback: ' * traceback}{lines[-1]}" if lines else ""
        if done.killed_mb is not None:
            return "killed", done.seconds, done.rss, done.problem + said
        return "timeout", timeout, done.rss, done.problem + said
    if case.argv is not None and done.returncode == 0 and done.out:
        # A warning on stderr says more than the output; else the output's last line.
        lines = (
            lines[:1]
            or [line for line in done.out.decode(errors="replace").splitlines() if line.strip()][
                -1:
            ]
        )
    shown = lines[0] if len(lines) == 1 or done.returncode in (0, 2) else _last_error(lines)
    return str(done.returncode), done.seconds, done.rss, shown


@dataclass
class Done:
    """How a supervised command ended; `rss`: the peak MB of it and its descendants together."""

    returncode: int
    out: bytes
    err: bytes
    seconds: float
    rss: float
    timed_out: bool = False
    killed_mb: float | None = None  # the memory it held when killed for holding too much

    @property
    def problem(self) -> str:
        if self.killed_mb is not None:
            return (
                f"killed at {self.killed_mb:.0f} MB (over --max-rss-mb) after {self.seconds:.0f} s"
            )
        if self.timed_out:
            return f"still running after {self.seconds:.0f} s (killed)"
        return ""


def supervise(
    command: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    max_rss_mb: float = MAX_RSS_MB,
    *,
    stdin: str | bytes | None = None,
    stdout: str | None = None,
    leave: bool = False,
) -> Done:
    """Run `command` in a session of its own, reading the memory of it and every process it
    starts every POLL_S seconds: all of them are killed past `timeout` seconds, when together
    they hold more than `max_rss_mb` (0: no limit), and when the command has ended (what it
    left running; with `leave`, what it started in the background is left to run: a setup's
    second process, which its teardown stops). `stdin`: bytes to send, "closed", a file to
    read, or None (this process's); `stdout`: a file to write to (e.g. /dev/full), "closed",
    or None (captured)."""
    closed = {fd for fd, how in ((0, stdin), (1, stdout)) if how == "closed"}

    def close_fds() -> None:
        for fd in closed:
            os.close(fd)

    # Files, not pipes: a process it leaves running cannot hold the reading of its output up.
    with contextlib.ExitStack() as files:
        err_file = files.enter_context(tempfile.TemporaryFile())
        out_file: Any = None
        if stdout is None:
            out_file = files.enter_context(tempfile.TemporaryFile())
        elif stdout != "closed":
            out_file = files.enter_context(open(stdout, "wb"))
        in_file: Any = None
        if isinstance(stdin, bytes):
            in_file = files.enter_context(tempfile.TemporaryFile())
            in_file.write(stdin)
            in_file.seek(0)
        elif stdin and stdin != "closed":
            in_file = files.enter_context(open(stdin, "rb"))
        start = time.perf_counter()
        proc = _Popen(command, env=env, cwd=cwd, stdin=in_file, stdout=out_file, stderr=err_file,
                      start_new_session=True, preexec_fn=close_fds if closed else None)  # fmt: skip
        watch = _Watch(proc.pid, max_rss_mb, leave)
        watch.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            watch.kill()
            proc.wait()
        finally:
            watch.finish()
        seconds = time.perf_counter() - start

        def read(f: Any) -> bytes:
            f.seek(0)
            return bytes(f.read())

        out = read(out_file) if stdout is None else b""
        err = read(err_file)
    # ru_maxrss (from wait4) catches a peak between two readings; the readings, the children.
    rss = max(getattr(proc, "_rss_mb", 0.0), watch.peak) or float("nan")
    return Done(proc.returncode, out, err, seconds, rss, timed_out and watch.killed_mb is None,
                watch.killed_mb)  # fmt: skip


class _Watch(threading.Thread):
    """Reads /proc every POLL_S seconds for the resident memory of process `root` and of every
    process descending from it (by parent, or by session: a child whose parent died); kills
    them all when together they hold more than `cap_mb`, or once `root` has ended."""

    def __init__(self, root: int, cap_mb: float, leave: bool = False):
        super().__init__(daemon=True)
        self.root, self.cap_mb, self.leave = root, cap_mb, leave
        self.peak = 0.0
        self.killed_mb: float | None = None
        self.seen: dict[int, str] = {}  # pid -> start time (a pid may be reused)
        self._done = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def run(self) -> None:
        while not self._done.wait(POLL_S):
            members = self._members()
            mb = sum(rss for _, rss, _ in members.values()) * self._page / 2**20
            self.peak = max(self.peak, mb)
            if self.cap_mb and mb > self.cap_mb and self.killed_mb is None:
                self.killed_mb = mb
                self.kill()
            elif not self.leave and members.get(self.root, ("", 0, "Z"))[2] == "Z":
                self.kill()  # it has ended: what it left running goes too

    def _members(self) -> dict[int, tuple[str, int, str]]:
        """pid -> (start time, resident pages, state) of root and its descendants."""
        table: dict[int, tuple[int, int, str, int, str]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:
                continue
            rest = stat[stat.rindex(")") + 2 :].split()
            # state, ppid, pgrp, session, ..., starttime (field 22), vsize, rss (field 24)
            table[int(entry.name)] = (int(rest[1]), int(rest[3]), rest[19], int(rest[21]), rest[0])
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in table.items():
            children.setdefault(ppid, []).append(pid)
        found = {pid for pid, row in table.items() if row[1] == self.root} | {self.root}
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        members = {
            pid: (table[pid][2], table[pid][3], table[pid][4]) for pid in found if pid in table
        }
        for pid, (started, _, _) in members.items():
            self.seen.setdefault(pid, started)
        return members

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.root, signal.SIGKILL)
        for pid, started in self.seen.items():
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
                if stat[stat.rindex(")") + 2 :].split()[19] == started:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, IndexError):
                continue

    def finish(self) -> None:
        self._done.set()
        self.join()
        if not self.leave:
            self._members()  # the last ones started
            self.kill()


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


def _cell(text: str) -> str:
    """The outcome, its middle left out when long: the end of a message often holds the fix."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= SHOW else f"{text[: SHOW // 2 - 2]} ... {text[-(SHOW // 2 - 2) :]}"


def main(make_cases: Callable[[], list[Case]] | None = None, doc: str | None = None) -> None:
    """The command line of this script, and of others that bring their own cases."""
    doc = doc or __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--only", nargs="*", default=[], help="case ids, e.g. R4a R10")
    parser.add_argument("--pythonpath", help="a checkout to run instead of the installed lmcore")
    parser.add_argument(
        "--before", help="a checkout to run first: one table of before -> after per case"
    )
    parser.add_argument(
        "--max-rss-mb", type=float, default=MAX_RSS_MB,
        help=f"kill a case whose processes together hold more memory (default {MAX_RSS_MB:.0f}; "
        "0: no limit)",
    )  # fmt: skip
    args = parser.parse_args()

    def path(checkout: str | None) -> list[str]:
        return [checkout, str(Path(checkout) / "plugins")] if checkout else []

    every = (make_cases or cases)()
    chosen = [c for c in every if not args.only or any(c.id.startswith(o) for o in args.only)]
    cap = args.max_rss_mb
    with tempfile.TemporaryDirectory() as tmp:
        if args.before is None:
            print(
                "| case | input | exit | s | peak RSS MB | outcome |\n|---|---|---:|---:|---:|---|"
            )
        else:
            print("| case | input | before: exit, s, peak RSS MB, outcome | after: exit, s, peak RSS MB, "
                  "outcome |\n|---|---|---|---|")  # fmt: skip
        for case in chosen:
            timeout = case.timeout or args.timeout
            what = case.what.replace("|", "\\|")
            if args.before is None:
                code, seconds, rss, shown = run(
                    case, Path(tmp), timeout, path(args.pythonpath), cap
                )
                print(f"| {case.id} | {what} | {code} | {seconds:.2f} | {rss:.0f} | "
                      f"{_cell(shown)} |", flush=True)  # fmt: skip
                continue
            cells = []
            for name, checkout in (("before", args.before), ("after", args.pythonpath)):
                code, seconds, rss, shown = run(
                    case, Path(tmp) / name, timeout, path(checkout), cap
                )
                cells.append(f"{code}, {seconds:.1f} s, {rss:.0f} MB: {_cell(shown)}")
            print(f"| {case.id} | {what} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
