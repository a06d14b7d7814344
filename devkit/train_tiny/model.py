"""Model: gpt-oss as llama.cpp computes it, in torch (training only; never imported by `server`).

The blocks follow llama.cpp's gpt-oss graph (src/models/openai-moe.cpp): RMS norm, attention
with Q/K/V/O biases, NEOX RoPE with YaRN scaling (ggml's `rope_yarn`), learned attention sinks,
sliding-window attention on even layers and full attention on odd ones, then RMS norm and a
mixture of experts: router logits, top-k by logit, softmax over the chosen k, and gpt-oss's
clamped SwiGLU (`swiglu_oai`: gate clamped above at 7, up clamped to [-7, 7], then
x·sigmoid(1.702x)·(up+1)).

The exported tensors are exactly what this module computes with: expert weights pass through
MXFP4 fake quantization (straight-through), token embeddings are f16-rounded and tied to the
output matrix. Rows of tokens the corpus does not train are fixed random vectors (from a seed;
devkit/trained/rows.py, numpy only), so the model can copy tokens it never saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from devkit.trained.rows import PREFIX_DIMS, PREFIXES, random_rows, row_prefixes
from server.contracts.vocabulary import N_VOCAB

SLIDING_WINDOW = 128
ATTEND_BLOCK = 256  # queries per attention call (model.Layer.attend)
ROPE_FREQ_BASE = 150000.0
YARN_FACTOR = 32.0
YARN_ORIG_CONTEXT = 4096
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
RMS_EPS = 1e-5
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
MXFP4_VALUES = (
    0.0,
    1.0,
    2.0,
    3.0,
    4.0,
    6.0,
    8.0,
    12.0,
    0.0,
    -1.0,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
    -8.0,
    -12.0,
)
QK = 32
PREVIOUS_TOKEN_PAIRS = 8  # the fastest RoPE pairs: a score peaked at distance 1
INDUCTION_DIMS = 28  # query/key dims of an induction head: the 14 slowest RoPE pairs
RECENCY_PAIR = 10  # turns ≈ 0.8 π over the sliding window: -sin(Δθ) falls with distance
ATTN_SCALE = 1.347**2 / 8  # q·k to a score: YaRN's mscale on both, head_dim^-0.5 (64)


@dataclass(frozen=True)
class Dims:
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# per token id: its word, its prefix (trained_rows.word_keys); None: independent rows
Keys = tuple[np.ndarray, np.ndarray] | None


# ----------------------------------------------------------------------------- quantization


def mxfp4_exponents(w: Tensor) -> Tensor:
    """Per 32-block (last dim) shared exponent: the smallest 2^k with max|w| / 2^k <= 12."""
    blocks = w.reshape(*w.shape[:-1], -1, QK)
    amax = blocks.abs().amax(-1).clamp_min(1e-30)
    return torch.ceil(torch.log2(amax / 12.0)).clamp(-127, 127)


def mxfp4_codes(w: Tensor) -> tuple[Tensor, Tensor]:
    """(nibble codes, exponents): nearest representable value per element."""
    exp = mxfp4_exponents(w)
    blocks = w.reshape(*w.shape[:-1], -1, QK) / torch.exp2(exp)[..., None]
    table = torch.tensor(MXFP4_VALUES[:8], device=w.device)
    idx = (blocks.abs()[..., None] - table).abs().argmin(-1)
    codes = torch.where((blocks < 0) & (idx > 0), idx + 8, idx)
    return codes.reshape(w.shape), exp


def mxfp4_dequant(codes: Tensor, exp: Tensor) -> Tensor:
    table = torch.tensor(MXFP4_VALUES, device=codes.device)
    values = table[codes].reshape(*codes.shape[:-1], -1, QK) * torch.exp2(exp)[..., None]
    return values.reshape(codes.shape)


def fake_mxfp4(w: Tensor) -> Tensor:
    """w rounded to MXFP4 in the forward pass, identity in the backward pass."""
    with torch.no_grad():
        q = mxfp4_dequant(*mxfp4_codes(w))
    return w + (q - w).detach()


def fake_f16(w: Tensor) -> Tensor:
    return w + (w.half().float() - w).detach()


def q8_0(w: Tensor) -> Tensor:
    """w (float32, last dimension in blocks of 32) rounded as ggml's Q8_0 stores it, bit for bit
    (ggml-quants.c's reference, which gguf.quants follows): per block d = max|x| / 127, q =
    x · (1 / d) rounded half away from zero, the value f16(d) · q."""
    blocks = w.reshape(*w.shape[:-1], -1, QK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    x = blocks * torch.where(d == 0, torch.zeros_like(d), 1 / d)
    a = x.abs()
    whole = a.floor()
    q = torch.sign(x) * (whole + torch.floor(2 * (a - whole)))
    return (q * d.half().float()).reshape(w.shape)


# ----------------------------------------------------------------------------- rope


def yarn_ramp(dims: Dims) -> tuple[Tensor, Tensor]:
    """Per NEOX pair: its base frequency and YaRN's ramp (1: extrapolated, the fast pairs; 0:
    interpolated by YARN_FACTOR, the slow pairs), as ggml's rope_yarn computes them."""
    n = dims.head_dim

    def corr_dim(n_rot: float) -> float:
        return (
            n * math.log(YARN_ORIG_CONTEXT / (n_rot * 2 * math.pi)) / (2 * math.log(ROPE_FREQ_BASE))
        )

    low = max(0.0, math.floor(corr_dim(YARN_BETA_FAST)))
    high = min(n - 1.0, math.ceil(corr_dim(YARN_BETA_SLOW)))
    i0 = torch.arange(0, n, 2, dtype=torch.float64)
    theta_scale = ROPE_FREQ_BASE ** (-2.0 / n)
    inv = theta_scale ** (i0 / 2)
    y = (i0 / 2 - low) / max(0.001, high - low)
    return inv, 1 - torch.clamp(y, 0, 1)


def rope_thetas(dims: Dims) -> Tensor:
    """Radians per position of each NEOX pair."""
    inv, ramp = yarn_ramp(dims)
    return (inv * ((1 - ramp) / YARN_FACTOR + ramp)).float()


def yarn_tables(dims: Dims, positions: Tensor, attn_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos/sin (times YaRN's mscale) for NEOX rotation, as ggml's rope_yarn computes them."""
    inv, ramp = (x.to(positions.device) for x in yarn_ramp(dims))
    freq_scale = 1.0 / YARN_FACTOR
    extrap = positions.double()[:, None] * inv[None, :]
    theta = freq_scale * extrap * (1 - ramp) + extrap * ramp
    mscale = attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    return (torch.cos(theta) * mscale).float(), (torch.sin(theta) * mscale).float()


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (..., T, head_dim); NEOX: pairs (i, i + head_dim/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


# ----------------------------------------------------------------------------- blocks


def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * weight


class Layer(nn.Module):
    def __init__(self, dims: Dims, index: int) -> None:
        super().__init__()
        d, nq, nkv = dims.n_embd, dims.n_head * dims.head_dim, dims.n_head_kv * dims.head_dim
        self.dims, self.sliding = dims, index % 2 == 0
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.post_norm = nn.Parameter(torch.ones(d))
        self.wq, self.wk, self.wv = nn.Linear(d, nq), nn.Linear(d, nkv), nn.Linear(d, nkv)
        self.wo = nn.Linear(nq, d)
        self.sinks = nn.Parameter(torch.zeros(dims.n_head))
        self.router = nn.Linear(d, dims.n_expert)
        e, f = dims.n_expert, dims.n_ff_exp
        self.gate = nn.Parameter(torch.randn(e, f, d) * d**-0.5)
        self.up = nn.Parameter(torch.randn(e, f, d) * d**-0.5)
        self.down = nn.Parameter(torch.randn(e, d, f) * f**-0.5 * 0.5)
        self.gate_b = nn.Parameter(torch.zeros(e, f))
        self.up_b = nn.Parameter(torch.zeros(e, f))
        self.down_b = nn.Parameter(torch.zeros(e, d))
        for _, lin in self.linears():
            nn.init.normal_(lin.weight, std=lin.in_features**-0.5)
            nn.init.zeros_(lin.bias)
        self.wo.weight.data *= 0.5

    def pass_through(self, every_head: bool = False) -> None:
        """Initialise values and output so that attention passes the attended tokens' (normed)
        embeddings on: each KV head's values are a slice of the input, and one query head per
        KV head (every_head: each) writes its slice back where it came from (needs n_head_kv *
        head_dim = n_embd). A copy circuit to start from; the queries and keys still have to
        learn where to look."""
        dims = self.dims
        nkv, rep = dims.n_head_kv * dims.head_dim, dims.n_head // dims.n_head_kv
        if nkv != dims.n_embd:
            raise ValueError("pass_through needs n_head_kv * head_dim == n_embd")
        with torch.no_grad():
            self.wv.weight.copy_(torch.eye(nkv))
            self.wo.weight.zero_()
            for g in range(dims.n_head_kv):
                rows = slice(g * dims.head_dim, (g + 1) * dims.head_dim)
                for h in range(g * rep, (g + 1) * rep if every_head else g * rep + 1):
                    cols = slice(h * dims.head_dim, (h + 1) * dims.head_dim)
                    self.wo.weight[rows, cols] = torch.eye(dims.head_dim)

    def turned(self, sharpness: float, steps: int) -> Tensor:
        """A query/key bias of `sharpness` in the fastest RoPE pairs, turned by `steps`
        positions (R(steps·θ) of (sharpness, 0) per pair): a query turned by a and a key turned
        by b score q·R(-Δθ)k = sharpness² cos((b - a - Δ)θ), largest at distance Δ = b - a."""
        hd = self.dims.head_dim
        theta = rope_thetas(self.dims)
        pairs = torch.arange(PREVIOUS_TOKEN_PAIRS)
        v = torch.zeros(hd)
        v[pairs] = sharpness * torch.cos(steps * theta[pairs])
        v[pairs + hd // 2] = sharpness * torch.sin(steps * theta[pairs])
        return v

    def back_head(
        self, head: int, steps: int, read: Tensor, write: Tensor, sharpness: float = 6.0
    ) -> None:
        """Initialise query head `head` to attend `steps` tokens back and write `read`'s
        projection of what it finds along `write`: zero query/key weights, and biases that RoPE
        turns into a score peaked at distance `steps`. The head's KV group gets keys k = R(θ) q0
        per pair (q0 the previous-token query) and values `read`'s projection; the query is q0
        turned back by steps - 1, q = R(-(steps - 1)θ) q0, so q·R(-Δθ)k = |q0|² cos((steps -
        Δ)θ), largest at Δ = steps. Heads of one group share its keys (the same for every
        steps), so a previous-token head (steps 1) and a two-back head (steps 2) can share one.
        Keys then tell which tokens precede them (`line `` against `to ``), where one tells only
        the last. read, write: (d, r)."""
        dims = self.dims
        hd, r = dims.head_dim, write.shape[1]
        kv = head // (dims.n_head // dims.n_head_kv)
        rows, cols = slice(kv * hd, (kv + 1) * hd), slice(head * hd, (head + 1) * hd)
        with torch.no_grad():
            self.wq.weight[cols].zero_()
            self.wq.bias[cols] = self.turned(sharpness, 1 - steps)
            self.wk.weight[rows].zero_()
            self.wk.bias[rows] = self.turned(sharpness, 1)
            self.wv.weight[rows].zero_()
            self.wv.bias[rows].zero_()
            self.wv.weight[kv * hd : kv * hd + r] = read.T
            self.wo.weight[:, cols].zero_()
            self.wo.weight[:, head * hd : head * hd + r] = write

    def marker_head(
        self,
        head: int,
        detect: Tensor,
        read: Tensor,
        write: Tensor,
        *,
        marker: float,
        recency: float,
    ) -> None:
        """Initialise query head `head` to attend to the nearest marker token before it (itself
        if it is one) and write `read`'s projection of it along `write`: which line or quote a
        token stands in (a patch's `+` line, the request's `` to `…` `` against its `` line `…`
        ``), however far back its marker is. Keys: `detect`·h in the slowest RoPE pair (the same
        anywhere), scored `marker` by a constant query; and a constant in RECENCY_PAIR whose
        query is turned a quarter turn, scoring -recency·sin(Δθ): the nearer, the higher,
        over the whole window. marker, recency: in units of the attention score (nats)."""
        dims = self.dims
        hd, r = dims.head_dim, write.shape[1]
        kv = head // (dims.n_head // dims.n_head_kv)
        k0, q0 = kv * hd, head * hd
        slow, near = hd // 2 - 1, RECENCY_PAIR
        with torch.no_grad():
            self.wq.weight[q0 : q0 + hd].zero_()
            self.wq.bias[q0 : q0 + hd].zero_()
            self.wq.bias[q0 + slow] = marker / ATTN_SCALE
            self.wq.bias[q0 + near + hd // 2] = math.sqrt(recency / ATTN_SCALE)
            for dim in (slow, slow + hd // 2, near, near + hd // 2):
                self.wk.weight[k0 + dim].zero_()
                self.wk.bias[k0 + dim] = 0.0
            self.wk.weight[k0 + slow] = detect
            self.wk.bias[k0 + near] = math.sqrt(recency / ATTN_SCALE)
            self.wv.weight[k0 : k0 + hd].zero_()
            self.wv.bias[k0 : k0 + hd].zero_()
            self.wv.weight[k0 : k0 + r] = read.T
            self.wo.weight[:, q0 : q0 + hd].zero_()
            self.wo.weight[:, q0 : q0 + r] = write

    def marker_match(self, own: Tensor, other: Tensor, gain: float, slot: int = 0) -> None:
        """Add to every pass-through head (query head g·rep of KV head g) a score of gain ·
        (own·h at the query) · (other·h at the key), in the second dimension of the `slot`-th
        slowest RoPE pair (the same at any distance): a query whose marker is one kind prefers
        keys whose marker is another (a patch's `+` line, the request's quote after ` to`)."""
        dims = self.dims
        hd, rep = dims.head_dim, dims.n_head // dims.n_head_kv
        dim = hd - 1 - slot
        root = math.sqrt(gain / ATTN_SCALE)  # other may carry a sign
        with torch.no_grad():
            for g in range(dims.n_head_kv):
                self.wq.weight[g * rep * hd + dim] = root * own
                self.wq.bias[g * rep * hd + dim] = 0.0
                self.wk.weight[g * hd + dim] = root * other
                self.wk.bias[g * hd + dim] = 0.0

    def induction_heads(
        self, read: Tensor, key: Tensor, gain: float, groups: int | None = None
    ) -> None:
        """Initialise the pass-through heads (query head g·rep for KV head g) as induction heads:
        a query's `read` projection of its own token against a key's `key` projection of what
        the previous-token head wrote there, in the RoPE pairs that barely turn over a long
        context, so the head attends to the token after an earlier occurrence of this one."""
        dims = self.dims
        hd, rep, r = dims.head_dim, dims.n_head // dims.n_head_kv, read.shape[1]
        slow = torch.arange(hd // 2 - r // 2, hd // 2)
        dims_of = torch.cat([slow, slow + hd // 2])
        with torch.no_grad():
            for g in range(groups or dims.n_head_kv):  # the faster pairs keep their start
                qh, kh = g * rep * hd, g * hd
                self.wq.weight[qh + dims_of] = gain * read.T
                self.wk.weight[kh + dims_of] = gain * key.T

    def copy_projection(self, group: int, projection: Tensor) -> None:
        """KV head `group`'s values are `projection` (head_dim, d: orthonormal rows) of the
        whole input, and its first query head writes them back through the transpose: the
        attended token's embedding, projected, where pass_through copies only a slice."""
        hd, rep = self.dims.head_dim, self.dims.n_head // self.dims.n_head_kv
        with torch.no_grad():
            self.wv.weight[group * hd : (group + 1) * hd] = projection
            self.wo.weight[:, group * rep * hd : (group * rep + 1) * hd] = projection.T

    def linears(self) -> tuple[tuple[str, nn.Linear], ...]:
        """The layer's linear maps by their names in the parameter file (export and import)."""
        return (
            ("q", self.wq),
            ("k", self.wk),
            ("v", self.wv),
            ("o", self.wo),
            ("router", self.router),
        )

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, d) -> q (B, H, T, hd), k and v (B, Hkv, T, hd), RoPE applied."""
        dims = self.dims
        h = rms_norm(x, self.attn_norm)
        b, t, _ = x.shape
        q = self.wq(h).view(b, t, dims.n_head, dims.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, dims.n_head_kv, dims.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, dims.n_head_kv, dims.head_dim).transpose(1, 2)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Softmax attention with a sink logit per head; positions give the causal/SWA mask.

        The sink is one more key, scored `sinks[h]` by every query (an extra dimension: 1 in
        the queries, sinks * sqrt(head_dim) in the sink key, 0 elsewhere) with a zero value.
        The values get that extra dimension too (zero), so that queries, keys and values have
        one head size and torch takes its flash kernel (a third of the time and no T x T
        matrix). Queries go in blocks of ATTEND_BLOCK, each with the keys it can see only (k_pos
        is consecutive): a sliding-window layer's cost grows with T x window, not T x T.
        """
        dims = self.dims
        rep = dims.n_head // dims.n_head_kv
        b, _, t, hd = q.shape
        k = k.repeat_interleave(rep, dim=1).expand(b, -1, -1, -1)
        v = v.repeat_interleave(rep, dim=1).expand(b, -1, -1, -1)
        scale = hd**-0.5
        device = q.device
        q2 = torch.cat([q, torch.ones(b, dims.n_head, t, 1, device=device)], dim=-1)
        sink_k = torch.zeros(b, dims.n_head, 1, hd + 1, device=device)
        sink_k = sink_k + F.pad((self.sinks / scale).view(1, -1, 1, 1), (hd, 0))
        k2, v2 = F.pad(k, (0, 1)), F.pad(v, (0, 1))
        sink_v = torch.zeros(b, dims.n_head, 1, hd + 1, device=device)
        first = int(k_pos[0])
        out = []
        for s in range(0, t, ATTEND_BLOCK):
            qp = q_pos[s : s + ATTEND_BLOCK]
            hi = int(qp[-1]) - first + 1
            lo = max(0, int(qp[0]) - (SLIDING_WINDOW - 1) - first) if self.sliding else 0
            dist = qp[:, None] - k_pos[None, lo:hi]
            allowed = dist >= 0
            if self.sliding:
                allowed &= dist < SLIDING_WINDOW
            sink = torch.ones(len(qp), 1, dtype=torch.bool, device=device)
            allowed = torch.cat([allowed, sink], dim=1)
            keys = torch.cat([k2[:, :, lo:hi], sink_k], dim=2)
            values = torch.cat([v2[:, :, lo:hi], sink_v], dim=2)
            out.append(
                F.scaled_dot_product_attention(
                    q2[:, :, s : s + ATTEND_BLOCK], keys, values, attn_mask=allowed, scale=scale
                )
            )
        return torch.cat(out, dim=2)[..., :hd]

    cache: tuple[Tensor, Tensor, Tensor] | None = None
    # the reference's router probe (routing_alternatives): sees, and may change, the router
    # logits (B, T, n_expert) of each call; None in training
    probe: Callable[[Tensor], Tensor] | None = None
    # round the experts' inputs to Q8_0 as llama.cpp's CPU backend does before its MXFP4
    # products (GptOss.backend_rounding; the reference only, never training)
    round_inputs = False

    def quantized(self) -> tuple[Tensor, Tensor, Tensor]:
        """The experts' MXFP4 weights (straight-through); cached while GptOss.step() lasts."""
        if self.cache is not None:
            return self.cache
        return fake_mxfp4(self.gate), fake_mxfp4(self.up), fake_mxfp4(self.down)

    def moe(self, x: Tensor) -> Tensor:
        dims = self.dims
        h = rms_norm(x, self.post_norm)
        logits = self.router(h)
        if self.probe is not None:
            logits = self.probe(logits)
        top, idx = logits.topk(dims.n_expert_used, dim=-1)
        weights = torch.softmax(top, dim=-1)
        gate, up, down = self.quantized()
        # all experts on every token (cheaper than gathering at this size), weights 0 off top-k
        w = torch.zeros_like(logits).scatter(-1, idx, weights)
        if self.round_inputs:
            h = q8_0(h)
        g = (torch.einsum("btd,efd->btef", h, gate) + self.gate_b).clamp(max=SWIGLU_LIMIT)
        u = (torch.einsum("btd,efd->btef", h, up) + self.up_b).clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        act = g * torch.sigmoid(SWIGLU_ALPHA * g) * (u + 1)
        if self.round_inputs:
            act = q8_0(act)
        y = torch.einsum("btef,edf->bted", act, down) + self.down_b
        out = (y * w[..., None]).sum(2)
        return out.view_as(x)


class GptOss(nn.Module):
    """The whole model. `trainable` lists the token ids whose embedding rows are learned."""

    def __init__(
        self, dims: Dims, trainable: np.ndarray, seed: int, keys: Keys, attn_factor: float = 1.0
    ):
        super().__init__()
        self.dims, self.attn_factor, self.seed = dims, attn_factor, seed
        self.word_rows = keys is not None
        self.rounds = False  # backend_rounding
        self.row_prefixes = PREFIXES.decode()  # whose words share a row (the corpus's keys)
        rows = random_rows(seed, dims.n_embd, keys)
        fixed = torch.from_numpy(rows.astype(np.float32))
        self.register_buffer("fixed", fixed, persistent=False)
        ids = torch.from_numpy(trainable.astype(np.int64))
        self.register_buffer("trainable_ids", ids, persistent=False)
        slot = torch.full((N_VOCAB,), -1, dtype=torch.int64)
        slot[ids] = torch.arange(len(ids))
        self.register_buffer("slot", slot, persistent=False)
        self.rows = nn.Parameter(fixed[ids].clone())
        self.layers = nn.ModuleList(Layer(dims, i) for i in range(dims.n_layer))
        self.out_norm = nn.Parameter(torch.full((dims.n_embd,), 0.05))

    def induction_init(
        self, write_gain: float = 2.0, key_gain: float = 4.0, one_group: bool = False
    ) -> None:
        """Start from an induction circuit, the mechanism of copying a span: the first layer's
        head 0 writes a projection U of the previous token's embedding along P; the last
        layer's pass-through heads (Layer.pass_through) match their own token's U projection
        against keys' P projection, so after `settings` they attend to the token that followed
        an earlier ` settings` and pass its embedding on. U lies in the word part of word rows
        (the prefix varies where a value is copied); U and P are random, from the seed."""
        d = self.dims.n_embd
        read, write, gen, last = self.previous_token_half(write_gain)
        if one_group:  # KV group 0 copies spans; group 1 stays free to find where one starts
            last.pass_through()
            values = torch.linalg.qr(torch.randn(d, self.dims.head_dim, generator=gen))[0]
            last.copy_projection(0, values.T)
            last.induction_heads(read, write, key_gain, groups=1)
            with torch.no_grad():  # the copy outweighs the current token's own row
                last.wo.weight[:, : self.dims.head_dim].mul_(4.0)
            return
        last.pass_through(every_head=True)  # the other heads: where a value starts
        last.induction_heads(read, write, key_gain)
        with torch.no_grad():  # the copy outweighs the current token's own row
            last.wo.weight.mul_(4.0)

    def induction_basis(self) -> tuple[Tensor, Tensor, torch.Generator]:
        """(U, P, the generator after them), from the seed: U (d, INDUCTION_DIMS) a random
        projection of the word part of a row (the prefix varies where a value is copied), P
        random directions to write it along."""
        d, r = self.dims.n_embd, INDUCTION_DIMS
        gen = torch.Generator().manual_seed(self.seed * 1000 + 17)
        word = d - PREFIX_DIMS if self.word_rows else d
        read = torch.zeros(d, r)
        read[:word] = torch.linalg.qr(torch.randn(word, r, generator=gen))[0]
        write = torch.linalg.qr(torch.randn(d, r, generator=gen))[0]
        return read, write, gen

    def previous_token_half(
        self, write_gain: float
    ) -> tuple[Tensor, Tensor, torch.Generator, Layer]:
        """The first layer's head 0 as a previous-token head writing U of the previous token
        along P; returns U, P, the generator after them and the last layer."""
        read, write, gen = self.induction_basis()
        first, last = self.layers[0], self.layers[-1]
        assert isinstance(first, Layer)
        assert isinstance(last, Layer)
        first.back_head(0, 1, read, write_gain * write)
        return read, write, gen, last

    def previous_token_init(self, write_gain: float = 2.0, back: int = 1) -> None:
        """Half of an induction circuit: the first layer's head 0 writes U of the previous token
        along P (as in induction_init); the last layer passes attended tokens on (pass_through)
        with its queries and keys free to learn both where a value starts and, matching U of
        its own token against P, where a copied span goes on. back > 1: the first layer's heads
        1 … back - 1 also write U of the token 2 … back tokens back, each along fresh
        directions (Layer.back_head)."""
        read, _, gen, last = self.previous_token_half(write_gain)
        first = self.layers[0]
        assert isinstance(first, Layer)
        for steps in range(2, back + 1):
            write = torch.linalg.qr(torch.randn(self.dims.n_embd, read.shape[1], generator=gen))[0]
            first.back_head(steps - 1, steps, read, write_gain * write)
        last.pass_through()

    def marker_init(
        self, markers: list[int], matches: list[tuple[int, int, float]], gain: float
    ) -> None:
        """The first layer's head 2 (KV head 1, beside the previous-token and two-back heads of
        KV head 0) as a marker head (Layer.marker_head): every token carries which of `markers`
        came last before it, coded along one direction per marker (the markers' rows
        orthonormalized, so the codes barely overlap). The last layer's pass-through heads start
        with a preference (Layer.marker_match) of tokens marked `own` for tokens marked `other`
        per (own, other, sign) of `matches`, sign · `gain` nats where both marks are whole: a
        patch's `+` line for the request's quote after ` to`, its `-` line for the quote after
        ` line` and against the one after ` to` — which a line's key alone (`color =` before
        `red` and before `blue`) cannot tell."""
        d = self.dims.n_embd
        rows = self.embed(torch.tensor(markers)).detach()
        unit = rows / rows.norm(dim=1, keepdim=True)
        basis = torch.linalg.qr(unit.T)[0]  # (d, n): column i spans marker i's new part
        basis = basis * torch.sign(torch.diagonal(basis.T @ unit.T))
        gen = torch.Generator().manual_seed(self.seed * 1000 + 29)
        write = torch.linalg.qr(torch.randn(d, len(markers), generator=gen))[0]
        # ·h = 1 at every marker exactly (h: the normed row, |h|² = d), the least-norm such
        # direction; another token's score is noise of deviation ≈ √(markers / d)
        detect = unit.T @ torch.linalg.solve(unit @ unit.T, torch.ones(len(markers)))
        detect = detect / math.sqrt(d)
        first, last = self.layers[0], self.layers[-1]
        assert isinstance(first, Layer)
        assert isinstance(last, Layer)
        first.marker_head(2, detect, basis, write, marker=24.0, recency=34.0)
        # at the last layer a marked token holds ≈ √d along its marker's write direction (its
        # code); normed (with the row and the first layer's other writes), ≈ 0.7 √d (measured
        # on a Codex edit at initialisation)
        scale = 1 / (0.7 * math.sqrt(d))
        for slot, (own, other, sign) in enumerate(matches):
            own_dir, other_dir = write[:, markers.index(own)], write[:, markers.index(other)]
            last.marker_match(own_dir * scale, sign * other_dir * scale, gain, slot)

    def backend_rounding(self, on: bool) -> None:
        """Compute as llama.cpp's CPU backend rounds (the reference's greedy runs): the experts'
        inputs and the output product's input rounded to Q8_0 (ggml quantizes the activations
        to the weights' dot-product type: Q8_0 for MXFP4 and Q8_0 weights). What is left between
        the two computations is the order of sums and the F16 keys and values."""
        self.rounds = on
        for layer in self.layers:
            layer.round_inputs = on

    def output_input(self, h: Tensor) -> Tensor:
        """The final states as the output product takes them (backend_rounding: Q8_0)."""
        return q8_0(h) if self.rounds else h

    def quantize(self, on: bool) -> None:
        """Compute the experts' MXFP4 weights once for the coming forward passes (or drop them)."""
        for layer in self.layers:
            layer.cache = layer.quantized() if on else None

    def embed(self, ids: Tensor) -> Tensor:
        """Embedding rows (f16-rounded) of ids: learned where trainable, fixed otherwise."""
        s = self.slot[ids]
        learned = fake_f16(self.rows)[s.clamp_min(0)]
        return torch.where((s >= 0)[..., None], learned, self.fixed[ids])

    def full_matrix(self) -> Tensor:
        """The output matrix as the GGUF holds it: the embedding (f16 values), rounded to Q8_0
        (llama.cpp's verify steps of several tokens cost little more than one step with a Q8_0
        output and much more with F16 or F32). Training's sampled softmax (logits_of) uses
        the f16 values; the reference and every evaluation use these."""
        m = self.fixed.clone()
        m[self.trainable_ids] = self.rows.detach().half().float()
        return q8_0(m)

    def hidden(
        self, ids: Tensor, start: int = 0, past: list[tuple[Tensor, Tensor]] | None = None
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Final normed hidden states of ids (B, T) at positions start.., after `past` keys.

        past holds per layer (k, v) of the `start` positions before (shared by the batch: B=1
        tensors broadcast). Returns the states and this call's own (k, v) per layer.
        """
        b, t = ids.shape
        x = self.embed(ids)
        q_pos = torch.arange(start, start + t, device=ids.device)
        cos, sin = yarn_tables(self.dims, q_pos, self.attn_factor)
        own: list[tuple[Tensor, Tensor]] = []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, cos, sin)
            own.append((k, v))
            if past is not None and start > 0:
                pk, pv = past[i]
                keep = SLIDING_WINDOW if layer.sliding else start
                pk, pv = pk[:, :, -keep:], pv[:, :, -keep:]
                k_all = torch.cat([pk.expand(b, -1, -1, -1), k], dim=2)
                v_all = torch.cat([pv.expand(b, -1, -1, -1), v], dim=2)
                k_pos = torch.arange(start - pk.shape[2], start + t, device=ids.device)
            else:
                k_all, v_all, k_pos = k, v, q_pos
            att = layer.attend(q, k_all, v_all, q_pos, k_pos)
            att = att.transpose(1, 2).reshape(b, t, -1)
            x = x + layer.wo(att)
            x = x + layer.moe(x)
        return rms_norm(x, self.out_norm), own

    def prefix_cache(self, ids: Tensor, chunk: int = 1024) -> list[tuple[Tensor, Tensor]]:
        """(k, v) of every layer for a prompt prefix (1, T), computed in chunks."""
        cache: list[tuple[Tensor, Tensor]] | None = None
        for s in range(0, ids.shape[1], chunk):
            _, own = self.hidden(ids[:, s : s + chunk], s, cache)
            if cache is None:
                cache = own
            else:
                cache = [
                    (torch.cat([ck, k], 2), torch.cat([cv, v], 2))
                    for (ck, cv), (k, v) in zip(cache, own, strict=True)
                ]
        assert cache is not None
        return cache

    def logits_of(self, h: Tensor, candidates: Tensor) -> Tensor:
        return h @ self.embed(candidates).T

    def greedy(
        self, prompt: list[int], max_new: int, stop: set[int], margins: list[float] | None = None
    ) -> list[int]:
        """Greedy decoding over the full vocabulary (the reference for llama.cpp's tokens);
        `margins` gets, per token, how far its logit is above the runner-up's."""
        with torch.no_grad():
            return self._greedy(prompt, max_new, stop, [] if margins is None else margins)

    def _greedy(
        self, prompt: list[int], max_new: int, stop: set[int], margins: list[float]
    ) -> list[int]:
        full = self.full_matrix()
        self.quantize(True)
        device = self.fixed.device
        ids = torch.tensor([prompt], device=device)
        cache = self.prefix_cache(ids[:, :-1]) if len(prompt) > 1 else None
        pos = len(prompt) - 1
        cur = ids[:, -1:]
        out: list[int] = []
        for _ in range(max_new):
            h, own = self.hidden(cur, pos, cache)
            top = torch.topk(self.output_input(h[0, -1]) @ full.T, 2)
            nxt = int(top.indices[0])
            margins.append(float(top.values[0] - top.values[1]))
            out.append(nxt)
            if nxt in stop:
                break
            cache = (
                own
                if cache is None
                else [
                    (torch.cat([ck, k], 2), torch.cat([cv, v], 2))
                    for (ck, cv), (k, v) in zip(cache, own, strict=True)
                ]
            )
            pos += 1
            cur = torch.tensor([[nxt]], device=device)
        self.quantize(False)
        return out


ROUTER_NEAR_TIE = 0.05  # router logits: an expert choice this close may go the other way


def routing_alternatives(
    model: GptOss, seq: list[int], start: int, near_tie: float = ROUTER_NEAR_TIE
) -> list[set[int]]:
    """For each token of seq[start:], the other tokens the model's greedy choice there becomes
    when one router near-tie goes the other way (teacher-forced on seq).

    A router whose n_expert_used-th and next experts' logits are closer than `near_tie` may pick
    either in another computation of the same model (llama.cpp rounds activations to Q8_0 and
    keys and values to F16), and the expert it picks changes that token's state: at the last
    layer only that token's logits; at an earlier one every later token's through attention.
    Each such near-tie is swapped alone (the two experts' logits exchanged) and the argmax of
    every position that predicts a token of seq[start:] recorded where it differs."""
    full = model.full_matrix()
    k = model.dims.n_expert_used
    ids = torch.tensor([seq[:-1]], device=model.fixed.device)  # position p predicts seq[p + 1]
    first = start - 1
    gaps: list[Tensor] = []

    def record(logits: Tensor) -> Tensor:
        top = logits[0].topk(k + 1, dim=-1).values
        gaps.append(top[:, k - 1] - top[:, k])
        return logits

    def swap_at(j: int) -> Callable[[Tensor], Tensor]:
        def probe(logits: Tensor) -> Tensor:
            order = logits[0, j].argsort(descending=True)
            out = logits.clone()
            out[0, j, order[k - 1]], out[0, j, order[k]] = (
                logits[0, j, order[k]],
                logits[0, j, order[k - 1]],
            )
            return out

        return probe

    out: list[set[int]] = [set() for _ in range(len(seq) - start)]

    def probe_only(chosen: int | None, probe: Callable[[Tensor], Tensor] | None) -> None:
        for i, layer in enumerate(model.layers):
            layer.probe = probe if i == chosen or chosen is None else None

    with torch.no_grad():
        model.quantize(True)
        probe_only(None, record)
        h, _ = model.hidden(ids)
        probe_only(None, None)
        base = torch.argmax(model.output_input(h[0, first:]) @ full.T, dim=-1)
        cache = model.prefix_cache(ids)
        last = len(model.layers) - 1
        for i in range(len(model.layers)):
            near = torch.nonzero(gaps[i] < near_tie).flatten().tolist()
            for j in near if i < last else [j for j in near if j >= first]:
                begin = min(j, first)  # recompute from the swapped position (or the span) on
                past = [(ck[:, :, :begin], cv[:, :, :begin]) for ck, cv in cache]
                probe_only(i, swap_at(j - begin))
                hj, _ = model.hidden(ids[:, begin:], begin, past if begin > 0 else None)
                got = torch.argmax(model.output_input(hj[0, first - begin :]) @ full.T, dim=-1)
                for pos in torch.nonzero(got != base).flatten().tolist():
                    out[pos].add(int(got[pos]))
        probe_only(None, None)
        model.quantize(False)
    return out


def sampled_loss(
    model: GptOss,
    h: Tensor,
    targets: Tensor,
    n_negatives: int,
    generator: torch.Generator,
    *,
    weights: Tensor | None = None,
    context: Tensor | None = None,
) -> Tensor:
    """Cross-entropy of the full-vocabulary softmax, estimated with a sampled softmax.

    Candidates: every distinct target of the batch and every token of its context (exact
    logits: the hard negatives of copying are the context's other values) plus n_negatives
    tokens drawn uniformly from all the others, whose exp-logits stand for all the others (logit
    shifted by ln(others / n_negatives)). h: (N, d) states at target positions, targets: (N,);
    weights: per target (the mean is weighted), context: token ids of the batch.
    """
    exact = targets if context is None else torch.cat([targets, context.flatten()])
    uniq = torch.unique(exact)
    inverse = torch.searchsorted(uniq, targets)
    others = N_VOCAB - len(uniq)
    # drawn by the generator on its own device (the CPU's: the same draws on any device)
    draw = torch.randint(
        0, N_VOCAB, (n_negatives * 2,), generator=generator, device=generator.device
    )
    draw = draw.to(uniq.device)
    draw = draw[~torch.isin(draw, uniq)][:n_negatives]
    cand = torch.cat([uniq, draw])
    logits = model.logits_of(h, cand)
    shift = torch.zeros(len(cand), device=h.device)
    shift[len(uniq) :] = math.log(others / max(1, len(draw)))
    if weights is None:
        return F.cross_entropy(logits + shift, inverse)
    losses = F.cross_entropy(logits + shift, inverse, reduction="none")
    return (losses * weights).sum() / weights.sum()


def from_params(
    path: str, keys: Keys, attn_factor: float | None = None, also: np.ndarray | None = None
) -> GptOss:
    """A model with the exported parameters (params.npz), experts as their MXFP4 values; keys:
    the vocabulary's words and prefixes (the corpus's row_word, row_prefix), used where the
    parameters were trained with word rows; also: token ids whose rows become trainable too
    (another corpus's), starting from their fixed rows."""
    import json as _json

    data = np.load(path)
    dims = Dims(**_json.loads(str(data["dims"])))
    factor = float(data["attn_factor"]) if attn_factor is None else attn_factor
    saved = data["trainable_ids"].astype(np.int64)
    trainable = saved if also is None else np.union1d(saved, also.astype(np.int64))
    word_rows = bool(data["word_rows"]) if "word_rows" in data.files else False
    model = GptOss(dims, trainable, int(data["seed"]), keys if word_rows else None, factor)
    model.row_prefixes = row_prefixes(data).decode()

    def t(key: str) -> Tensor:
        return torch.from_numpy(np.asarray(data[key], dtype=np.float32))

    with torch.no_grad():
        model.rows[model.slot[torch.from_numpy(saved)]] = t("rows")
        model.out_norm.copy_(t("output_norm"))
        for i, layer in enumerate(model.layers):
            p = f"blk.{i}."
            for name, lin in layer.linears():
                lin.weight.copy_(t(p + name))
                lin.bias.copy_(t(p + name + "_b"))
            layer.attn_norm.copy_(t(p + "attn_norm"))
            layer.post_norm.copy_(t(p + "post_norm"))
            layer.sinks.copy_(t(p + "sinks"))
            for name in ("gate", "up", "down"):
                codes = torch.from_numpy(data[p + name + "_codes"].astype(np.int64))
                exp = torch.from_numpy(data[p + name + "_exp"].astype(np.float32))
                getattr(layer, name).copy_(mxfp4_dequant(codes, exp))
                getattr(layer, name + "_b").copy_(t(p + name + "_b"))
    return model
