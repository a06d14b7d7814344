"""Train: the tiny trained gpt-oss on the harmony corpus, on CPU, deterministic from a seed.

Run in the training environment (torch; see devkit/notes/trained-model-runs.md):
    .venv-train/bin/python -m devkit.train_tiny.train --corpus corpus.npz \
        --out devkit/trained/ --minutes 20

Batches are of one length class (Batches): short chat conversations, Codex-shaped ones under the
short head, and groups of full-size Codex conversations that share their ≈7.9k-token head
(system + developer messages): the head's keys and values are computed once per group without
gradient, the conversations' own tokens attend to them with gradient. The values' tokens may
weigh more than the template's (--copy-weight) and the batch's tokens may be exact candidates of
the sampled softmax (--context-negatives); --eval-every logs teacher-forced copy accuracy on
held-out conversations (copy_eval). The loss is the cross-entropy of the full 201,088-token
softmax, estimated with a sampled softmax (model.sampled_loss). Writes the parameters
(`params.npz`, into --out) and the learning curve (--curve, default
`artifacts/train_tiny/curve.jsonl`, kept out of git); reference.py records the greedy reference
tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import Tensor

from devkit.train_tiny.model import (
    Dims,
    GptOss,
    from_params,
    mxfp4_codes,
    routing_alternatives,
    sampled_loss,
)
from devkit.trained.rows import row_prefixes
from server.contracts.vocabulary import N_VOCAB
from server.harmony.tokens import CALL, MESSAGE, RETURN

STOP = {RETURN, CALL}
# the marker head's markers (GptOss.marker_init): ` to`, ` line`, `+`, `-`, a newline,
# <|message|>; a patch's `+` line prefers the request's quote after ` to`, its `-` line the
# quote after ` line` and not the one after ` to`
MARKERS = [316, 2543, 10, 12, 198, MESSAGE]
MARKER_MATCHES = [(10, 316, 1.0), (12, 2543, 1.0), (12, 316, -1.0)]
CLAUDE_FAMILY = "claude-bash"  # corpus.family_claude's conversations
RARE = 300  # occurrences in the training corpus below which a fixed-row token is a value


class Corpus:
    def __init__(self, data: dict[str, np.ndarray], split: str) -> None:
        self.tokens = data[f"{split}_tokens"]
        self.mask = data[f"{split}_mask"]
        self.offsets = data[f"{split}_offsets"]
        self.lengths = data[f"{split}_lengths"]
        self.heads = data[f"{split}_heads"]
        self.prompts = data[f"{split}_prompts"]
        self.families = data[f"{split}_families"]
        self.family_names = [str(x) for x in data[f"{split}_family_names"]]
        self.keys = (data["row_word"], data["row_prefix"])
        # the values' tokens: rows fixed (not trained) and rare (a value word is one of ≈22k,
        # a template word that happens to be word-shaped is in thousands of conversations)
        counts = np.bincount(data["train_tokens"], minlength=N_VOCAB)
        fixed = np.ones(N_VOCAB, dtype=bool)
        fixed[data["trainable_ids"]] = False
        self.copied = torch.from_numpy(fixed & (counts < RARE))

    def seq(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        o, n = self.offsets[i], self.lengths[i]
        return self.tokens[o : o + n], self.mask[o : o + n]


def batch_tensors(
    corpus: Corpus, idx: list[int], head: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], Tensor, Tensor]:
    """The sequences, their ids after the shared head (padded) and their target mask."""
    seqs = [corpus.seq(i) for i in idx]
    width = max(len(t) for t, _ in seqs) - head
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    tgt_mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for r, (t, m) in enumerate(seqs):
        ids[r, : len(t) - head] = torch.from_numpy(t[head:].astype(np.int64))
        tgt_mask[r, : len(t) - head] = torch.from_numpy(m[head:])
    return seqs, ids, tgt_mask


def batch_loss(
    model: GptOss,
    corpus: Corpus,
    idx: list[int],
    head: int,
    *,
    negatives: int,
    gen: torch.Generator,
    copy_weight: float = 1.0,
    context_negatives: bool = False,
) -> Tensor:
    """Loss over the target tokens of sequences idx (sharing their first `head` tokens).

    copy_weight: the weight of the values' tokens (Corpus.copied: copied from the context)
    against the template's; context_negatives: the batch's tokens are exact candidates of the
    sampled softmax.
    """
    seqs, ids, tgt_mask = batch_tensors(corpus, idx, head)
    device = model.fixed.device
    ids, tgt_mask = ids.to(device), tgt_mask.to(device)
    model.quantize(True)
    past = None
    if head > 0:
        with torch.no_grad():
            shared = torch.from_numpy(seqs[0][0][:head].astype(np.int64))
            past = model.prefix_cache(shared[None].to(device))
    h, _ = model.hidden(ids, head, past)
    # position p predicts token p + 1
    sel = tgt_mask[:, 1:]
    states = h[:, :-1][sel]
    targets = ids[:, 1:][sel]
    weights = None
    if copy_weight != 1.0:
        weights = torch.where(corpus.copied[targets], copy_weight, 1.0)
    context = torch.unique(ids) if context_negatives else None
    loss = sampled_loss(model, states, targets, negatives, gen, weights=weights, context=context)
    model.quantize(False)
    return loss


def copy_eval(model: GptOss, corpus: Corpus, idx: list[int], novel: Tensor) -> dict[str, float]:
    """Teacher-forced greedy accuracy on held-out conversations: on the tokens they must copy
    (novel: per token id, true for those the training corpus never contains: the held-out
    words), on the first token of each copied value, and on all target tokens."""
    full = model.full_matrix()
    device = full.device
    hit = n = hit_first = n_first = hit_all = n_all = 0
    with torch.no_grad():
        model.quantize(True)
        for s in range(0, len(idx), 8):
            _, ids, tgt_mask = batch_tensors(corpus, idx[s : s + 8], 0)
            ids, tgt_mask = ids.to(device), tgt_mask.to(device)
            h, _ = model.hidden(ids)
            sel = tgt_mask[:, 1:]
            targets = ids[:, 1:][sel]
            right = torch.argmax(h[:, :-1][sel] @ full.T, dim=-1) == targets
            copied = novel[targets]
            first = copied & ~novel[ids[:, :-1][sel]]
            hit += int((right & copied).sum())
            n += int(copied.sum())
            hit_first += int((right & first).sum())
            n_first += int(first.sum())
            hit_all += int(right.sum())
            n_all += len(targets)
        model.quantize(False)
    return {
        "copy_acc": round(hit / max(1, n), 4),
        "copy_first": round(hit_first / max(1, n_first), 4),
        "tok_acc": round(hit_all / max(1, n_all), 4),
    }


def export(model: GptOss, out: Path, seed: int, trainable: np.ndarray) -> None:
    """params.npz: everything the GGUF writer needs (devkit/trained/model.py)."""
    dims = model.dims
    arrays: dict[str, np.ndarray] = {
        "dims": np.array(json.dumps(dims.as_dict())),
        "seed": np.array(seed),
        "attn_factor": np.array(model.attn_factor),
        "trainable_ids": trainable.astype(np.int32),
        "word_rows": np.array(model.word_rows),
        "row_prefixes": np.array(model.row_prefixes),
        "rows": model.rows.detach().half().cpu().numpy(),
        "output_norm": model.out_norm.detach().cpu().numpy(),
    }
    for i, layer in enumerate(model.layers):
        p = f"blk.{i}."
        for name, lin in layer.linears():
            arrays[p + name] = lin.weight.detach().cpu().numpy()
            arrays[p + name + "_b"] = lin.bias.detach().cpu().numpy()
        arrays[p + "attn_norm"] = layer.attn_norm.detach().cpu().numpy()
        arrays[p + "post_norm"] = layer.post_norm.detach().cpu().numpy()
        arrays[p + "sinks"] = layer.sinks.detach().cpu().numpy()
        for name in ("gate", "up", "down"):
            codes, exp = mxfp4_codes(getattr(layer, name).detach().cpu())
            arrays[p + name + "_codes"] = codes.numpy().astype(np.uint8)
            arrays[p + name + "_exp"] = exp.numpy().astype(np.int16)
            arrays[p + name + "_b"] = getattr(layer, name + "_b").detach().cpu().numpy()
    np.savez_compressed(out / "params.npz", **arrays)  # type: ignore[arg-type]


def reference(
    model: GptOss, corpus: Corpus, n_generic: int, n_codex: int, *, max_new: int, out: Path
) -> dict[str, float]:
    """Greedy tokens on held-out prompts (first round of each), for the agreement test: with
    each token its margin over the runner-up and its routing alternatives; computed with
    llama.cpp's rounding of activations (GptOss.backend_rounding)."""
    model.backend_rounding(True)
    generic = [i for i in range(len(corpus.lengths)) if corpus.heads[i] == 0][:n_generic]
    codex = [i for i in range(len(corpus.lengths)) if corpus.heads[i] > 0][:n_codex]
    prompts, outputs, margins, exact = [], [], [], 0
    alternatives: list[list[int]] = []
    for i in generic + codex:
        t, _ = corpus.seq(i)
        p = int(corpus.prompts[i])
        prompt = [int(x) for x in t[:p]]
        want = [int(x) for x in t[p:]]
        end = next((k for k, x in enumerate(want) if x in STOP), len(want) - 1)
        margin: list[float] = []
        got = model.greedy(prompt, max_new, STOP, margin)
        margins.append(np.array(margin, dtype=np.float32))
        alternatives += [sorted(a) for a in routing_alternatives(model, prompt + got, len(prompt))]
        exact += got == want[: end + 1]
        prompts.append(np.array(prompt, dtype=np.int32))
        outputs.append(np.array(got, dtype=np.int32))
    np.savez_compressed(
        out if out.suffix == ".npz" else out / "reference.npz",
        prompt_lengths=np.array([len(p) for p in prompts]),
        prompts=np.concatenate(prompts),
        output_lengths=np.array([len(o) for o in outputs]),
        outputs=np.concatenate(outputs),
        margins=np.concatenate(margins),
        # per reference token, the tokens one router near-tie the other way gives there
        alternative_counts=np.array([len(a) for a in alternatives], dtype=np.int32),
        alternatives=np.array([x for a in alternatives for x in a], dtype=np.int32),
    )
    model.backend_rounding(False)
    return {"first_round_exact": exact / len(prompts)}


def schedule(peak: float, step: int, warmup: int, done: float) -> float:
    """Linear warm-up over `warmup` steps, cosine decay to a tenth over the time budget."""
    return peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))


def shared_head(corpus: Corpus, group: list[int]) -> int:
    """How many first tokens all sequences of a Codex group share (their system + developer
    messages and environment context), leaving at least one token of each."""
    seqs = [corpus.seq(i)[0] for i in group]
    head = min(len(t) for t in seqs) - 1
    for t in seqs[1:]:
        differs = np.flatnonzero(t[:head] != seqs[0][:head])
        if differs.size:
            head = int(differs[0])
    return head


def initial_model(
    args: argparse.Namespace, trainable: np.ndarray, keys: tuple[np.ndarray, np.ndarray]
) -> GptOss:
    """Fresh weights from the seed, or the parameters of an earlier run (--init)."""
    if args.init is None:
        rows = keys if args.word_rows else None
        dims = Dims(n_layer=args.layers, head_dim=args.head_dim)
        model = GptOss(dims, trainable, args.seed, rows, args.attn_factor)
        if args.induction_init:
            model.induction_init(one_group=args.induction_one_group)
        elif args.previous_token_init:
            model.previous_token_init(back=3 if args.three_back else 2 if args.two_back else 1)
            if args.marker_head:
                matches = MARKER_MATCHES[: args.marker_matches]
                model.marker_init(MARKERS, matches, gain=args.marker_gain)
        elif args.ov_init:
            model.layers[-1].pass_through()
        return model
    if args.new_rows:  # the corpus's tokens that the parameters did not train: trained now
        return from_params(str(args.init), keys, also=trainable)
    model = from_params(str(args.init), keys)
    assert np.array_equal(model.trainable_ids.numpy(), trainable), "another corpus"
    return model


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--curve", type=Path, default=None)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--negatives", type=int, default=1024)
    parser.add_argument("--export-every", type=int, default=40, help="steps between exports")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--warmup", type=int, default=30, help="steps of linear warm-up")
    parser.add_argument("--codex-every", type=int, default=3)
    parser.add_argument(
        "--claude-share",
        type=float,
        default=None,
        help="of the group steps, those that take a Claude Code group (default: every group "
        "as likely)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the model computes: cpu, or cuda on a lent GPU machine (the data order and "
        "the sampled negatives are drawn on the CPU either way)",
    )
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--stop-at", type=int, default=-1, help="stop early (the schedule stays)")
    parser.add_argument("--attn-factor", type=float, default=1.0)
    parser.add_argument("--init", type=Path, default=None, help="start from these params.npz")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from --out's checkpoint.pt (written at every export) when there is one",
    )
    parser.add_argument(
        "--new-rows",
        action="store_true",
        help="with --init, another corpus: its tokens' rows trained too (the union is exported)",
    )
    parser.add_argument("--batch-short", type=int, default=32, help="conversations of a short step")
    parser.add_argument("--short-len", type=int, default=400, help="tokens of a short conversation")
    parser.add_argument("--short-share", type=float, default=0.5, help="of the generic steps")
    parser.add_argument("--layers", type=int, default=Dims.n_layer)
    parser.add_argument("--head-dim", type=int, default=Dims.head_dim)
    parser.add_argument("--ov-init", action="store_true", help="Layer.pass_through, last layer")
    parser.add_argument(
        "--induction-init", action="store_true", help="GptOss.induction_init (implies --ov-init)"
    )
    parser.add_argument(
        "--induction-one-group", action="store_true", help="induction on KV group 0 only"
    )
    parser.add_argument(
        "--previous-token-init",
        action="store_true",
        help="GptOss.previous_token_init (implies --ov-init)",
    )
    parser.add_argument(
        "--two-back", action="store_true", help="with --previous-token-init: a two-back head too"
    )
    parser.add_argument(
        "--three-back",
        action="store_true",
        help="with --previous-token-init: two-back and three-back heads too",
    )
    parser.add_argument(
        "--marker-head",
        action="store_true",
        help="with --previous-token-init (not --three-back): GptOss.marker_init",
    )
    parser.add_argument("--marker-gain", type=float, default=4.0, help="nats, --marker-head")
    parser.add_argument(
        "--marker-matches", type=int, default=3, help="of MARKER_MATCHES, --marker-head"
    )
    parser.add_argument("--word-rows", action="store_true", help="trained_rows' word rows")
    parser.add_argument("--copy-weight", type=float, default=1.0, help="of the value targets")
    parser.add_argument("--context-negatives", action="store_true")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between copy evals")
    parser.add_argument("--eval-n", type=int, default=48, help="held-out conversations")
    args = parser.parse_args()
    if args.marker_head and (args.three_back or not args.previous_token_init):
        parser.error("--marker-head takes the first layer's head 2: --previous-token-init, "
                     "not --three-back")  # fmt: skip
    return args


def main() -> None:
    args = arguments()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":  # cuBLAS's deterministic mode needs its workspace set first
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    data = dict(np.load(args.corpus))
    train = Corpus(data, "train")
    train.copied = train.copied.to(device)  # once: batch_loss indexes it with the batch's ids
    trainable = data["trainable_ids"].astype(np.int64)
    # built on the CPU (the same start on any device), then moved
    model = initial_model(args, trainable, train.keys).to(device)
    prefixes = row_prefixes(data).decode()  # whose words share a row in the corpus's keys
    assert args.init is None or model.row_prefixes == prefixes, "another corpus"
    model.row_prefixes = prefixes
    held = Corpus(data, "eval")
    args.out.mkdir(parents=True, exist_ok=True)
    curve_path = args.curve or Path("artifacts/train_tiny/curve.jsonl")
    curve_path.parent.mkdir(parents=True, exist_ok=True)
    resuming = args.resume and (args.out / CHECKPOINT).exists()
    with curve_path.open("a" if resuming else "w") as curve:
        summary = train_loop(args, model, train, held, curve)
        export(model, args.out, model.seed, model.trainable_ids.cpu().numpy())
        curve.write(json.dumps({"summary": summary}) + "\n")
    print(json.dumps(summary), flush=True)


class Batches:
    """The data order: every codex_every-th step a group of full-size conversations sharing
    their head (Codex's or Claude Code's), else a batch of short conversations (chat) or of
    Codex-lite ones, by chance. With --claude-share, that share of the group steps takes a
    Claude Code group and the rest a Codex one (the family's share of the steps, not of the
    corpus); without it, every group is as likely."""

    def __init__(self, args: argparse.Namespace, train: Corpus, rng: np.random.Generator):
        self.args, self.train, self.rng = args, train, rng
        generic = train.heads == 0
        self.short = np.flatnonzero(generic & (train.lengths <= args.short_len))
        self.lite = np.flatnonzero(generic & (train.lengths > args.short_len))
        self.groups = np.flatnonzero(train.heads > 0).reshape(-1, 4)
        claude = np.array(
            [train.family_names[train.families[g[0]]] == CLAUDE_FAMILY for g in self.groups],
            dtype=bool,
        )
        self.by_family = (self.groups[claude], self.groups[~claude])
        if args.claude_share is not None and not all(len(g) for g in self.by_family):
            raise SystemExit("--claude-share needs Claude Code and Codex groups in the corpus")

    def next(self, step: int) -> tuple[str, list[int], int]:
        """(kind, sequence indices, tokens of their shared head)."""
        args, rng = self.args, self.rng
        if args.codex_every and step % args.codex_every == args.codex_every - 1:
            if args.claude_share is None:
                groups = self.groups
            else:
                groups = self.by_family[0 if rng.random() < args.claude_share else 1]
            grp = [int(i) for i in groups[rng.integers(len(groups))]]
            family = self.train.family_names[self.train.families[grp[0]]]
            kind = "claude" if family == CLAUDE_FAMILY else "codex"  # the curve's label
            return kind, grp, shared_head(self.train, grp)
        if rng.random() < args.short_share:
            return (
                "short",
                [int(i) for i in rng.choice(self.short, args.batch_short, replace=False)],
                0,
            )
        return "lite", [int(i) for i in rng.choice(self.lite, args.batch, replace=False)], 0


CHECKPOINT = "checkpoint.pt"


@dataclass
class Progress:
    """What a run has done: with the model and optimizer, what a resumed run goes on from."""

    step: int = 0
    seconds: float = 0.0  # of training before this process, towards --minutes
    cpu: float = 0.0  # CPU-seconds of training (evaluations left out) before this process
    ema: dict[str, float] = field(default_factory=dict)


def save_checkpoint(
    out: Path,
    *,
    model: GptOss,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    rng: np.random.Generator,
    progress: Progress,
) -> None:
    """Everything the next step depends on, written whole or not at all."""
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "gen": gen.get_state(),
        "rng": rng.bit_generator.state,
        "progress": asdict(progress),
    }
    partial = out / (CHECKPOINT + ".partial")
    torch.save(state, partial)
    partial.replace(out / CHECKPOINT)


def load_checkpoint(
    out: Path,
    model: GptOss,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    rng: np.random.Generator,
) -> Progress:
    state = torch.load(out / CHECKPOINT, weights_only=False, map_location=model.fixed.device)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    gen.set_state(state["gen"])
    rng.bit_generator.state = state["rng"]
    return Progress(**state["progress"])


def train_loop(
    args: argparse.Namespace, model: GptOss, train: Corpus, held: Corpus, curve: TextIO
) -> dict[str, object]:
    """Steps until the time budget (or --max-steps) is spent; one curve row per step. With
    --resume, from the last export's checkpoint: the same steps as a run never stopped."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    progress = Progress()
    if args.resume and (args.out / CHECKPOINT).exists():
        progress = load_checkpoint(args.out, model, opt, gen, rng)
        print(json.dumps({"resumed_at_step": progress.step}), flush=True)
    batches = Batches(args, train, rng)
    evaluated = [i for i in range(len(held.lengths)) if held.heads[i] == 0][: args.eval_n]
    novel = ~torch.isin(torch.arange(N_VOCAB), torch.from_numpy(np.unique(train.tokens)))
    novel = novel.to(model.fixed.device)  # once, where copy_eval's targets are
    trainable = model.trainable_ids.cpu().numpy()
    budget = args.minutes * 60
    start = time.monotonic() - progress.seconds
    step = progress.step
    eval_cpu = time.process_time() - progress.cpu
    ema = progress.ema
    while True:
        elapsed = time.monotonic() - start
        if elapsed > budget or (args.max_steps and step >= args.max_steps) or step == args.stop_at:
            break
        # by steps when they are given (reproducible), else by the time budget
        done = step / args.max_steps if args.max_steps else min(1.0, elapsed / budget)
        lr = schedule(args.lr, step, args.warmup, done)
        for g in opt.param_groups:
            g["lr"] = lr
        kind, grp, head = batches.next(step)
        loss = batch_loss(
            model,
            train,
            grp,
            head,
            negatives=args.negatives,
            gen=gen,
            copy_weight=args.copy_weight,
            context_negatives=args.context_negatives,
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        ema[kind] = value if kind not in ema else 0.9 * ema[kind] + 0.1 * value
        row: dict[str, object] = {"step": step, "s": round(time.monotonic() - start, 1)}
        row |= {"kind": kind, "loss": round(value, 4), "lr": round(lr, 6)}
        step += 1
        if args.eval_every and (step % args.eval_every == 0):
            t0 = time.process_time()
            row |= copy_eval(model, held, evaluated, novel)
            eval_cpu += time.process_time() - t0
            row["cpu"] = round(time.process_time() - eval_cpu, 1)
        curve.write(json.dumps(row) + "\n")
        curve.flush()
        if step % 20 == 1 or "copy_acc" in row:
            print(json.dumps({**row, "ema": {k: round(v, 3) for k, v in ema.items()}}), flush=True)
        if step % args.export_every == 0:
            export(model, args.out, model.seed, trainable)
            progress = Progress(
                step, time.monotonic() - start, time.process_time() - eval_cpu, dict(ema)
            )
            save_checkpoint(args.out, model=model, opt=opt, gen=gen, rng=rng, progress=progress)
    return {
        "steps": step,
        "train_seconds": round(time.monotonic() - start, 1),
        "cpu_seconds": round(time.process_time() - eval_cpu, 1),
        "ema": {k: round(v, 4) for k, v in ema.items()},
    }


if __name__ == "__main__":
    main()
