"""The help text of the ``fourm-kfp`` command: its plain-text description and, per subcommand, the examples that
``fourm-kfp <command> --help`` ends with (as ``kfp``, ``mlflow`` and ``hf`` show theirs).

The text is plain (no reStructuredText): argparse prints it as written.
"""

from __future__ import annotations

import argparse
import textwrap

#: The top-level ``--help`` description.
DESCRIPTION = """\
Pre-train 4M-style multimodal masked models: run the pipeline locally (kfp.local) or on a Kubeflow Pipelines
server, run or verify one stage, plan, generate with a trained model, and show the configs.

Start-up stays light: heavy modules (torch, kfp, mlflow) load inside the commands that need them. A user error
prints one line, "Error: ...", and exits 2; --debug adds the traceback."""

#: Per subcommand: the paragraph under its usage line (where its one-line help is not enough).
DESCRIPTIONS = {
    "run": "Run the whole pipeline (prepare-data, label, train-tokenizers, pretokenize, pretrain, evaluate) on this "
           "machine through kfp.local. A stage whose output is committed under its content address is reused, "
           "not recomputed (--force recomputes it). The outputs go to --store (default: --root), the lineage to "
           "MLflow.",
    "stage": "Run one stage in this process, reading its inputs from the committed outputs of the stages before "
             "it (found by content address, or named with --input), and print its outcome as JSON. Fan-out stages "
             "run every part here, or one with --parts/--part.",
    "status": "Print, for each stage of the preset, its content address and whether an output is committed there "
              "(with its MLflow run and URI). Nothing is run or written.",
    "generate": "Generate target modalities from the given inputs with a trained model (a pretrain output), one "
                "target after another, each joining the inputs of the next.",
    "export": "Write a trained model as apple/ml-4m's model folder (config.json and model.safetensors), which "
              "ml-4m's FM.from_pretrained loads.",
    "ui": "Serve the full MLflow UI on a run folder's store (its mlflow.db) or on --mlflow-tracking-uri.",
    "compile": "Compile the KFP pipeline to its YAML package, for the images of the package version or of "
               "--image-tag.",
    "teachers": "List each labeler of the label stage with its weights and the hub commits it pins (with where "
                "each was seen in public), and print the commands that fetch the missing model folders (exit "
                "status 1 when one is missing).",
    "config": "Print the resolved config of a preset with its overrides applied, as YAML; --describe lists every "
              "config key instead, with its type, accepted values, default and doc.",
    "completion": "Print a shell completion script for fourm-kfp: its commands, their options and the preset "
                  "names. Load it in the current shell, or install it where the shell looks for completions.",
}

#: Per subcommand: example command lines (each shown under "Example:" in its --help).
EXAMPLES = {
    "run": ["fourm-kfp run --preset demo --root runs/demo",
            "fourm-kfp run --preset smoke --root runs/smoke --set train.steps=20 --force pretrain"],
    "stage": ["fourm-kfp stage prepare-data --preset smoke --root runs/smoke",
              "fourm-kfp stage pretrain --preset smoke --root runs/smoke --force --json outcome.json"],
    "launch": ["fourm-kfp launch pretrain --preset smoke --root runs/smoke -j 1x2",
               "fourm-kfp launch pretrain --preset 4m-b --root runs/4m-b --store s3://fourm-kfp --scheduler "
               "kubernetes -j 2x8 --gpu 8 --scheduler-arg queue=default --scheduler-arg namespace=team"],
    "status": ["fourm-kfp status --preset demo --root runs/demo",
               "fourm-kfp status --preset smoke --root runs/smoke --json"],
    "verify": ["fourm-kfp verify pretokenize --preset demo --root runs/demo"],
    "generate": ["fourm-kfp generate --model runs/demo/<pretrain output> --from rgb=photo.jpg --to depth,caption "
                 "--out generated"],
    "export": ["fourm-kfp export runs/demo/<pretrain output> exported-ml4m"],
    "submit": ["fourm-kfp submit --preset demo --endpoint https://kubeflow.example.com/pipeline -n team --wait",
               "fourm-kfp submit --preset 4m-b --host $KFP_HOST --param pretrain_nodes=2 --schedule '0 0 3 * * 1'"],
    "doctor": ["fourm-kfp doctor --preset 4m-b --host https://kubeflow.example.com/pipeline --namespace team"],
    "ui": ["fourm-kfp ui --root runs/demo --port 5000"],
    "compile": ["fourm-kfp compile --output fourm_pretrain.yaml --image-tag 0.1.0"],
    "teachers": ["fourm-kfp teachers --preset photos-4m21"],
    "config": ["fourm-kfp config --preset demo --set data.image_size=96",
               "fourm-kfp config --describe"],
    "completion": ["source <(fourm-kfp completion bash)",
                   "fourm-kfp completion zsh > \"${fpath[1]}/_fourm-kfp\"",
                   "fourm-kfp completion fish > ~/.config/fish/completions/fourm-kfp.fish"],
}


def subcommand_help(name: str, summary: str, description: str | None = None, epilog: str = "") -> dict:
    """The keyword arguments of ``add_parser`` for the subcommand ``name``: its one-line ``summary``, its
    description (given, or from :data:`DESCRIPTIONS`, else the summary) and an epilog ending with its examples,
    printed as written."""
    examples = "Example:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
    text = description or DESCRIPTIONS.get(name, summary)
    return {"help": summary, "description": "\n\n".join(textwrap.fill(p, 100) for p in text.split("\n\n")),
            "epilog": f"{epilog}\n\n{examples}" if epilog else examples,
            "formatter_class": argparse.RawDescriptionHelpFormatter}
