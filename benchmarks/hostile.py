# ruff: noqa: E501  (the table of cases reads best one case a line)
"""The hostile-input probe of issue 32, one reproduction per case: GGUF files, Hugging Face
configs and tensors, long and huge specs, chat and chat templates, `lmcore eval` and its tasks,
sweep files and launchers, trackers, concurrent writers, and a newcomer's frictions.

    python benchmarks/hostile.py [--timeout 30] [--only P-gguf] [--pythonpath DIR] [--before DIR]
                                 [--max-rss-mb 3000]

The command line, the table and the running of each case are those of `benchmarks/hardening.py`
(whose machinery this imports): a fresh process per case in a session of its own, in a directory
of its own, killed past its timeout or when it and its children hold more than --max-rss-mb
together ("killed at N MB"), with the exit status, seconds, peak RSS and first line of what it
said. `--pythonpath /path/to/checkout` runs the cases against that checkout (e.g. a `git
worktree add /tmp/base 34e2bfc`), `--before DIR` gives one before -> after table. Several
cases climb in memory without bound on the code of 34e2bfc: the cap keeps them from the
machine's memory, and cases run one at a time.

Each case writes what it needs into its directory first (its setup, with the helpers of
hardening's PRELUDE and of KIT below): tiny GGUF files written with `gguf.GGUFWriter` (a
two-layer Llama as llama.cpp writes it, with a byte-level BPE `tokenizer.ggml.*` and ChatML,
then the one thing the case is about broken), Hugging Face directories (transformers), lmcore
checkpoints with a tokenizer and chat template, lm-eval task YAMLs, prepared data, sweeps.
A teardown prints what is left where data may be lost ("[then: ...]"). An endpoint that never
answers is a local port that takes connections and never replies (SILENT_*), as a firewalled
host or a hung server is: on a sandboxed machine a proxy may answer any outside address.

Groups (`--only` takes id prefixes): P-gguf (the gguf and jinja2 packages, transformers for the
weights), P-hf (transformers), P-spec, P-chat (jinja2), P-eval (lm-eval for the --tasks
cases), P-sweep (ray for P-sweep-ray*, submitit for P-sweep-submitit), P-track (mlflow;
P-track-ro mounts a read-only tmpfs: root only, else it reports the setup's error), P-race (a
training in the background, eval (90 s) or generate (40 s) called in a loop in one process),
P-new (a newcomer's frictions: P-new-import runs the installed environment's own `lmcore`, not
--pythonpath's: it is about how the package is installed). All of them are installed in the
project's development environment (pip install -e '.[test,gguf,eval,ray,slurm,mlflow]').

Never run by the test suite; each case becomes a regression test of its own when it is fixed.
"""

from __future__ import annotations

import sys
import textwrap

from hardening import HEADER, NORM, SITES, Case, S, main

# ------------------------------------------------------------------ helpers for the setups

KIT = textwrap.dedent("""
    CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
    CORPUS = ["Hello world, the cat sat on the mat.", "Numbers 12345 and 3.14159; cafe naive.",
              "  leading spaces\\n\\nnew lines\\ttabs   and trailing ",
              "<|im_start|>user\\nHi there<|im_end|>\\n", "don't won't it's WE'LL THEY'RE"]

    def bpe(vocab=300):  # a byte-level BPE as SmolLM's: digits one by one, then GPT-2's bytes
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        return tok

    def ggml_tokenizer(tok, template=CHATML):  # tokenizer.ggml.* as llama.cpp's converter writes them
        config, vocab = json.loads(tok.to_str()), tok.get_vocab()
        by_id = sorted(vocab, key=vocab.__getitem__)
        special = {t["content"] for t in config["added_tokens"] if t["special"]}
        return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
                "tokenizer.ggml.tokens": by_id,
                "tokenizer.ggml.token_type": [3 if t in special else 1 for t in by_id],
                "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m)
                                          for m in config["model"]["merges"]],
                "tokenizer.ggml.bos_token_id": vocab["<|im_start|>"],
                "tokenizer.ggml.eos_token_id": vocab["<|im_end|>"],
                "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": template}

    GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                  "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
                  "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                  "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                  "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                  "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}

    def gguf_name(hf):
        if hf in GGUF_NAMES:
            return GGUF_NAMES[hf]
        _, _, i, module, *rest = hf.split(".")
        key = f"{module}.{rest[0]}" if module in ("self_attn", "mlp") else module
        return f"blk.{i}.{GGUF_NAMES[key]}.weight"

    def gguf_file(path="m.gguf", meta=None, drop=(), tensors=None, vocab=300):
        # A two-layer Llama (d_model 32, 4 heads, 2 kv heads) as llama.cpp writes it, F32, with
        # a byte-level BPE and ChatML: `meta` replaces or adds keys (typed by value), `drop`
        # leaves keys out, `tensors`: GGUF name -> f(array) -> the array written instead.
        import gguf, numpy as np, torch
        from transformers import LlamaConfig, LlamaForCausalLM
        T = gguf.GGUFValueType
        c = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=64, rms_norm_eps=1e-5)
        fields = {"general.name": "tiny", "llama.block_count": 2, "llama.context_length": 64,
                  "llama.embedding_length": 32, "llama.feed_forward_length": 64,
                  "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
                  "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0,
                  "llama.rope.dimension_count": 8, "llama.vocab_size": vocab,
                  **ggml_tokenizer(bpe(vocab)), **(meta or {})}
        w = gguf.GGUFWriter(str(path), "llama")
        for key, value in fields.items():
            if key in drop:
                continue
            if isinstance(value, list):
                w.add_array(key, value)
                continue
            kind = (T.BOOL if isinstance(value, bool) else T.FLOAT32 if isinstance(value, float)
                    else T.STRING if isinstance(value, str)
                    else T.UINT32 if 0 <= value < 2**32 else T.INT32 if -2**31 <= value < 0
                    else T.UINT64)
            w.add_key_value(key, value, kind)
        torch.manual_seed(0)
        for name, p in LlamaForCausalLM(c).state_dict().items():
            x = p.detach().numpy().astype(np.float32)
            heads = 4 if "q_proj" in name else 2 if "k_proj" in name else 0
            if heads:  # llama.cpp's converter permutes q and k rows (LlamaModel.permute)
                x = x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
            g = gguf_name(name)
            if tensors and g in tensors:
                x = np.ascontiguousarray(tensors[g](x), dtype=np.float32)
            w.add_tensor(g, x)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        return path

    def tokens(edit):  # the tiny GGUF's tokenizer.ggml.tokens, edited by edit(list)
        t = list(ggml_tokenizer(bpe())["tokenizer.ggml.tokens"]); edit(t)
        return t

    def huge_array(path="m.gguf", zeros_mb=200):
        # general.tags, a string array claiming 2**62 items, followed by zero bytes: empty
        # strings to read, one after another, as far as the file goes
        def s(b): return struct.pack("<Q", len(b)) + b
        kv = [(b"general.architecture", struct.pack("<I", 8) + s(b"llama")),
              (b"general.tags", struct.pack("<IIQ", 9, 8, 2**62))]
        with open(path, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(s(k) + v for k, v in kv))
            f.write(bytes(zeros_mb * 2**20))

    def flip_tensor_byte(path="m.gguf", name="blk.0.attn_q.weight"):
        import gguf
        t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
        with open(path, "r+b") as f:
            f.seek(int(t.data_offset) + 40); b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0x40]))

    def config_edit(d="hf", drop=(), rope=None, **changes):  # PRELUDE's llama(d), config.json edited
        llama(d)
        c = json.loads(Path(d, "config.json").read_text())
        c.update(changes)
        c.setdefault("rope_parameters", {}).update(rope or {})  # transformers 5 keeps rope_theta there
        for k in drop:
            c.pop(k, None)
        Path(d, "config.json").write_text(json.dumps(c))

    def chat_ckpt(path="chat.safetensors", template=CHATML, context=64):
        # an lmcore checkpoint that stores its tokenizer (byte-level BPE) and chat template
        import torch, lmcore
        from lmcore.tokenizer import SavedTokenizer
        torch.manual_seed(0)
        model = lmcore.build_model(f"vocab_size=300, context_length={context}, d_model=32, "
                                   "num_layers=1, num_heads=2")
        tok = bpe()
        model.tokenizer = SavedTokenizer.from_tokenizer(
            tok, chat_template=template, eos_token_id=tok.token_to_id("<|im_end|>"))
        return str(model.save(path))

    def eval_model():  # lm/model.safetensors beside the tokenizer of d300 (with <|endoftext|>)
        data(); Path("lm").mkdir(exist_ok=True)
        ckpt("lm/model.safetensors"); shutil.copy("d300/tokenizer.json", "lm/tokenizer.json")

    def task(name="probe_mc", docs=20, data_file=None):  # a multiple-choice lm-eval task
        Path("tasks").mkdir(exist_ok=True)
        data_file = data_file or f"tasks/{name}.jsonl"
        ops = ["+", "-", "*", "//"]
        if not data_file.startswith("missing"):
            Path(data_file).write_text("".join(json.dumps({
                "question": f"def f{i}(a, b):\\n    return a", "answer": i % 4,
                "choices": [f" {o} b" for o in ops]}) + "\\n" for i in range(docs)))
        Path(f"tasks/{name}.yaml").write_text(
            f"task: {name}\\ndataset_path: json\\ndataset_kwargs:\\n  data_files:\\n    test: {data_file}\\n"
            "test_split: test\\noutput_type: multiple_choice\\ndoc_to_text: '{{question}}'\\n"
            "doc_to_choice: choices\\ndoc_to_target: answer\\nmetric_list:\\n  - metric: acc\\n"
            "metadata:\\n  version: 1.0\\n")

    def then(*argv, label=None, quiet=False):  # a command: its exit status, seconds, last line
        start = time.perf_counter()
        r = subprocess.run([LMCORE, *argv], capture_output=True, text=True)
        lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
        said = (f"{label or ' '.join(argv[:2])}: exit {r.returncode} after "
                f"{time.perf_counter() - start:.0f} s: {lines[-1] if lines else ''}")
        quiet or print(said)
        return said

    def black_hole(port):  # a local port that takes connections and never answers (till teardown)
        listen = ("import socket, time; s = socket.socket(); "
                  "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                  f"s.bind(('', {port})); s.listen(128); time.sleep(900)")
        p = subprocess.Popen([sys.executable, "-c", listen], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        Path("background.pid").write_text(str(p.pid)); time.sleep(0.5)

    def modes(*paths):  # the permission bits of files, by name
        return ", ".join(f"{Path(p).name} {oct(os.stat(p).st_mode & 0o777)}" for p in paths)
""")


def kit(code: str) -> str:
    """`code` after KIT's helpers (for a setup, teardown or snippet)."""
    return KIT + textwrap.dedent(code)


ENV_OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": "hf-home",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
FROM_GGUF = ["convert", "--from-gguf", "m.gguf", "o.safetensors"]
FROM_HF = ["convert", "--from-hf", "hf", "o.safetensors"]
HUGE = 10**12
THETA = "1" + "0" * 399  # a 400-digit integer
# A canonical spec, as lmcore build prints it, longer than a file name may be (312 bytes).
LONG = ("vocab_size=300,context_length=32,d_model=32,num_layers=1,num_heads=2,num_kv_heads=2,"
        "d_ff=64,block=prenorm,tie_embeddings=false,norm=rmsnorm(eps=1e-05),ffn=moe(num_experts=4,"
        "top_k=2,expert=swiglu,softmax=before,renormalize=false,shared=swiglu,shared_gate=none,"
        "aux_loss_coef=0.01),pos=rope(theta=10000.0),attn=sdpa")  # fmt: skip
SWEEP = ["sweep", S, "--vary", "norm=none", "--data", "d300", "--out", "sw", "--steps", "1",
         "--batch-size", "2", "--eval-batches", "1"]  # fmt: skip
GEN = ["--prompt-ids", "1,2", "--max-new-tokens", "2", "--seed", "0"]
ENDLESS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
GIGABYTES = "{% for a in range(100000) %}{% for b in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endfor %}"
# An endpoint that takes the connection and never answers, as a host behind a firewall that
# drops packets, or a hung server (on a sandboxed machine, a proxy may answer any address).
SILENT_RAY, SILENT_MLFLOW = 47011, 47012
LONG_TMP = "t" * 110  # Ray's socket paths under it exceed AF_UNIX's 107 bytes

SITES["slow-norm"] = {  # a norm taking a second per call: generation under 1 token/s
    "dist": "lmcore-slow",
    "eps": {"slow": "slow_mod"},
    "modules": {
        "slow_mod": HEADER
        + NORM
        + textwrap.dedent("""
        import time

        class Slow(RMSNorm):
            def forward(self, x):
                if x.device.type != "meta":
                    time.sleep(1.0)
                return super().forward(x)

        @hookimpl
        def lmcore_components():
            return [Component(kind="norm", name="slow", build=Slow, params=lambda d_model: d_model)]
    """)
    },
}

RACE = textwrap.dedent("""
    # `lmcore {command} RUN` in this process, again and again, while RUN trains and prunes
    # its checkpoints (--save-every 1 --keep 1)
    import contextlib, io, collections
    from lmcore.cli.main import main
    data()
    argv = [a if a != "0" or TRAIN[i - 1] != "--keep" else "1" for i, a in enumerate(TRAIN)]
    background("train", S, "--data", "d300", "--out", "run", *argv,
               wait_for=lambda: len(list(Path("run").rglob("*.safetensors"))) > 0)
    calls, escaped, exits, first = 0, 0, collections.Counter(), ""
    try:
        end = time.time() + {seconds}
        while time.time() < end:
            calls += 1
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    exits[main({argv})] += 1
            except Exception as e:
                escaped += 1
                first = first or f"{{type(e).__name__}}, filename {{getattr(e, 'filename', None)!r}}: {{e}}"
    finally:
        stop_background()
    print(f"{{escaped}} of {{calls}} calls escaped with a traceback" + (f" (first: {{first}})" if first else "")
          + f"; exits {{dict(exits)}}")
""")

BOTH = textwrap.dedent("""
    # the shards and their index, and beside them a model.safetensors of other weights (x 2)
    import torch
    from safetensors.torch import load_file, save_file
    llama('hf', shard=True); llama('single')
    save_file({k: v * 2 for k, v in load_file('single/model.safetensors').items()}, 'hf/model.safetensors', metadata={'format': 'pt'})
""")
BOTH_AFTER = textwrap.dedent("""
    import torch, lmcore
    from transformers import LlamaForCausalLM
    ours = lmcore.load('o.safetensors').token_embeddings.weight
    theirs = LlamaForCausalLM.from_pretrained('hf').model.embed_tokens.weight
    print('lmcore converted the embeddings transformers loads:', torch.equal(ours, theirs),
          '(x 2 of them:', torch.equal(ours * 2, theirs), end=')')
""")

CHAT_FULL = textwrap.dedent("""
    chat_ckpt(context=64)
    said = ["Hello there, the cat sat on the mat", "And then?", "/reset", "Hi again"]
    r = subprocess.run([LMCORE, "chat", "chat.safetensors", "--seed", "0", "--temperature", "0",
                        "--max-new-tokens", "40"], input="\\n".join(said) + "\\n", capture_output=True, text=True)
    replies = [l for l in r.stdout.splitlines() if l.strip()]
    print(f"exit {r.returncode} after {len(replies)} of {len(said) - 1} replies: {r.stderr.strip().splitlines()[-1]}")
""")

IMPORT_FROM_PARENT = textwrap.dedent("""
    # The clone, as its parent directory sees it: a folder named lmcore. The installed
    # environment's own lmcore (no --pythonpath: it is about how the package is installed).
    import importlib.metadata
    url = json.loads(importlib.metadata.distribution("lmcore-registry").read_text("direct_url.json"))["url"]
    os.symlink(url.removeprefix("file://"), "lmcore")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import lmcore; lmcore.build_model('cs336-tiny'); print('built')"],
                       env=env, capture_output=True, text=True)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    print(f"from the clone's parent ({url}): exit {r.returncode}: {lines[-1] if lines else ''}")
""")

UMASK = textwrap.dedent("""
    os.umask(0o022)
    data()
    subprocess.run([LMCORE, "train", S, "--data", "d300", "--out", "r", "--steps", "1",
                    "--eval-batches", "1", "--batch-size", "2"], check=True, capture_output=True)
    subprocess.run([LMCORE, "build", S, "--save", "m.safetensors"], check=True, capture_output=True)
    weights = sorted(Path("r").rglob("*.safetensors"))[:1]
    print("under umask 022: " + modes("m.safetensors", *weights, "r/run.json", *sorted(Path("r").rglob("*.jsonl"))[:1]))
""")

VERSION = textwrap.dedent("""
    # the lmcore script as the shell runs it, then whether torch was imported
    probe = ("import runpy, sys, time\\nsys.argv = sys.argv[1:]; start = time.perf_counter()\\n"
             "try:\\n    runpy.run_path(sys.argv[0], run_name='__main__')\\nexcept SystemExit:\\n    pass\\n"
             "print(f'{time.perf_counter() - start:.1f}', 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe, LMCORE, "--version"], capture_output=True, text=True)
    said, (seconds, torch) = r.stdout.splitlines()[0], r.stdout.split()[-2:]
    print(f"lmcore --version: {seconds} s, torch imported: {torch}; {said}")
""")


ONE_WINDOW = textwrap.dedent("""
    eval_model(); Path("short.py").write_text("def f(x):\\n    return x\\n")
    r = subprocess.run([LMCORE, "eval", "lm/model.safetensors", "--text", "short.py"], capture_output=True, text=True)
    print(next((l for l in r.stdout.splitlines() if l.startswith("windows")), f"exit {r.returncode}: {r.stderr.strip()}"))
""")

PLOT = textwrap.dedent("""
    # the sweep's comparison plot (lmcore.train.plots.plot_compare, as `lmcore sweep` draws it)
    # of a baseline and a variant with the same curve
    from matplotlib.figure import Figure
    from lmcore.train.plots import Curve, plot_compare
    drawn, save = [], Figure.savefig
    def spy(fig, *a, **k):
        drawn.append(fig.axes[0]); return save(fig, *a, **k)
    Figure.savefig = spy
    records = [{"kind": "eval", "step": s, "tokens": s * 64, "val_loss": v}
               for s, v in ((0, 5.70), (10, 3.10), (20, 2.60), (30, 2.40))]
    plot_compare([Curve("baseline", records), Curve("norm=rmsnorm", records)], "val.png", "sweep")
    ax = drawn[-1]; low, high = ax.get_ylim()
    lines = [l for l in ax.lines if len(l.get_xdata())]
    base, variant = lines[0], lines[1]
    same = list(base.get_ydata()) == list(variant.get_ydata())
    # the baseline is seen where a variant coincides with it only if it is drawn above it
    on_top = base.get_zorder() > variant.get_zorder()  # equal z: the later line (the variant) wins
    print(f"y axis {low:.2f} .. {high:.2f}: the step-0 loss 5.70 shown: {low <= 5.70 <= high}; "
          f"the same points: {same}; the baseline drawn above the variant: {on_top} "
          f"(baseline {base.get_linestyle()!r} at z {base.get_zorder()}, "
          f"variant {variant.get_linestyle()!r} at z {variant.get_zorder()})")
""")


def gguf_cases() -> list[Case]:
    merges = "lambda t: t.__setitem__(-1, t[-2])"
    return [
        # traceback: a tensor's shape disagrees with the metadata
        Case("P-gguf-shape-a", "GGUF: blk.0.attn_q.weight with 30 rows where head_count 4 x 8 says 32", FROM_GGUF,
             setup=kit("gguf_file(tensors={'blk.0.attn_q.weight': lambda x: x[:30]})")),
        Case("P-gguf-shape-b", "GGUF: blk.0.attn_k.weight with 15 rows where head_count_kv 2 x 8 says 16", FROM_GGUF,
             setup=kit("gguf_file(tensors={'blk.0.attn_k.weight': lambda x: x[:15]})")),
        Case("P-gguf-shape-c", "GGUF: blk.0.attn_q.weight 3-D (2, 16, 32)", FROM_GGUF,
             setup=kit("gguf_file(tensors={'blk.0.attn_q.weight': lambda x: x.reshape(2, 16, 32)})")),
        Case("P-gguf-shape-d", "GGUF: blk.0.attn_k.weight 3-D (2, 8, 32)", FROM_GGUF,
             setup=kit("gguf_file(tensors={'blk.0.attn_k.weight': lambda x: x.reshape(2, 8, 32)})")),
        # traceback: the tokenizer
        Case("P-gguf-tok-merge", "GGUF: a merge naming an unknown token ('zzzq qqqz')", FROM_GGUF,
             setup=kit("m = ggml_tokenizer(bpe())['tokenizer.ggml.merges']; gguf_file(meta={'tokenizer.ggml.merges': m + ['zzzq qqqz']})")),
        Case("P-gguf-tok-dup", "GGUF: duplicate tokens (the last token spelled as the one before it)", FROM_GGUF,
             setup=kit(f"gguf_file(meta={{'tokenizer.ggml.tokens': tokens({merges})}})")),
        Case("P-gguf-tok-pre", "GGUF: tokenizer.ggml.pre a list (['smollm', 'x'])", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.ggml.pre': ['smollm', 'x']})")),
        Case("P-gguf-tok-bos-a", "GGUF: bos/eos_token_id given as strings ('<|im_start|>', '<|im_end|>'), add_bos_token", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.ggml.bos_token_id': '<|im_start|>', 'tokenizer.ggml.eos_token_id': '<|im_end|>', 'tokenizer.ggml.add_bos_token': True})"),
             teardown=kit("import lmcore; t = lmcore.read_info('o.safetensors').tokenizer; print(f'stored bos {t.bos_token_id}, eos {t.eos_token_id}')")),
        Case("P-gguf-tok-bos-b", "GGUF: the BOS token a string with spaces ('B O S'), add_bos_token", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.ggml.tokens': tokens(lambda t: t.__setitem__(1, 'B O S')), 'tokenizer.ggml.add_bos_token': True})")),
        # hang or memory
        Case("P-gguf-array", "GGUF: a string array (general.tags) claiming 2**62 items, 200 MB of file after it", FROM_GGUF,
             setup=kit("huge_array()")),
        Case("P-gguf-ctx", "GGUF: llama.context_length = 10**8", FROM_GGUF,
             setup=kit("gguf_file(meta={'llama.context_length': 10**8})")),
        # data lost
        Case("P-gguf-same", "convert --from-gguf X.gguf X.gguf (OUT is the GGUF)", ["convert", "--from-gguf", "m.gguf", "m.gguf"],
             setup=kit("gguf_file()"),
             teardown="raw = Path('m.gguf').read_bytes(); print(f'm.gguf: {len(raw):,} bytes, starting {raw[:4]!r}')"),
        # silent
        Case("P-gguf-tmpl-num", "GGUF: tokenizer.chat_template a number (42)", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.chat_template': 42})"),
             teardown="print('o.safetensors written:', Path('o.safetensors').exists())"),
        Case("P-gguf-tmpl-arr", "GGUF: tokenizer.chat_template an array (['a', 'b'])", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.chat_template': ['a', 'b']})"),
             teardown="print('o.safetensors written:', Path('o.safetensors').exists())"),
        Case("P-gguf-tok-more", "GGUF: 350 tokens for a vocabulary of 300", FROM_GGUF,
             setup=kit("m = ggml_tokenizer(bpe()); gguf_file(meta={'tokenizer.ggml.tokens': m['tokenizer.ggml.tokens'] + [f'x{i}' for i in range(50)], 'tokenizer.ggml.token_type': m['tokenizer.ggml.token_type'] + [1] * 50})"),
             teardown=kit("import lmcore; t = lmcore.read_info('o.safetensors').tokenizer.tokenizer(); print(f'stored tokenizer: {t.get_vocab_size()} tokens, id 340 is {t.id_to_token(340)!r}; the model has 300')")),
        Case("P-gguf-tok-nomerge", "GGUF: a byte-level BPE without tokenizer.ggml.merges", FROM_GGUF,
             setup=kit("gguf_file(drop=('tokenizer.ggml.merges',))"),
             teardown=kit("import lmcore; t = lmcore.read_info('o.safetensors').tokenizer.tokenizer(); print(f\"'Hello world' is {len(t.encode('Hello world').ids)} tokens (the file's tokenizer: {len(bpe().encode('Hello world').ids)})\")")),
        Case("P-gguf-tok-bos-dollar", "GGUF: the BOS token '$A', add_bos_token", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.ggml.tokens': tokens(lambda t: t.__setitem__(1, '$A')), 'tokenizer.ggml.add_bos_token': True})"),
             teardown=kit("import lmcore; t = lmcore.read_info('o.safetensors').tokenizer.tokenizer(); print(f\"'Hi' encodes as {t.encode('Hi').tokens}\")")),
        Case("P-gguf-bos-out", "GGUF: bos_token_id 5000, eos_token_id 7000 (vocabulary 300)", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.ggml.bos_token_id': 5000, 'tokenizer.ggml.eos_token_id': 7000})"),
             teardown=kit("import lmcore; t = lmcore.read_info('o.safetensors').tokenizer; print(f'stored bos {t.bos_token_id}, eos {t.eos_token_id}, stops {t.stop_token_ids}')")),
        Case("P-gguf-bos-neg", "GGUF: bos_token_id -1, eos_token_id -2 (int32)", FROM_GGUF,
             setup=kit("gguf_file(meta={'tokenizer.ggml.bos_token_id': -1, 'tokenizer.ggml.eos_token_id': -2})"),
             teardown=kit("import lmcore; t = lmcore.read_info('o.safetensors').tokenizer; print(f'stored bos {t.bos_token_id}, eos {t.eos_token_id}, stops {t.stop_token_ids}')")),
        Case("P-gguf-flip", "GGUF: one flipped byte inside blk.0.attn_q.weight's data", FROM_GGUF,
             setup=kit("gguf_file(); flip_tensor_byte()")),
    ]  # fmt: skip


def hf_cases() -> list[Case]:
    huge = f"config_edit(num_hidden_layers={HUGE})"
    return [
        Case("P-hf-theta-convert", "config.json rope_parameters.rope_theta a 400-digit integer: convert --from-hf", FROM_HF,
             setup=kit(f"config_edit(rope={{'rope_theta': {THETA}}})")),
        Case("P-hf-theta-describe", "... describe DIR", ["describe", "hf"], setup=kit(f"config_edit(rope={{'rope_theta': {THETA}}})")),
        Case("P-hf-layers12-describe", "config.json num_hidden_layers = 10**12: describe DIR", ["describe", "hf"], setup=kit(huge)),
        Case("P-hf-layers12-build", "... build DIR --device meta", ["build", "hf", "--device", "meta"], setup=kit(huge)),
        Case("P-hf-layers12-convert", "... convert --from-hf", FROM_HF, setup=kit(huge)),
        Case("P-hf-layers12-print", "... convert --from-hf DIR --print-spec", ["convert", "--from-hf", "hf", "--print-spec"], setup=kit(huge)),
        Case("P-hf-layers6-describe", "config.json num_hidden_layers = 10**6: describe DIR", ["describe", "hf"],
             setup=kit("config_edit(num_hidden_layers=10**6)")),
        Case("P-hf-layers6-convert", "... convert --from-hf", FROM_HF, setup=kit("config_edit(num_hidden_layers=10**6)")),
        Case("P-hf-ctx", "config.json max_position_embeddings = 10**8: convert --from-hf", FROM_HF,
             setup=kit("config_edit(max_position_embeddings=10**8)")),
        Case("P-hf-same", "convert --from-hf DIR DIR/model.safetensors", ["convert", "--from-hf", "hf", "hf/model.safetensors"],
             setup=kit("llama('hf')"), teardown=kit("then('convert', '--from-hf', 'hf', 'again.safetensors')")),
        Case("P-hf-both", "DIR with model.safetensors and a shard index of other weights: convert --from-hf", FROM_HF,
             setup=kit(BOTH), teardown=kit(BOTH_AFTER)),
        Case("P-hf-no-type", "config.json without model_type (architectures LlamaForCausalLM): convert --from-hf", FROM_HF,
             setup=kit("config_edit(drop=('model_type',))")),
    ]  # fmt: skip


def spec_cases() -> list[Case]:
    return [
        Case("P-spec-layers12-describe", "describe tinystories, num_layers=10**12", ["describe", f"tinystories, num_layers={HUGE}"]),
        Case("P-spec-layers12-build", "build tinystories, num_layers=10**12 --device meta", ["build", f"tinystories, num_layers={HUGE}", "--device", "meta"]),
        Case("P-spec-layers6-build", "build tinystories, num_layers=10**6", ["build", "tinystories, num_layers=1000000"], timeout=130),
        Case("P-spec-layers6-describe", "describe tinystories, num_layers=10**6", ["describe", "tinystories, num_layers=1000000"]),
        Case("P-spec-moe6", "describe tinystories, ffn=moe(num_experts=1000000)", ["describe", "tinystories, ffn=moe(num_experts=1000000)"]),
        Case("P-spec-moe5-meta", "build tinystories, ffn=moe(num_experts=100000) --device meta", ["build", "tinystories, ffn=moe(num_experts=100000)", "--device", "meta"]),
        Case("P-spec-max-bytes", "build cs336-tiny, context_length=2*10**7 --max-bytes 1.3GiB", ["build", "cs336-tiny, context_length=20000000", "--max-bytes", "1.3GiB"]),
        Case("P-spec-long-describe", f"describe a {len(LONG)}-byte canonical spec", ["describe", LONG]),
        Case("P-spec-long-build", "... build", ["build", LONG, "--device", "meta"]),
        Case("P-spec-long-run", "... run --steps 1", ["run", LONG, "--steps", "1"]),
        Case("P-spec-long-train", "... train", ["train", LONG, "--data", "d300", "--out", "r", "--steps", "1", "--eval-batches", "1"], setup="data()"),
        Case("P-spec-long-generate", "... generate", ["generate", LONG, *GEN]),
        Case("P-spec-long-vary", "... as a sweep's --vary", ["sweep", S, "--vary", LONG, "--data", "d300", "--out", "sw", "--steps", "1"],
             setup="data()", teardown="print('sw holds:', sorted(os.listdir('sw')) if os.path.isdir('sw') else None)"),
    ]  # fmt: skip


def chat_cases() -> list[Case]:
    chat = ["chat", "chat.safetensors", "--seed", "0", "--temperature", "0", "--max-new-tokens", "8"]  # fmt: skip
    return [
        Case("P-chat-syntax", "a chat template with a syntax error ('{% for m in messages %}')", chat, stdin=b"hi\n",
             setup=kit("chat_ckpt(template='{% for m in messages %}{{ m.content }}')")),
        Case("P-chat-endless", "a chat template looping 10**10 times (two nested range(100000))", chat, stdin=b"hi\n",
             setup=kit(f"chat_ckpt(template={ENDLESS!r})")),
        Case("P-chat-gigabytes", "a chat template rendering 10**13 bytes", chat, stdin=b"hi\n",
             setup=kit(f"chat_ckpt(template={GIGABYTES!r})"), timeout=60),
        Case("P-chat-stdin-closed", "lmcore chat with stdin closed", chat, stdin="closed", setup=kit("chat_ckpt()")),
        Case("P-chat-stdin-binary", "lmcore chat with binary stdin", chat, stdin=b"\x00\x01\xff\xfe\x80\x81binary\n",
             setup=kit("chat_ckpt()")),
        Case("P-chat-stdin-latin1", "lmcore chat with Latin-1 stdin ('caf\\xe9')", chat, stdin=b"caf\xe9\n",
             setup=kit("chat_ckpt()")),
        Case("P-chat-full", "a conversation that fills the 64-token context, then /reset and another message", code=kit(CHAT_FULL)),
    ]  # fmt: skip


def eval_cases() -> list[Case]:
    tasks = ["eval", "lm/model.safetensors", "--tasks", "probe_mc", "--include-path", "tasks", "--batch-size", "4"]  # fmt: skip
    return [
        Case("P-eval-missing", "a task YAML whose data file does not exist", tasks, env=ENV_OFFLINE,
             setup=kit("eval_model(); task(data_file='missing.jsonl')"), timeout=60),
        Case("P-eval-fewshot", "--num-fewshot 50 from a pool of 20 documents", [*tasks, "--num-fewshot", "50"], env=ENV_OFFLINE,
             setup=kit("eval_model(); task()"), timeout=60),
        Case("P-eval-output", "--output DIR (a directory): after the whole evaluation", env=ENV_OFFLINE, timeout=120,
             code=kit(f"eval_model(); task(docs=200); Path('results').mkdir(); said = then(*{tasks!r}, '--output', 'results', label='eval', quiet=True); print(said, '; results/ holds:', os.listdir('results'))")),
        Case("P-eval-text20", "eval --text of 20 MB", ["eval", "lm/model.safetensors", "--text", "big.txt"],
             setup=kit("eval_model(); words('big.txt', 20)"), timeout=120),
        Case("P-eval-text100", "eval --text of 100 MB", ["eval", "lm/model.safetensors", "--text", "big.txt"],
             setup=kit("eval_model(); words('big.txt', 100)"), timeout=120),
    ]  # fmt: skip


def sweep_cases() -> list[Case]:
    resume_setup = "data(); subprocess.run([LMCORE, *{0!r}], check=True, capture_output=True); Path('sw/sweep.json').write_text(Path('sw/sweep.json').read_text()[:-20] + ', edited by hand')"
    return [
        Case("P-sweep-utf8", "a sweep file that is not UTF-8 (Latin-1 in a comment)", ["sweep", "bad.toml"],
             setup="data(); Path('bad.toml').write_bytes(b'# caf\\xe9\\nbase = \"cs336-tiny\"\\nvariants = [\"norm=none\"]\\ndata = \"d300\"\\nout = \"sw\"\\n')"),
        Case("P-sweep-ray-start", "--launcher ray when Ray's start fails (RAY_TMPDIR too long for its sockets)", [*SWEEP, "--launcher", "ray"],
             env={"RAY_TMPDIR": LONG_TMP}, setup=f"data(); Path({LONG_TMP!r}).mkdir()", timeout=60),
        Case("P-sweep-submitit", "--launcher submitit off a cluster (no srun, no sbatch)", [*SWEEP, "--launcher", "submitit"], setup="data()"),
        Case("P-sweep-resume-json", "sweep --resume SWEEP whose sweep.json was edited by hand (not JSON)", ["sweep", "--resume", "sw"],
             setup=resume_setup.format(SWEEP)),
        Case("P-sweep-ray-closed", "--ray-address 127.0.0.1:9 (a closed port)", [*SWEEP, "--launcher", "ray", "--ray-address", "127.0.0.1:9"], setup="data()"),
        Case("P-sweep-ray-silent", f"--ray-address 127.0.0.1:{SILENT_RAY} (a port that never answers)", [*SWEEP, "--launcher", "ray", "--ray-address", f"127.0.0.1:{SILENT_RAY}"],
             setup=kit(f"data(); black_hole({SILENT_RAY})"), teardown="stop_background()"),
        Case("P-sweep-seeds", "sweep --seeds 1000000000", [*SWEEP, "--seeds", "1000000000"], setup="data()"),
        Case("P-sweep-seeds-file", "seeds = 1_000_000_000 in a sweep file", ["sweep", "s.toml"],
             setup="data(); Path('s.toml').write_text(f'base = {S!r}\\nvariants = [\"norm=none\"]\\ndata = \"d300\"\\nout = \"sw\"\\nseeds = 1_000_000_000\\n[train]\\nsteps = 1\\n')"),
    ]  # fmt: skip


def track_cases() -> list[Case]:
    train = ["train", S, "--data", "d300", "--out", "r", "--steps", "2", "--eval-batches", "1", "--batch-size", "2", "--logger", "mlflow"]  # fmt: skip
    return [
        Case("P-track-ro", "--logger mlflow with a read-only store (sqlite on a read-only tmpfs)", train,
             env={"MLFLOW_TRACKING_URI": "sqlite:///store/mlflow.db"},
             setup="data(); Path('store').mkdir(); subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m,ro', 'tmpfs', 'store'], check=True)",
             teardown="subprocess.run(['umount', 'store'])"),
        Case("P-track-closed", "--logger mlflow, MLFLOW_TRACKING_URI=http://127.0.0.1:9 (a closed port)", train,
             env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}, setup="data()"),
        Case("P-track-silent", f"--logger mlflow, MLFLOW_TRACKING_URI=http://127.0.0.1:{SILENT_MLFLOW} (a port that never answers)", train,
             env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{SILENT_MLFLOW}"}, setup=kit(f"data(); black_hole({SILENT_MLFLOW})"),
             teardown="stop_background()"),
    ]  # fmt: skip


def race_cases() -> list[Case]:
    return [
        Case("P-race-eval", "lmcore eval RUN, again and again for 90 s, while RUN trains with --keep 1",
             code=RACE.format(command="eval", seconds=90, argv="['eval', 'run', '--data', 'd300']"), timeout=180),
        Case("P-race-generate", "lmcore generate RUN, again and again for 40 s, while RUN trains with --keep 1",
             code=RACE.format(command="generate", seconds=40, argv="['generate', 'run', *" + repr(GEN) + "]"), timeout=120),
    ]  # fmt: skip


def newcomer_cases() -> list[Case]:
    return [
        Case("P-new-import", "import lmcore from the clone's parent directory", code=IMPORT_FROM_PARENT, timeout=60),
        Case("P-new-umask", "the modes of the files train and build --save write, under umask 022", code=kit(UMASK), timeout=120),
        Case("P-new-version", "lmcore --version: seconds, and whether it imports torch", code=VERSION),
        Case("P-new-rate", "generate at under one token per second (a norm that sleeps 1 s)",
             ["generate", f"{S}, norm=slow", *GEN], sites=("slow-norm",), timeout=60),
        Case("P-new-batch", "eval --text of one window: the batch it reports", code=kit(ONE_WINDOW), timeout=60),
        Case("P-new-plot", "the sweep plot of a baseline and an identical variant: y axis, lines", code=PLOT),
    ]  # fmt: skip


def cases() -> list[Case]:
    return [*gguf_cases(), *hf_cases(), *spec_cases(), *chat_cases(), *eval_cases(),
            *sweep_cases(), *track_cases(), *race_cases(), *newcomer_cases()]  # fmt: skip


if __name__ == "__main__":
    assert sys.path[0].endswith("benchmarks")  # `from hardening import ...` found this folder's
    main(cases, __doc__)
