"""Commands on a trained model (a pretrain output): ``generate`` (any-to-any generation) and ``export`` (another
format: apple/ml-4m's model folder)."""

from __future__ import annotations

import argparse

from fourm_kfp.cli.help_text import add_command
from fourm_kfp.cli.options import pairs


def _add_generate(commands: argparse._SubParsersAction) -> None:
    generate = add_command(
        commands, "generate", cmd_generate, "any-to-any generation with a trained model (from its URI)",
        ["fourm-kfp generate --model runs/demo/<pretrain output> --from rgb=photo.jpg --to depth,caption "
         "--out generated"])
    generate.add_argument("--model", required=True, help="a pretrain output URI (local path or s3://...)")
    generate.add_argument("--from", dest="inputs", action="append", default=[], metavar="MODALITY=VALUE",
                          help="an input: an image file for rgb/depth/normal/semseg/edge, a text file or the text "
                               "itself for caption/det (repeatable; none = unconditional)")
    generate.add_argument("--to", required=True, help="comma-separated targets, generated in order (a chain: "
                                                      "each output joins the inputs of the next)")
    generate.add_argument("--out", required=True, help="folder for the outputs (files per target, generate.json)")
    generate.add_argument("--steps", type=int, default=8, help="image targets: MaskGIT/ROAR steps (default 8)")
    generate.add_argument("--order", choices=("maskgit", "roar"), default="maskgit")
    generate.add_argument("--schedule", choices=("cosine", "linear"), default="cosine")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 (default) = most likely tokens")
    generate.add_argument("--top-k", type=int, default=0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--guidance", type=float, default=1.0, help="classifier-free guidance (1 = off)")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    generate.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL)")


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate target modalities from the given inputs with a trained model (a pretrain output), one target after
    another, each joining the inputs of the next."""
    from fourm_kfp.errors import UserError
    from fourm_kfp.evaluation.any_to_any import run_generate
    from fourm_kfp.launchers.stage import apply_s3_endpoint
    from fourm_kfp.model.generation import SamplingArgs

    apply_s3_endpoint(args.s3_endpoint)
    inputs = pairs(args.inputs, "--from", "MODALITY=VALUE")
    targets = [t.strip() for t in args.to.split(",") if t.strip()]
    try:
        sampling = SamplingArgs(steps=args.steps, order=args.order, schedule=args.schedule,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                guidance=args.guidance)
        summary = run_generate(args.model, inputs, targets, args.out, sampling, args.seed, args.device)
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from exc
    for name, paths in summary["written"].items():
        shown = f" \"{summary['text'][name]}\"" if name in summary["text"] else ""
        print(f"{name}: {', '.join(paths)}{shown}")
    return 0


def _add_export(commands: argparse._SubParsersAction) -> None:
    export = add_command(
        commands, "export", cmd_export, "write a trained model in another format (apple/ml-4m's FM folder)",
        ["fourm-kfp export runs/demo/<pretrain output> exported-ml4m"])
    export.add_argument("model", metavar="MODEL_DIR", help="a pretrain output URI (local path or s3://...)")
    export.add_argument("out", metavar="OUT", help="the folder to write (local path or s3://...)")
    export.add_argument("--format", choices=("ml4m",), default="ml4m",
                        help="ml4m: config.json + model.safetensors that ml-4m's FM.from_pretrained loads")
    export.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL)")


def cmd_export(args: argparse.Namespace) -> int:
    """Write a trained model as apple/ml-4m's model folder (config.json and model.safetensors), which ml-4m's
    FM.from_pretrained loads."""
    from fourm_kfp.errors import UserError
    from fourm_kfp.launchers.stage import apply_s3_endpoint
    from fourm_kfp.model.ml4m import Ml4mError, export_ml4m
    from fourm_kfp.model.saved_model import load_model

    apply_s3_endpoint(args.s3_endpoint)
    model, card = load_model(args.model)
    try:
        config = export_ml4m(model, args.out, card=card)
    except Ml4mError as exc:
        raise UserError(f"{args.model}: {exc}") from exc
    print(f"{args.out}: ml-4m model, domains in {', '.join(config['domains_in'])}; out "
          f"{', '.join(config['domains_out'])} (FM.from_pretrained({args.out!r}))")
    return 0


#: This group's commands, in the order ``fourm-kfp --help`` lists them: each adds its subcommand.
COMMANDS = (_add_generate, _add_export)
