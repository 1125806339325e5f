"""`lmcore convert`: a Hugging Face model directory or a GGUF file to an lmcore checkpoint, or
back."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lmcore.cli.common import DTYPES, UsageError, checkpoint_warnings, show_bytes


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face model directory or a GGUF file to an lmcore checkpoint, "
        "or back",
        description="Convert between Hugging Face model directories (config.json and "
        "safetensors weights, sharded or not) of the families lmcore reads (lmcore.hf.FAMILIES: "
        "Llama to DeepSeek-V3, gpt-oss, Qwen3-Next, Mamba-2, Falcon-H1; docs/huggingface.md) "
        "and lmcore checkpoints, and GGUF files (llama.cpp, Ollama, LM Studio) of the "
        "architectures in docs/gguf.md, both ways. Anything the target cannot express is "
        "refused, naming the field or component.",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from-hf",
        nargs="+",
        metavar=("DIR", "OUT.safetensors"),
        help="model directory -> lmcore (DIR alone with --print-spec)",
    )
    way.add_argument("--to-hf", nargs=2, metavar=("CKPT", "DIR"), help="lmcore -> model directory")
    p.add_argument(
        "--print-spec",
        action="store_true",
        help="--from-hf: print the spec DIR's config.json gives (DIR may be a config.json) and "
        "write nothing",
    )
    p.add_argument(
        "--model-type",
        metavar="NAME",
        help="--to-hf: the family to write (default: the one converted from, else the first "
        "that expresses the model)",
    )
    way.add_argument(
        "--from-gguf",
        nargs=2,
        metavar=("FILE.gguf", "OUT.safetensors"),
        help="GGUF file (llama.cpp, Ollama, LM Studio) -> lmcore, with its tokenizer",
    )
    way.add_argument("--to-gguf", nargs=2, metavar=("CKPT", "OUT.gguf"), help="lmcore -> GGUF file")
    way.add_argument(
        "--merge",
        metavar="ADAPTER",
        help="an adapter file (or a checkpoint with an adapter) -> a plain lmcore checkpoint "
        "(--out), each update folded into its matrix; it converts --to-hf and --to-gguf",
    )
    p.add_argument("--out", metavar="MERGED.safetensors", help="--merge: the file to write")
    p.add_argument(
        "--type",
        choices=("f32", "f16", "bf16", "q8_0"),
        help="--to-gguf: how the matrices are stored (default: f32)",
    )
    p.add_argument(
        "--architecture",
        metavar="NAME",
        help="--to-gguf: the GGUF architecture to write (default: the one converted from, else "
        "the first that holds the model)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="--from-hf, --from-gguf: store the weights in this dtype (default: as is; a "
        "quantized GGUF's are float32)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="--to-hf: replace DIR whole when it is not empty (without it, that is an error)",
    )
    p.add_argument(
        "--keep-quantized",
        action="store_true",
        help="--from-gguf: keep Q8_0, Q4_0 and Q4_1 matrices as their blocks (spec key "
        "quant=), not dequantized to float32; --to-gguf writes them back as they were",
    )
    p.add_argument(
        "--ignore-field",
        action="append",
        default=[],
        metavar="NAME",
        help="--from-hf, --from-gguf: a config.json field (GGUF metadata key) lmcore does not "
        "know that you know does not change the model (repeatable); unknown fields are refused "
        "otherwise",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from lmcore.checkpoint import read_info
    from lmcore.hf.convert import (
        INDEX,
        WEIGHTS,
        both_weights,
        convert_from_hf,
        convert_to_hf,
        hf_config,
        hf_reading,
        refuse_same,
    )
    from lmcore.hf.family import family_of

    with checkpoint_warnings(args.command):
        if args.merge is not None or args.out is not None:
            return _merge(args)
        for given in (args.to_hf, args.to_gguf):
            if given is not None:
                _refuse_adapter(given[0])
        if args.keep_quantized and args.from_gguf is None:
            raise UsageError("--keep-quantized applies to --from-gguf only")
        if args.to_hf is not None:
            _refuse_quantized(args.to_hf[0])
        if args.from_gguf is not None or args.to_gguf is not None:
            return _gguf(args)
        if args.type is not None or args.architecture is not None:
            raise UsageError("--type and --architecture apply to --to-gguf only")
        if args.from_hf is not None:
            if args.force or args.model_type is not None:
                raise UsageError(
                    "--force and --model-type apply to --to-hf only (a directory replaced "
                    "whole, as a family); --from-hf writes one file, which replaces OUT atomically"
                )
            if args.print_spec:
                if len(args.from_hf) != 1 or args.dtype is not None:
                    raise UsageError("--from-hf DIR --print-spec takes DIR alone (and no --dtype)")
                print(hf_reading(args.from_hf[0], ignore=args.ignore_field).spec)
                return 0
            if len(args.from_hf) != 2:
                raise UsageError(
                    "--from-hf takes DIR OUT.safetensors (or DIR alone with --print-spec)"
                )
            directory, out = args.from_hf
            dtype = None if args.dtype is None else getattr(torch, args.dtype)
            written = convert_from_hf(directory, out, dtype=dtype, ignore=args.ignore_field)
            info = read_info(written)
            if both_weights(directory):  # as transformers' from_pretrained chooses
                print(
                    f"note: {directory} holds both {WEIGHTS} and {INDEX}: converted {WEIGHTS}, "
                    "which transformers loads (the index's shards are not read); remove the "
                    "one that is stale"
                )
            config = hf_config(directory)
            if config.get("model_type") is None:  # read by its architectures: say so
                print(
                    f"note: {directory}/config.json has no model_type: read as "
                    f"{family_of(config).model_type}, the family of its architectures "
                    f"{', '.join(map(str, config['architectures']))}"
                )
            print(f"spec: {info.spec}")
            print(f"wrote: {info.path} ({show_bytes(info.size)}, {info.dtype}, lmcore checkpoint)")
        else:
            if args.dtype is not None or args.ignore_field or args.print_spec:
                raise UsageError(
                    "--dtype, --ignore-field and --print-spec apply to --from-hf only; --to-hf "
                    "writes the checkpoint's dtype and a config of its own"
                )
            checkpoint, directory = args.to_hf
            refuse_same(checkpoint, directory, "the lmcore checkpoint")
            written = convert_to_hf(
                checkpoint, directory, model_type=args.model_type, force=args.force
            )
            arch = json.loads((written / "config.json").read_text())["architectures"][0]
            print(f"spec: {read_info(checkpoint).spec}")
            print(
                f"wrote: {written / 'config.json'} and {written / WEIGHTS} "
                f"({arch}; transformers.{arch}.from_pretrained loads it)"
            )
    return 0


def _gguf(args: argparse.Namespace) -> int:
    import time

    import torch

    from lmcore.checkpoint import read_info
    from lmcore.gguf import convert_from_gguf, convert_to_gguf
    from lmcore.gguf.convert import NO_CHECKSUM
    from lmcore.gguf.reading import read_gguf
    from lmcore.hf.convert import refuse_same

    if args.force or args.print_spec or args.model_type is not None:
        raise UsageError(
            "--force, --print-spec and --model-type apply to --to-hf/--from-hf only; a GGUF "
            "conversion writes one file"
        )
    start = time.perf_counter()
    if args.from_gguf is not None:
        if args.type is not None or args.architecture is not None:
            raise UsageError(
                "--type and --architecture apply to --to-gguf only (--dtype for --from-gguf)"
            )
        source, out = args.from_gguf
        refuse_same(source, out, "the GGUF file")
        dtype = None if args.dtype is None else getattr(torch, args.dtype)
        written = convert_from_gguf(source, out, dtype=dtype, ignore=args.ignore_field,
                                    keep_quantized=args.keep_quantized)  # fmt: skip
        info = read_info(written)
        tok = info.tokenizer
        print(f"spec: {info.spec}")
        if tok is not None:
            template = "a chat template" if tok.chat_template else "no chat template"
            print(f"tokenizer: stored, stop ids {list(tok.stop_token_ids)}, {template}")
        print(NO_CHECKSUM.format(out=info.path))
        held = [c.name for c in info.components.values() if c.kind == "quant"]
        kind = f"matrices {held[0]}, the rest {info.dtype}" if held else info.dtype
        print(
            f"wrote: {info.path} ({show_bytes(info.size)}, {kind}, lmcore checkpoint) "
            f"in {time.perf_counter() - start:.1f} s"
        )
        return 0
    if args.dtype is not None or args.ignore_field:
        raise UsageError("--dtype and --ignore-field apply to --from-hf and --from-gguf only")
    checkpoint, out = args.to_gguf
    refuse_same(checkpoint, out, "the lmcore checkpoint")
    written = convert_to_gguf(
        checkpoint, out, type=args.type or "kept", architecture=args.architecture
    )
    file = read_gguf(written)
    kinds = sorted({e.type for e in file.tensors.values() if len(e.shape) > 1})
    print(f"spec: {read_info(checkpoint).spec}")
    print(
        f"wrote: {written} ({show_bytes(written.stat().st_size)}, GGUF "
        f"{file.architecture}, matrices {'/'.join(kinds)}) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0


def _refuse_adapter(checkpoint: str) -> None:
    """A checkpoint with an adapter converts once merged: say how, before anything is read."""
    from lmcore.checkpoint import read_info
    from lmcore.runfiles import find_checkpoint

    info = read_info(find_checkpoint(checkpoint))
    if info.base is not None or any(c.kind == "adapter" for c in info.components.values()):
        raise UsageError(
            f"{checkpoint} has an adapter; merge it into a plain checkpoint first: lmcore "
            f"convert --merge {checkpoint} --out merged.safetensors"
        )


def _refuse_quantized(checkpoint: str) -> None:
    """--to-hf writes float safetensors: a quantized checkpoint is refused, naming the ways."""
    from lmcore.checkpoint import read_info
    from lmcore.runfiles import find_checkpoint

    info = read_info(find_checkpoint(checkpoint))
    held = [c.name for c in info.components.values() if c.kind == "quant"]
    if held:
        raise UsageError(
            f"{checkpoint} is quantized ({held[0]}), and a Hugging Face directory holds float "
            "weights: convert the float checkpoint it came from, or write GGUF instead "
            f"(lmcore convert --to-gguf {checkpoint} OUT.gguf keeps the blocks)"
        )


def _merge(args: argparse.Namespace) -> int:
    import time

    from lmcore.adapting import merged
    from lmcore.checkpoint import read_info
    from lmcore.sources import load

    if args.merge is None or args.out is None:
        raise UsageError("--merge ADAPTER and --out MERGED.safetensors go together")
    others = (args.type, args.architecture, args.dtype, args.model_type)
    if any(o is not None for o in others) or args.force or args.ignore_field or args.print_spec:
        raise UsageError("--merge takes --out alone; convert the merged file afterwards")
    from lmcore.hf.convert import refuse_same

    refuse_same(args.merge, args.out, "the adapter")
    start = time.perf_counter()
    plain = merged(load(args.merge))
    written = plain.save(args.out)
    info = read_info(written)
    print(f"spec: {info.spec}")
    print(
        f"wrote: {info.path} ({show_bytes(info.size)}, {info.dtype}, plain lmcore checkpoint) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0
