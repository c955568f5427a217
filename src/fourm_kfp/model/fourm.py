"""FourM: the 4M encoder-decoder over a :class:`~fourm_kfp.batch.MaskedBatch` (single-device code).

Embeddings are single tables with per-modality offsets, so one gather embeds every slot of every modality at once:
the token id of slot ``s`` of modality ``m`` is looked up at ``offset[m] + id``, its position at
``position_offset[m] + position`` in a fixed sin-cos table (2-D for grids, 1-D for sequences), and a learned
modality embedding (shared by encoder and decoder) is added. ``rgb`` may instead enter as a linear projection of
its pixel patches; the encoder table then has one placeholder row for it (zeros) instead of its vocabulary (rows
that no step would read, that the optimizer and the gradient norm would still pass over every step). Decoder queries of
image modalities are a learned mask token; sequence modalities are decoded with teacher forcing from
``dec_tokens``. The decoder's context is the normalised encoder output, projected, with
each input's position and modality embedding added again (the reference's ``decoder_proj_context``): a target
query finds the inputs at its own position by the same sin-cos code it carries, without the encoder having to
keep that code intact through its layers. Attention masks are built once per batch from the slot tensors: the
encoder attends over valid inputs; decoder self-attention stays within one modality (bidirectional for images,
causal by position for sequences); cross-attention sees every valid encoder token. A batch whose encoder slots are
all valid (the loader's host flag ``enc_all_valid``: budgets filled, the usual case in training) attends over the
encoder without a mask, which the CPU's fused attention kernel runs faster.

The output heads share one weight (tied to the decoder token table unless configured otherwise); the loss gathers
the decoder slots by modality with the loader's host-side ``target_order``/``target_counts`` and applies each
modality's slice of the head to its contiguous segment: no host synchronisation anywhere in ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fourm_kfp.batch import IGNORE_INDEX, MaskedBatch, ModalitySpec
from fourm_kfp.model.layers import DecoderBlock, EncoderBlock, init_weights, layer_norm, sincos_1d, sincos_2d
from fourm_kfp.model.table_gradients import gather_rows, slice_cross_entropy

#: The sizes of the public 4M models (encoder layers, decoder layers, width, heads): apple/ml-4m's
#: ``fourm/models/fm.py``, ``fm_tiny_6e_6d`` to ``fm_xlarge_24e_24d``.
SIZES = {"tiny": (6, 6, 384, 6), "small": (8, 8, 512, 8), "base": (12, 12, 768, 12), "large": (24, 24, 1024, 16),
         "xlarge": (24, 24, 2048, 32)}


@dataclass(frozen=True)
class FourMArgs:
    """Everything needed to build the model (saved with it)."""

    modalities: tuple[ModalitySpec, ...]
    encoder_layers: int = 2
    decoder_layers: int = 2
    dim: int = 64
    heads: int = 2
    tie_embeddings: bool = True
    label_smoothing: float = 0.0
    loss_weighting: Literal["modality", "token"] = "modality"
    norm_eps: float = 1e-6
    init_std: float = 0.02
    position_temperature: float = 10000.0  # the sin-cos tables' longest wavelength (ml-4m: 10000)
    #: ml-4m's layout, off by default (model/ml4m/): a bias on the decoder's context projection (ml-4m's
    #: ``decoder_proj_context`` has one even in its bias-free models), and a modality embedding of its own for the
    #: pixel patches of a ``pixel_input`` modality (ml-4m's ``rgb@224``, apart from the tokens' ``tok_rgb@224``)
    context_bias: bool = False
    pixel_modality_embed: bool = False

    def __post_init__(self) -> None:
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.heads} heads of even width")
        if len({m.name for m in self.modalities}) != len(self.modalities) or not self.modalities:
            raise ValueError("modalities must be a non-empty list of distinct names")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modalities)


@dataclass
class FourMOutput:
    loss: torch.Tensor  # the training loss (0-dim)
    modality_losses: dict[str, torch.Tensor]  # mean cross-entropy per modality present in the batch
    modality_accuracy: dict[str, torch.Tensor] = field(default_factory=dict)  # top-1 token accuracy (on request)
    token_counts: dict[str, int] = field(default_factory=dict)  # target tokens per modality (host ints)
    #: on request (``per_sample=True``): per modality, ``[B, 3]`` float sums per sample of the cross-entropy, the
    #: correctly predicted tokens and the target tokens (samples without targets of the modality: zeros)
    sample_sums: dict[str, torch.Tensor] = field(default_factory=dict)


def _offsets(sizes: list[int]) -> torch.Tensor:
    return torch.tensor([0] + sizes[:-1], dtype=torch.long).cumsum(0)


class FourM(nn.Module):
    def __init__(self, args: FourMArgs):
        super().__init__()
        self.args = args
        dim = args.dim
        vocab = [m.vocab_size for m in args.modalities]
        # a modality read as pixel patches never looks up its encoder tokens: one placeholder row, not a vocabulary
        enc_vocab = [1 if m.pixel_input else m.vocab_size for m in args.modalities]
        self.register_buffer("token_offset", _offsets(vocab), persistent=False)
        self.register_buffer("enc_token_offset", _offsets(enc_vocab), persistent=False)
        self.register_buffer("position_offset", _offsets([m.num_positions for m in args.modalities]),
                             persistent=False)
        t = args.position_temperature
        tables = [sincos_2d(*m.grid, dim, t) if m.kind == "image" else sincos_1d(m.max_length, dim, t)
                  for m in args.modalities]
        self.register_buffer("positions", torch.cat(tables), persistent=False)
        self.register_buffer("is_sequence", torch.tensor([m.kind == "sequence" for m in args.modalities]),
                             persistent=False)
        self.vocab_sizes = vocab

        self.modality_embed = nn.Embedding(len(vocab), dim)
        self.enc_token_embed = nn.Embedding(sum(enc_vocab), dim)
        self.dec_token_embed = nn.Embedding(sum(vocab), dim)
        self.mask_token = nn.Parameter(torch.zeros(dim))
        pixel = [m for m in args.modalities if m.pixel_input]
        self.pixel_index = args.names.index(pixel[0].name) if pixel else -1
        self.patch_size = pixel[0].patch_size if pixel else 0
        self.patch_embed = nn.Linear(3 * self.patch_size**2, dim, bias=False) if pixel else None

        self.encoder = nn.ModuleList(EncoderBlock(dim, args.heads, args.norm_eps) for _ in range(args.encoder_layers))
        self.decoder = nn.ModuleList(DecoderBlock(dim, args.heads, args.norm_eps) for _ in range(args.decoder_layers))
        self.encoder_norm = layer_norm(dim, args.norm_eps)
        self.context_proj = nn.Linear(dim, dim, bias=args.context_bias)
        self.decoder_norm = layer_norm(dim, args.norm_eps)
        self.head = None if args.tie_embeddings else nn.Linear(dim, sum(vocab), bias=False)
        #: token tables and head write their gradients in place (model/table_gradients.py); set by parallelize()
        self.table_grads_in_place = False
        self.pixel_modality_embed = nn.Parameter(torch.zeros(dim)) if pixel and args.pixel_modality_embed else None
        self.apply(lambda module: init_weights(module, args.init_std))
        nn.init.normal_(self.mask_token, std=args.init_std)
        if self.pixel_modality_embed is not None:
            nn.init.normal_(self.pixel_modality_embed, std=args.init_std)
        with torch.no_grad():  # the placeholder rows of pixel modalities are zeros: never read, never trained
            for index, spec in enumerate(args.modalities):
                if spec.pixel_input:
                    self.enc_token_embed.weight[self.enc_token_offset[index]].zero_()

    # -- embeddings ----------------------------------------------------------------------------------------------

    def _context(self, modality: torch.Tensor, position: torch.Tensor, encoder: bool = False) -> torch.Tensor:
        embedded = self.modality_embed(modality)
        if encoder and self.pixel_modality_embed is not None:  # pixel slots have a modality embedding of their own
            embedded = torch.where((modality == self.pixel_index).unsqueeze(-1), self.pixel_modality_embed, embedded)
        return self.positions[self.position_offset[modality] + position] + embedded

    def _in_place_grads(self) -> bool:
        return self.table_grads_in_place and torch.is_grad_enabled()

    def _lookup(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        return gather_rows(table.weight, ids) if self._in_place_grads() else table(ids)

    def embed_encoder(self, batch: MaskedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, context)`` ``[B, E, dim]`` each: the inputs' token (or pixel patch) embeddings and their
        position plus modality embeddings; the encoder reads their sum."""
        ids = batch.enc_tokens
        if self.patch_embed is not None:  # pixel slots read the placeholder row, whatever id they carry
            ids = ids.masked_fill(batch.enc_modality == self.pixel_index, 0)
        tokens = self._lookup(self.enc_token_embed, ids + self.enc_token_offset[batch.enc_modality])
        if self.patch_embed is not None and batch.pixels is not None:
            p = self.patch_size
            b, c, h, w = batch.pixels.shape
            patches = batch.pixels.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
            patches = self.patch_embed(patches.reshape(b, (h // p) * (w // p), c * p * p).to(tokens.dtype))
            index = batch.enc_position.clamp(max=patches.shape[1] - 1)
            gathered = patches.gather(1, index.unsqueeze(-1).expand(-1, -1, patches.shape[-1]))
            tokens = torch.where((batch.enc_modality == self.pixel_index).unsqueeze(-1), gathered, tokens)
        return tokens, self._context(batch.enc_modality, batch.enc_position, encoder=True)

    def embed_decoder(self, batch: MaskedBatch) -> torch.Tensor:
        return self.decoder_queries(batch.dec_tokens, batch.dec_modality, batch.dec_position)

    def decoder_queries(self, tokens: torch.Tensor, modality: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Decoder inputs: the previous token for a sequence slot, the mask token for an image slot, plus context."""
        embedded = self._lookup(self.dec_token_embed, tokens + self.token_offset[modality])
        queries = torch.where(self.is_sequence[modality].unsqueeze(-1), embedded, self.mask_token)
        return queries + self._context(modality, position)

    # -- masks (once per batch) -----------------------------------------------------------------------------------

    @staticmethod
    def encoder_mask(valid: torch.Tensor) -> torch.Tensor:
        """``[B, 1, E, E]``: every token attends to the valid ones (a padding row attends to itself)."""
        eye = torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device)
        return (valid[:, None, :] | eye).unsqueeze(1)

    def decoder_masks(self, batch: MaskedBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention ``[B, 1, D, D]`` within one modality (causal for sequences), cross ``[B, 1, 1, E]``
        (``None`` when every encoder slot is valid)."""
        mod, pos, valid = batch.dec_modality, batch.dec_position, batch.dec_valid
        same = mod[:, :, None] == mod[:, None, :]
        causal = ~self.is_sequence[mod][:, :, None] | (pos[:, None, :] <= pos[:, :, None])
        eye = torch.eye(mod.shape[1], dtype=torch.bool, device=mod.device)
        self_mask = (same & causal & valid[:, None, :]) | eye
        return self_mask.unsqueeze(1), None if batch.enc_all_valid else self.cross_mask(batch.enc_valid)

    @staticmethod
    def cross_mask(enc_valid: torch.Tensor) -> torch.Tensor:
        """``[B, 1, 1, E]``: decoder queries see every valid encoder token. A sample with none (an unconditional
        pass of classifier-free guidance) sees slot 0, a padding embedding, so attention stays finite."""
        first = torch.zeros_like(enc_valid)
        first[:, 0] = True
        return (enc_valid | (first & ~enc_valid.any(-1, keepdim=True)))[:, None, None, :]

    # -- trunk ---------------------------------------------------------------------------------------------------

    def encode(self, batch: MaskedBatch) -> torch.Tensor:
        """The decoder's context ``[B, E, dim]``: the normalised encoder output, projected, plus each input's
        position and modality embedding (see the module docstring)."""
        tokens, context = self.embed_encoder(batch)
        x = tokens + context
        mask = None if batch.enc_all_valid else self.encoder_mask(batch.enc_valid)
        for block in self.encoder:
            x = block(x, mask)
        return self.context_proj(self.encoder_norm(x)) + context

    def decode(self, memory: torch.Tensor, batch: MaskedBatch) -> torch.Tensor:
        """Decoder output ``[B, D, dim]`` for the decoder slots of ``batch`` given the context ``memory``
        (:meth:`encode`)."""
        x = self.embed_decoder(batch)
        self_mask, cross_mask = self.decoder_masks(batch)
        for block in self.decoder:
            x = block(x, memory, self_mask, cross_mask)
        return self.decoder_norm(x)

    def decoder_cache(self, memory: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Per decoder block: the cross-attention keys/values of ``memory``, ready for :meth:`decode_step`."""
        caches = []
        for block in self.decoder:
            k, v = block.cross_attn.context_kv(block.context_norm(memory))
            caches.append({"cross_k": k, "cross_v": v})
        return caches

    def decode_step(self, queries: torch.Tensor, caches: list[dict[str, torch.Tensor]],
                    cross_mask: torch.Tensor) -> torch.Tensor:
        """Decoder output for the next positions of one sequence modality, attending causally to the positions
        already in ``caches`` (which grow): the KV-cached equivalent of :meth:`decode` for autoregressive text."""
        x = queries
        for block, cache in zip(self.decoder, caches):
            x = block.step(x, cache, cross_mask)
        return self.decoder_norm(x)

    def _head_table(self) -> torch.Tensor:
        """The output head's weight over every modality's vocabulary (the decoder token table when tied)."""
        return self.dec_token_embed.weight if self.head is None else self.head.weight

    def _head_rows(self, modality: int) -> tuple[int, int]:
        start = sum(self.vocab_sizes[:modality])
        return start, start + self.vocab_sizes[modality]

    def head_weight(self, modality: int) -> torch.Tensor:
        start, stop = self._head_rows(modality)
        return self._head_table()[start:stop]

    def head_weights(self) -> tuple[torch.Tensor, ...]:
        """Every modality's slice of the output head in one ``split``. In backward, a split joins the slices'
        gradients once; a slice per modality would fill a zero gradient of the whole table for each (the same
        values, bit for bit, at one table-sized write instead of one per modality)."""
        return self._head_table().split(list(self.vocab_sizes))

    def logits(self, hidden: torch.Tensor, modality: str | int) -> torch.Tensor:
        """``[..., vocab of modality]`` logits of decoder states ``hidden``."""
        index = self.args.names.index(modality) if isinstance(modality, str) else modality
        return hidden @ self.head_weight(index).t()

    # -- loss ----------------------------------------------------------------------------------------------------

    def forward(self, batch: MaskedBatch, with_accuracy: bool = False, per_sample: bool = False) -> FourMOutput:
        """The masked-modeling loss. ``per_sample`` (evaluation) also returns per-sample sums (``sample_sums``);
        the losses are the same either way."""
        hidden = self.decode(self.encode(batch), batch)
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.target_order)
        targets = batch.dec_targets.reshape(-1).index_select(0, batch.target_order)
        losses, accuracy, counts, total, samples = {}, {}, {}, None, {}
        # training in one CPU process: each modality's head and loss in one function writing the table's buffer
        fused = self._in_place_grads() and not (per_sample or with_accuracy)
        heads = None if fused else self.head_weights()
        for index, (name, hid, tgt, slots) in enumerate(zip(self.args.names, flat.split(batch.target_counts),
                                                            targets.split(batch.target_counts),
                                                            batch.target_order.split(batch.target_counts))):
            count = batch.target_counts[index]
            if count == 0:
                continue
            if fused:
                summed = slice_cross_entropy(hid, self._head_table(), *self._head_rows(index), tgt, IGNORE_INDEX,
                                             self.args.label_smoothing)
            else:
                logits = (hid @ heads[index].t()).float()
                if per_sample:
                    samples[name] = self._sample_sums(logits, tgt, slots, batch.dec_targets.shape)
                    summed = samples[name][:, 0].sum()
                else:
                    summed = F.cross_entropy(logits, tgt, ignore_index=IGNORE_INDEX, reduction="sum",
                                             label_smoothing=self.args.label_smoothing)
                if with_accuracy:
                    accuracy[name] = (logits.argmax(-1) == tgt).float().mean()
            losses[name], counts[name] = summed / count, count
            total = summed if total is None else total + summed
        if not losses:
            raise ValueError("a batch without any target token")
        if self.args.loss_weighting == "token":
            loss = total / sum(counts.values())
        else:
            loss = torch.stack(list(losses.values())).mean()
        return FourMOutput(loss, losses, accuracy, counts, samples)

    def _sample_sums(self, logits: torch.Tensor, targets: torch.Tensor, slots: torch.Tensor,
                     shape: torch.Size) -> torch.Tensor:
        """``[B, 3]``: per sample, the summed cross-entropy, the correctly predicted tokens and the target tokens of
        the targets at ``slots`` (their indices into the flattened ``[B, D]`` decoder slots). Placed into their
        slots and summed per row, not scattered with atomic adds, so the sums are the same bits on every run."""
        token_loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="none",
                                     label_smoothing=self.args.label_smoothing)
        values = torch.stack([token_loss, (logits.argmax(-1) == targets).float(),
                              (targets != IGNORE_INDEX).float()], dim=1)
        dense = values.new_zeros(shape.numel(), 3)
        dense[slots] = values  # each slot holds at most one target
        return dense.view(shape[0], shape[1], 3).sum(1)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def trunk_parameters(model: FourM) -> int:
    """Encoder and decoder blocks (no embeddings, heads, final norms): the figure the reference reports."""
    return count_parameters(model.encoder) + count_parameters(model.decoder)


def flops_per_token(args: FourMArgs, enc_len: int, dec_len: int) -> float:
    """Training FLOPs (forward + backward = 3x forward) per input+target token.

    Matmuls: 2 FLOPs per weight per token forward, counted for each block's weights on the tokens that pass
    through it (encoder blocks on encoder tokens, decoder blocks on decoder tokens, the cross-attention key/value
    projection on encoder tokens), plus attention scores and values (2 * 2 * seq * dim per token and layer) and the
    output head over the mean vocabulary. Embedding gathers and norms are not counted.
    """
    d, h = args.dim, int(2 * 4 * args.dim / 3)
    enc_block = 4 * d * d + 3 * d * h
    dec_block_q = 4 * d * d + 2 * d * d + 3 * d * h  # self-attn, cross q + proj, MLP
    cross_kv = 2 * d * d  # applied to encoder tokens, once per decoder layer
    context = d * d  # the context projection, once per encoder token
    vocab = sum(m.vocab_size for m in args.modalities) / len(args.modalities)
    forward = (2 * enc_block * enc_len * args.encoder_layers
               + 2 * dec_block_q * dec_len * args.decoder_layers
               + 2 * cross_kv * enc_len * args.decoder_layers
               + 2 * context * enc_len
               + 4 * d * enc_len * enc_len * args.encoder_layers
               + 4 * d * (dec_len * dec_len + dec_len * enc_len) * args.decoder_layers
               + 2 * d * vocab * dec_len)
    return 3 * forward / (enc_len + dec_len)
