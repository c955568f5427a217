"""Any-to-any generation with a trained :class:`~fourm_kfp.model.fourm.FourM`, at the level of tokens.

A *sample* is a dict from modality name to its tokens: a flat token grid (``h * w`` ids, row-major) for an image
modality, the text's ids (no sentinels) for a sequence modality; ``"pixels"`` (uint8 ``[H, W, 3]``) feeds a model
whose ``rgb`` enters as pixel patches. Every modality present is an encoder input, in full.

* **Image targets** are generated iteratively: every step decodes all still-masked positions, samples a token for
  each, and keeps the ``k`` most confident (``order="maskgit"``, confidence = the model's log-probability of the
  sampled token) or ``k`` random ones (``order="roar"``); kept tokens join the encoder inputs for the next step, as
  in 4M. ``k`` follows a cosine or linear schedule over ``steps``. With one step and temperature 0 this is a single
  argmax pass. A modality the model reads as pixel patches (rgb) takes its kept tokens back as pixels: each step's
  grid (kept tokens, the rest filled with this step's predictions) is decoded by the modality's tokenizer
  (``pixel_decoders``) and the kept positions' patches of that image join the inputs. Without a decoder every step
  sees the inputs only: all positions are guessed from the inputs alone, whatever the schedule.
* **Sequence targets** are decoded autoregressively from the first sentinel until the second (the format the model
  was trained on, :func:`~fourm_kfp.masking.span_masking.whole_target`), with a KV cache: each new token runs the
  decoder on that token only.
* Sampling: temperature (0 = argmax), top-k, top-p; **classifier-free guidance** mixes the conditional logits with
  those of an unconditional pass (no input but the target's own tokens so far): ``u + g * (c - u)``.
* **Chains** (``caption → rgb → depth``) add each generated modality to the inputs of the next.

Everything is batched, runs in inference mode, under bf16 autocast where ``precision: auto`` trains in bf16 (CUDA, CPUs
with bf16 arithmetic: :func:`fourm_kfp.hardware.resolve_precision`), and is deterministic for a seed on one machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

import numpy as np
import torch

from fourm_kfp.batch import IGNORE_INDEX, MaskedBatch, normalised_pixels
from fourm_kfp.hardware import resolve_precision

Sample = dict[str, np.ndarray]
PixelDecoder = Callable[[torch.Tensor], np.ndarray]


@dataclass(frozen=True)
class SamplingArgs:
    """How to sample (the ``evaluate.sampling`` config section has the same fields)."""

    steps: int = 8
    order: Literal["maskgit", "roar"] = "maskgit"
    schedule: Literal["cosine", "linear"] = "cosine"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    guidance: float = 1.0
    max_text_tokens: int = 0  # 0: as long as the modality's positions allow

    def __post_init__(self) -> None:
        if self.steps < 1 or self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling arguments {self}")


@dataclass
class Generated:
    """One sample's generated target: ``tokens`` (an ``[h, w]`` grid or a 1-D id sequence) and the model's
    log-probability of each generated token (same shape)."""

    tokens: np.ndarray
    logprobs: np.ndarray


def unmasking_schedule(n: int, steps: int, schedule: str = "cosine") -> list[int]:
    """How many tokens each step fixes (at least one per step while any are left; sums to ``n``)."""
    steps = min(steps, n)
    remaining = [n]
    for s in range(1, steps + 1):
        ratio = math.cos(math.pi / 2 * s / steps) if schedule == "cosine" else 1 - s / steps
        remaining.append(min(remaining[-1] - 1, math.ceil(n * ratio) if s < steps else 0))
    return [a - b for a, b in zip(remaining, remaining[1:])]


def sample_logits(logits: torch.Tensor, args: SamplingArgs,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, log-probability under the unfiltered model distribution)`` for logits ``[..., V]``."""
    logprobs = logits.float().log_softmax(-1)
    if args.temperature == 0:
        tokens = logprobs.argmax(-1)
    else:
        scores = logprobs / args.temperature
        if args.top_k:
            kth = scores.topk(min(args.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if args.top_p < 1:
            sorted_scores, order = scores.sort(-1, descending=True)
            cumulative = sorted_scores.softmax(-1).cumsum(-1)
            drop = cumulative - sorted_scores.softmax(-1) >= args.top_p  # keeps the first token always
            scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, -math.inf))
        probs = scores.softmax(-1).reshape(-1, scores.shape[-1])
        tokens = torch.multinomial(probs, 1, generator=generator).reshape(scores.shape[:-1])
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class Generator:
    """Generation with one model. ``sentinels``: the ids of the first two sentinels the model's text conventions use
    (:func:`fourm_kfp.tokenizers.text_tokenizer.text_sentinels`: ``[S_0]``, ``[S_1]``; ml-4m's ``[S_1]``, ``[S_2]``);
    ``pixel_decoders``: for a modality the model reads as pixels, its tokenizer's decoder (token grids ``[B, h, w]``
    to ``uint8 [B, H, W, 3]`` images), so that a generated image's kept tokens can be read back between steps;
    ``precision``: ``auto`` (bf16 autocast where training's ``auto`` picks it), ``bf16`` or ``fp32``."""

    def __init__(self, model: torch.nn.Module, sentinels: Sequence[int] = (),
                 pixel_decoders: Mapping[str, PixelDecoder] | None = None, precision: str = "auto"):
        self.model = model.eval()
        self.pixel_decoders = dict(pixel_decoders or {})
        self.specs = {s.name: s for s in model.args.modalities}
        self.index = {name: i for i, name in enumerate(model.args.names)}
        self.sentinels = tuple(sentinels)
        #: how the model's pixel input is normalised (its pixel_input modality's spec)
        self.pixel_normalisation = next((s.pixel_normalisation for s in self.specs.values() if s.pixel_input),
                                        "symmetric")
        self.device = next(model.parameters()).device
        self.autocast = resolve_precision(precision, self.device) is not None

    # -- public API ----------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, samples: Sequence[Sample], target: str, args: SamplingArgs = SamplingArgs(),
                 seed: int = 0) -> list[Generated]:
        """Generate ``target`` for every sample (its other modalities are the inputs)."""
        if target not in self.specs:
            raise ValueError(f"the model has no modality {target!r}; it knows {sorted(self.specs)}")
        generator = torch.Generator(self.device).manual_seed(seed)
        conditioning = [{k: v for k, v in s.items() if k != target} for s in samples]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            if self.specs[target].kind == "image":
                return self._generate_image(conditioning, target, args, generator)
            return self._generate_text(conditioning, target, args, generator)

    def chain(self, samples: Sequence[Sample], targets: Sequence[str], args: SamplingArgs = SamplingArgs(),
              seed: int = 0) -> list[Sample]:
        """Generate ``targets`` in order, each added to the inputs of the next; returns the grown samples."""
        grown = [dict(s) for s in samples]
        for step, target in enumerate(targets):
            for sample, out in zip(grown, self.generate(grown, target, args, seed + step)):
                sample[target] = out.tokens.reshape(-1) if self.specs[target].kind == "image" else out.tokens
        return grown

    # -- batches -------------------------------------------------------------------------------------------------

    def _encoder_slots(self, sample: Sample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tokens, modality, position = [], [], []
        for name, value in sample.items():
            if name == "pixels":
                continue
            if name not in self.specs:
                raise ValueError(f"input modality {name!r} is not one of the model's {sorted(self.specs)}")
            spec = self.specs[name]
            ids = np.asarray(value, dtype=np.int64).reshape(-1)
            if spec.kind == "image" and ids.size != spec.num_positions:
                raise ValueError(f"input {name!r} has {ids.size} tokens; the model's grid {spec.grid} needs "
                                 f"{spec.num_positions}")
            ids = ids[: spec.num_positions]
            tokens.append(np.zeros_like(ids) if spec.pixel_input else ids)
            modality.append(np.full(ids.size, self.index[name]))
            position.append(np.arange(ids.size))
        if not tokens:
            return (np.zeros(0, np.int64),) * 3
        return np.concatenate(tokens), np.concatenate(modality), np.concatenate(position)

    def _conditioning(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor | None]:
        slots = [self._encoder_slots(s) for s in samples]
        width = max(1, max(len(t) for t, _, _ in slots))
        out = np.zeros((3, len(samples), width), np.int64)
        valid = np.zeros((len(samples), width), bool)
        for j, parts in enumerate(slots):
            n = len(parts[0])
            out[:, j, :n] = np.stack(parts)
            valid[j, :n] = True
        pixels = None
        if any(s.pixel_input for s in self.specs.values()) and any("pixels" in s for s in samples):
            size = next(s["pixels"].shape for s in samples if "pixels" in s)
            stored = np.stack([s["pixels"] if "pixels" in s else np.zeros(size, np.uint8) for s in samples])
            pixels = self._normalised(stored, absent=["pixels" not in s for s in samples])
        t = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return {"tokens": t(out[0]), "modality": t(out[1]), "position": t(out[2]), "valid": t(valid),
                "pixels": pixels}

    def _normalised(self, images: np.ndarray, absent: Sequence[bool] = ()) -> torch.Tensor:
        """``[B, H, W, 3]`` pixel values as the model's normalised ``[B, 3, H, W]`` input; the ``absent`` samples
        read zeros (as a batch's samples without pixels do in training)."""
        normalised = np.ascontiguousarray(normalised_pixels(images, self.pixel_normalisation))
        if any(absent):
            normalised[np.asarray(absent, bool)] = 0.0
        return torch.from_numpy(normalised).to(self.device)

    def _batch(self, enc: dict[str, torch.Tensor | None], dec_tokens: torch.Tensor, dec_modality: int,
               dec_position: torch.Tensor) -> MaskedBatch:
        b, d = dec_position.shape
        full = lambda v: torch.full((b, d), v, dtype=torch.long, device=self.device)  # noqa: E731
        return MaskedBatch(enc["tokens"], enc["modality"], enc["position"], enc["valid"], dec_tokens,
                           full(IGNORE_INDEX), full(dec_modality), dec_position, torch.ones(b, d, dtype=torch.bool,
                                                                                     device=self.device),
                           torch.zeros(0, dtype=torch.long, device=self.device), [], enc["pixels"])

    @staticmethod
    def _with_unconditional(enc: dict[str, torch.Tensor | None], keep: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """``enc`` stacked over a copy where only the ``keep`` slots stay valid: the unconditional half of
        classifier-free guidance, run in the same forward pass as the conditional one."""
        doubled = {k: (torch.cat([v, v]) if v is not None else None) for k, v in enc.items()}
        doubled["valid"] = torch.cat([enc["valid"], enc["valid"] & keep])
        return doubled

    @staticmethod
    def _guide(logits: torch.Tensor, guidance: float) -> torch.Tensor:
        """Conditional (first half of the batch) and unconditional (second half) logits mixed: ``u + g (c - u)``."""
        cond, uncond = logits.chunk(2)
        return uncond + guidance * (cond - uncond)

    def _guided_logits(self, enc, dec_tokens, modality: int, dec_position, keep, args: SamplingArgs) -> torch.Tensor:
        guided = args.guidance != 1.0
        if guided:
            enc = self._with_unconditional(enc, keep)
            dec_tokens, dec_position = torch.cat([dec_tokens, dec_tokens]), torch.cat([dec_position, dec_position])
        batch = self._batch(enc, dec_tokens, modality, dec_position)
        logits = self.model.logits(self.model.decode(self.model.encode(batch), batch), modality).float()
        return self._guide(logits, args.guidance) if guided else logits

    # -- image targets: MaskGIT / ROAR ---------------------------------------------------------------------------

    def _generate_image(self, conditioning, target: str, args: SamplingArgs,
                        generator: torch.Generator) -> list[Generated]:
        spec, m = self.specs[target], self.index[target]
        # A modality that enters the encoder as pixels takes its kept tokens back as the pixels of their decoded
        # grid; without its decoder each step sees only the inputs (the schedule still decides what is kept when).
        as_pixels = spec.pixel_input and target in self.pixel_decoders
        feed_back = as_pixels or not spec.pixel_input
        b, n = len(conditioning), spec.num_positions
        cond = self._conditioning(conditioning)
        known = torch.zeros(b, n, dtype=torch.bool, device=self.device)
        tokens = torch.zeros(b, n, dtype=torch.long, device=self.device)
        logprobs = torch.zeros(b, n, device=self.device)
        remaining = n
        for count in unmasking_schedule(n, args.steps, args.schedule):
            # Fixed shapes: every sample has the same number of known tokens, so sorting the mask groups them.
            order = known.long().argsort(dim=1, stable=True)
            masked_pos, known_pos = order[:, :remaining], order[:, remaining:]
            if not feed_back:
                known_pos = known_pos[:, :0]
            enc = {**cond,
                   "tokens": torch.cat([cond["tokens"], tokens.gather(1, known_pos)], 1),
                   "modality": torch.cat([cond["modality"], torch.full_like(known_pos, m)], 1),
                   "position": torch.cat([cond["position"], known_pos], 1),
                   "valid": torch.cat([cond["valid"], torch.ones_like(known_pos, dtype=torch.bool)], 1)}
            keep = torch.cat([torch.zeros_like(cond["valid"]), torch.ones_like(known_pos, dtype=torch.bool)], 1)
            logits = self._guided_logits(enc, torch.zeros_like(masked_pos), m, masked_pos, keep, args)
            sampled, sampled_logprob = sample_logits(logits, args, generator)
            if args.order == "maskgit":
                confidence = sampled_logprob
            else:
                confidence = torch.rand(sampled.shape, generator=generator, device=self.device)
            chosen = confidence.topk(count, dim=1).indices
            where = masked_pos.gather(1, chosen)
            if as_pixels and remaining > count:  # the next step reads this step's image where tokens are kept
                filled = tokens.scatter(1, masked_pos, sampled).reshape(b, *spec.grid)
                cond = {**cond, "pixels": self._normalised(self.pixel_decoders[target](filled))}
            tokens.scatter_(1, where, sampled.gather(1, chosen))
            logprobs.scatter_(1, where, sampled_logprob.gather(1, chosen))
            known.scatter_(1, where, True)
            remaining -= count
        grid = tokens.reshape(b, *spec.grid).cpu().numpy()
        lp = logprobs.reshape(b, *spec.grid).float().cpu().numpy()
        return [Generated(grid[i], lp[i]) for i in range(b)]

    # -- sequence targets: autoregressive with a KV cache --------------------------------------------------------

    def _generate_text(self, conditioning, target: str, args: SamplingArgs,
                       generator: torch.Generator) -> list[Generated]:
        if len(self.sentinels) < 2:
            raise ValueError("text generation needs the ids of the text tokenizer's first two sentinels")
        spec, m = self.specs[target], self.index[target]
        start, end = self.sentinels[0], self.sentinels[1]
        cond = self._conditioning(conditioning)
        b = len(conditioning)
        guided = args.guidance != 1.0
        enc = self._with_unconditional(cond, torch.zeros_like(cond["valid"])) if guided else cond
        valid = enc["valid"]
        rows = 2 * b if guided else b
        probe = self._batch(enc, torch.zeros(rows, 1, dtype=torch.long, device=self.device), m,
                            torch.zeros(rows, 1, dtype=torch.long, device=self.device))
        memory = self.model.encode(probe)
        cross_mask = self.model.cross_mask(valid)
        caches = self.model.decoder_cache(memory)
        length = spec.max_length - 1 if not args.max_text_tokens else min(args.max_text_tokens, spec.max_length - 1)
        current = torch.full((rows, 1), start, dtype=torch.long, device=self.device)
        modality = torch.full((rows, 1), m, dtype=torch.long, device=self.device)
        finished = torch.zeros(b, dtype=torch.bool, device=self.device)
        out_tokens, out_logprobs = [], []
        for p in range(length):
            position = torch.full((rows, 1), p, dtype=torch.long, device=self.device)
            hidden = self.model.decode_step(self.model.decoder_queries(current, modality, position), caches,
                                            cross_mask)
            logits = self.model.logits(hidden[:, 0], m).float()
            if guided:
                logits = self._guide(logits, args.guidance)
            token, logprob = sample_logits(logits, args, generator)
            token = torch.where(finished, torch.full_like(token, end), token)
            out_tokens.append(token)
            out_logprobs.append(logprob)
            finished |= token == end
            current = (torch.cat([token, token]) if guided else token).unsqueeze(1)
            if p % 8 == 7 and bool(finished.all()):  # one host sync every 8 tokens
                break
        ids = torch.stack(out_tokens, 1).cpu().numpy()
        lps = torch.stack(out_logprobs, 1).float().cpu().numpy()
        results = []
        for row, lp in zip(ids, lps):
            stop = int(np.argmax(row == end)) if (row == end).any() else len(row)
            results.append(Generated(row[:stop].copy(), lp[:stop].copy()))
        return results
