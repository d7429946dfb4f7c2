"""``colossal export`` and ``colossal generate``: a trained checkpoint out as a Hugging Face
folder, and text from it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from colossal_contracts import ConfigError

__all__ = ["add_export_parser", "add_generate_parser"]


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint (any plugin) as a Hugging Face folder (config.json, "
        "safetensors, tokenizer files)",
    )
    p.add_argument(
        "checkpoint", type=Path, help="a run's --out folder, its checkpoint/ or a step-N folder"
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--hf",
        type=Path,
        metavar="OUT",
        help="the new folder: AutoModelForCausalLM.from_pretrained(OUT) loads it (a LoRA "
        "run's: the merged model)",
    )
    what.add_argument(
        "--adapter",
        type=Path,
        metavar="OUT",
        help="a LoRA run's adapters as a PEFT folder: PeftModel.from_pretrained(base, OUT)",
    )
    p.add_argument(
        "--max-shard-size",
        default="2GiB",
        help="largest safetensors file (default: %(default)s)",
    )
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from ..export import export_adapter, export_hf

    if args.adapter is not None:
        out = export_adapter(args.checkpoint, args.adapter)
        print(f"exported {args.checkpoint}'s adapters to {out} (PEFT folder)", file=sys.stderr)
        return 0
    out = export_hf(args.checkpoint, args.hf, max_shard_bytes=args.max_shard_size)
    print(f"exported {args.checkpoint} to {out} (Hugging Face folder)", file=sys.stderr)
    return 0


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained model")
    p.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="a run's --out, a checkpoint folder, or a Hugging Face folder",
    )
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 is greedy decoding; above 0 samples (default: %(default)s)",
    )
    p.add_argument(
        "--top-k", type=int, default=0, help="sample among the k likeliest tokens (0: all)"
    )
    p.add_argument(
        "--top-p", type=float, default=1.0, help="sample within probability mass p (1: all)"
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument(
        "--no-cache", action="store_true", help="recompute the whole sequence for every token"
    )
    p.add_argument(
        "--accelerator-budget",
        default=None,
        help="stream the weights through Gemini's chunks under this many bytes, e.g. 256MiB "
        "(default: the whole model in memory)",
    )
    p.add_argument(
        "--adapter",
        type=Path,
        default=None,
        help="a PEFT adapter folder (a LoRA run's --out/adapter) applied to the --checkpoint "
        "model, e.g. the base Hugging Face folder",
    )
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from ..inference import generate

    if not args.prompt:
        raise ConfigError("--prompt is empty; give some text to continue")
    result = generate(
        args.checkpoint,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        use_cache=not args.no_cache,
        accelerator_budget=args.accelerator_budget,
        adapter=args.adapter,
    )
    print(result.text)
    print(
        f"{len(result.new_ids)} tokens in {result.seconds:.2f} s "
        f"({result.tokens_per_s:,.1f} tokens/s)",
        file=sys.stderr,
    )
    return 0
