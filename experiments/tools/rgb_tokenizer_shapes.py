"""What an rgb tokenizer keeps of the shapes in an image, read by a fixed reader that is not the 4M model.

caption-to-rgb is scored by the shapes a reader finds in the generated image (``shape_presence_f1``: a shape is
present where it covers at least 0.2% of the pixels), and its ceiling is the true image's rgb tokens decoded and
read the same way. On a GPU proof model that ceiling was 0.735 where the model read the true pixels at 0.927: the
tokenizer's reconstructions lose shapes, or give some pixels of one shape another's look. This bench measures that
loss for any number of rgb tokenizers without training a 4M model: a small per-pixel segmentation network (the
reader) is trained on true train images → semseg for ``--reader-steps`` steps, then reads the val images from their
pixels and from each tokenizer's reconstruction (encode → decode). Per tokenizer: shape presence F1 (precision,
recall), pixel accuracy of the reading against the true semseg, reconstruction MSE (0..255 units) and PSNR as the
tokenizer report computes them, and codes used.

    .venv/bin/python experiments/tools/rgb_tokenizer_shapes.py --data runs/proof/prepare-data/<id> \\
        --tokenizers runs/proof/train-tokenizers/<id> [more train-tokenizers outputs] --output out.json

Prints one JSON object (``--output`` writes it too). Not a benchmark: the probe of
``experiments/2026-11-26-proof-h100-rgb-tokenizer/``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fourm_kfp.data.modalities import CLASS_NAMES
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.evaluation import shape_presence as tm
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from fourm_kfp.tokenizers.metrics import rgb_errors

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the benches' strict-JSON writer
from bench_output import emit  # noqa: E402


def load_split(data_uri: str, split: str, modalities: list[str], limit: int) -> dict[str, list]:
    """The first ``limit`` samples of ``split``: per modality, the list of decoded values."""
    out: dict[str, list] = {m: [] for m in modalities}
    for _, sample in iter_split(open_store(data_uri), split, modalities, limit=limit):
        for m in modalities:
            out[m].append(sample[m])
    return out


def as_pixels(images: list[np.ndarray] | np.ndarray) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` images → float ``[N, 3, H, W]`` in [-1, 1]."""
    x = torch.from_numpy(np.stack([np.asarray(i) for i in images])).float()
    return x.permute(0, 3, 1, 2) / 127.5 - 1.0


class Reader(nn.Module):
    """A per-pixel classifier with a receptive field of ~40 px (dilated 3x3 convs), enough to see a whole shape."""

    def __init__(self, width: int, classes: int = len(CLASS_NAMES)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.GELU()]
        for dilation in (1, 2, 4, 8, 4, 2, 1):
            layers += [nn.Conv2d(width, width, 3, padding=dilation, dilation=dilation), nn.BatchNorm2d(width),
                       nn.GELU()]
        layers.append(nn.Conv2d(width, classes, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train_reader(rgb: torch.Tensor, semseg: torch.Tensor, steps: int, batch: int, width: int, seed: int) -> Reader:
    torch.manual_seed(seed)
    reader = Reader(width)
    opt = torch.optim.AdamW(reader.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    start = time.time()
    for step in range(steps):
        idx = torch.randint(0, len(rgb), (batch,), generator=g)
        x, y = rgb[idx], semseg[idx]
        if torch.rand((), generator=g) < 0.5:  # image and map mirrored together: a mirrored shape is the same shape
            x, y = x.flip(-1), y.flip(-1)
        loss = F.cross_entropy(reader(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % max(1, steps // 10) == 0:
            rate = (step + 1) / (time.time() - start)
            print(f"reader step {step + 1}/{steps} loss {loss.item():.4f} {rate:.1f} steps/s "
                  f"ETA {(steps - step - 1) / rate:.0f} s", flush=True)
    return reader.eval()


@torch.no_grad()
def read(reader: Reader, rgb: torch.Tensor, batch: int = 64) -> np.ndarray:
    return np.concatenate([reader(rgb[i:i + batch]).argmax(1).numpy() for i in range(0, len(rgb), batch)])


def scores(reader: Reader, pixels: torch.Tensor, captions: list[str], truth: np.ndarray) -> dict[str, float]:
    """The reader's semseg of ``pixels``: shape presence against ``captions``, pixel accuracy against ``truth``."""
    semseg = read(reader, pixels)
    f1 = tm.shape_presence_stats(list(semseg), captions).whole()
    return {**{k: round(float(v), 4) for k, v in f1.items()},
            "pixel_accuracy": round(float((semseg == truth).mean()), 4),
            "shapes_per_image": round(float(np.mean([len(tm.shapes_in_semseg(s)) for s in semseg])), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a prepare-data output (local folder or s3:// URI)")
    parser.add_argument("--tokenizers", nargs="+", required=True, help="train-tokenizers outputs with an rgb tokenizer")
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--val-images", type=int, default=256)
    parser.add_argument("--reader-steps", type=int, default=1000)
    parser.add_argument("--reader-width", type=int, default=32, help="channels of the reader's convolutions")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output")
    args = parser.parse_args()
    start = time.time()
    train = load_split(args.data, "train", ["rgb", "semseg"], args.train_images)
    val = load_split(args.data, "val", ["rgb", "semseg", "caption"], args.val_images)
    reader = train_reader(as_pixels(train["rgb"]), torch.from_numpy(np.stack(train["semseg"]).astype(np.int64)),
                          args.reader_steps, args.batch, args.reader_width, args.seed)
    val_rgb, val_semseg = np.stack(val["rgb"]), np.stack(val["semseg"])
    truth_sets = [tm.caption_shapes(c) for c in val["caption"]]
    result = {"data": args.data, "train_images": len(train["rgb"]), "val_images": len(val["rgb"]),
              "reader": {"steps": args.reader_steps, "width": args.reader_width, "batch": args.batch},
              "true_pixels": scores(reader, as_pixels(val_rgb), val["caption"], val_semseg),
              "shapes_per_caption": round(float(np.mean([len(s) for s in truth_sets])), 3), "tokenizers": {}}
    for uri in args.tokenizers:
        tokenizer = load_tokenizers(uri).image["rgb"]
        tokens = torch.cat([tokenizer.encode(val_rgb[i:i + 64]) for i in range(0, len(val_rgb), 64)])
        recon = np.concatenate([tokenizer.decode(tokens[i:i + 64]) for i in range(0, len(tokens), 64)])
        result["tokenizers"][uri] = {
            "config": {k: v for k, v in tokenizer.config.to_dict().items() if k != "norm_stats"},
            "reconstruction": scores(reader, as_pixels(recon), val["caption"], val_semseg),
            **{k: round(v, 3) for k, v in rgb_errors(recon, val_rgb).items()},  # the tokenizer report's mse, psnr
            "codes_used": int(torch.unique(tokens).numel())}
    result["seconds"] = round(time.time() - start, 1)
    emit(result, args.output)


if __name__ == "__main__":
    main()
