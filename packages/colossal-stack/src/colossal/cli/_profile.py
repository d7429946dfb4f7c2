"""``colossal profile``: memory of one training step of a model preset, traced and estimated
(colossal-memtrace's ``profile_step`` on a colossal-models preset)."""

from __future__ import annotations

import argparse
from pathlib import Path

from colossal_contracts import ConfigError
from colossal_memtrace import ProfileRequest, profile_step
from colossal_models import ByteTokenizer

from ..train._models import resolve_model
from ..train._preflight import check_fits

__all__ = ["add_profile_parser"]


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="memory per moment of one training step of a preset")
    p.add_argument("--model", default="gpt", help="model family: gpt or palm (default: gpt)")
    p.add_argument("--preset", default="tiny", help="model size preset (default: tiny)")
    p.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sample (default 128)")
    p.add_argument("--optimizer", default="adam", help="adam, adamw, sgd or none (default adam)")
    p.add_argument("--mode", default="both", help="measure, estimate or both (default both)")
    p.add_argument("--device", default="cpu", help="device of the measured step (default cpu)")
    p.add_argument("--out", type=Path, default=Path("memtrace-out"), help="output folder")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    spec = resolve_model(args.model, args.preset, vocab_size=ByteTokenizer.vocab_size)
    req = ProfileRequest(
        name=spec.label,
        batch=args.batch,
        seq_len=args.seq_len,
        optimizer=args.optimizer,
        mode=args.mode,
        device=args.device,
        out=args.out,
    )
    if args.seq_len > spec.max_seq_len:
        raise ConfigError(
            f"--seq-len {args.seq_len} exceeds {spec.label}'s context of "
            f"{spec.max_seq_len}; use a smaller --seq-len"
        )
    if args.mode in ("measure", "both") and args.device == "cpu":
        try:  # measuring builds and steps the model here: refuse what cannot fit first
            check_fits(
                build=spec.build,
                num_params=spec.num_params,
                label=spec.label,
                presets=spec.presets,
                batch_size=args.batch,
                seq_len=args.seq_len,
                sharded=False,
                world=1,
            )
        except ConfigError as err:
            head = str(err).split("; ")[0]
            raise ConfigError(
                f"--mode {args.mode} builds and steps the model on this machine: {head}; use "
                "--mode estimate (nothing is allocated) or a smaller --preset"
            ) from None
    profile_step(spec.build, req)
    return 0
