"""Recipe: text folder -> cached shardkit build -> tiny causal transformer LM on raw-byte tokens,
trained like the image recipe (AMP, accumulation, meter, spot-safe checkpoints, early stopping).

    python pipelines/causal_lm.py TEXTS DATA RUN --block 64 --max-steps 200

With --tokenizer bpe:N (or a tokenizer.json) the build tokenizes and packs rows of block+1 ids
(the held-out split reuses the training split's tokenizer). Without it, tokens are UTF-8 bytes
made in the loader workers by a batch_transform. Either way the loop gets int64 inputs and targets.
SIGTERM or SIGUSR1 (--stop-signals) mid-run: the step finishes, a checkpoint is written, exit 128 +
signal; the same command continues from that step.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from shardkit.recipes import Recipe, fit, open_session, parse, prepare, setup_logging

BYTE_PAD = 256  # one id past the bytes: never an input (split_rows maps it to 0), ignored as a target
BYTE_VOCAB = 256


@dataclass(frozen=True)
class LMRecipe(Recipe):
    block: int = 64
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    tokenizer: str = ""  # "" -> raw UTF-8 bytes; else bpe:VOCAB or a tokenizer.json (shardkit build --tokenizer)

    def __post_init__(self):
        super().__post_init__()
        if self.block < 2 or self.d_model % self.heads:
            raise SystemExit(f"--block {self.block} --d-model {self.d_model} --heads {self.heads}: expected "
                             "block >= 2 and d_model divisible by heads")


class ByteTokens:
    """batch_transform: the 'txt' strings -> 'tokens' (B, block+1) int64, first bytes, BYTE_PAD-filled."""

    def __init__(self, block: int):
        self.block = block

    def __call__(self, batch: dict) -> dict:
        import torch

        out = torch.full((len(batch["__key__"]), self.block + 1), BYTE_PAD, dtype=torch.int64)
        for i, text in enumerate(batch.get("txt") or []):
            data = (text or "").encode("utf-8")[: self.block + 1]
            if data:
                out[i, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return {"__key__": batch["__key__"], "tokens": out}


def tiny_lm(r: LMRecipe, vocab: int):
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, r.d_model)
            self.pos = nn.Parameter(torch.zeros(r.block, r.d_model))
            layer = nn.TransformerEncoderLayer(r.d_model, r.heads, 4 * r.d_model, dropout=0.0,
                                               batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, r.layers, enable_nested_tensor=False)
            self.head = nn.Sequential(nn.LayerNorm(r.d_model), nn.Linear(r.d_model, vocab))
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(r.block), persistent=False)

        def forward(self, x):
            t = x.shape[1]
            h = self.tok(x) + self.pos[:t]
            return self.head(self.body(h, mask=self.mask[:t, :t], is_causal=True))

    return TinyLM()


class LMLoss:
    """Next-token cross-entropy; padding positions do not count (a tokenized build's labels already say
    so; byte rows go through shardkit's split_rows)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, model, batch):
        import torch.nn.functional as F

        from shardkit.reader.tokens import IGNORE_INDEX, split_rows

        if "input_ids" in batch:
            inputs, targets = batch["input_ids"], batch["labels"]
        else:
            inputs, targets = split_rows(batch["tokens"], self.pad_id)
        logits = model(inputs).float()
        if not (targets != IGNORE_INDEX).any():
            return logits.sum() * 0.0  # an all-padding batch: no signal, but no NaN either
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def text_config(recipe: LMRecipe):
    from shardkit.config import BuildConfig

    def make(src: str, out: str):
        tokenizer, seq_len = None, None
        if recipe.tokenizer:
            tokenizer, seq_len = recipe.tokenizer, recipe.block
            if os.path.basename(out) == "val":  # held-out ids must come from the training tokenizer
                tokenizer = os.path.join(os.path.dirname(out), "train", "tokenizer.json")
        return BuildConfig(src=src, out=out, labels=False, tokenizer=tokenizer, seq_len=seq_len,
                           workers=recipe.build_workers, progress=False)

    return make


def main(argv=None) -> dict:
    recipe = parse(argv, LMRecipe)
    import torch

    setup_logging(recipe)  # Dask's lines only with --debug
    os.makedirs(recipe.run, exist_ok=True)
    train_dir, val_dir = prepare(recipe.src, recipe.data, recipe.val_pct, text_config(recipe))
    vocab, pad_id, transform = BYTE_VOCAB, BYTE_PAD, ByteTokens(recipe.block)
    if recipe.tokenizer:
        with open(os.path.join(train_dir, "manifest.json")) as f:
            manifest = json.load(f)
        vocab, pad_id, transform = manifest["tokenizer"]["vocab_size"], manifest["fields"]["tokens"]["pad_id"], None
    torch.manual_seed(recipe.seed)
    session = open_session(recipe, tiny_lm(recipe, vocab), LMLoss(pad_id), train_dir, val_dir, transform)
    return fit(session)


if __name__ == "__main__":
    main(sys.argv[1:])
