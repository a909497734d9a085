// @ts-check
// The arithmetic of the gradients of DeepSeek's multi-head latent attention (MLA; backward-explain.js
// draws them), a leaf beside lib/backward.js: each clicked cell computed again in float64 from the
// gradients after it and the forward's arrays, as the service's backward does
// (service/core/latent.py latent_backward; API "The backward pass, every step", "Multi-head latent
// attention"). The heads' dP, dS, dQ (grad_q_rotated), dK (grad_k_rotated) and dV are
// lib/backward.js's generic rules; from there, per head h (col: a column of all heads side by side)
//   grad_q_nope, grad_q_rope  the first nope and the last r columns of grad_q_rotated (Q = [q_nope |
//                             q_rope]); grad_k_nope the first nope columns of grad_k_rotated
//   grad_q, grad_k            before RoPE: [the nope columns | RoPE's transpose of the rope ones]
//                             (DeepSeek's output layout: pair p's first member at p, its second at
//                             r/2 + p), pair (f, g) of the layout RoPE turned: d[f] = a·c + b·s,
//                             d[g] = b·c − a·s, (a, b) = (g[p], g[r/2 + p]), c, s = cos φ, sin φ
//                             times the gain; a head's grad_k holds its copy of k_pe's gradient
//   grad_k_rope [s][t]        = Σ_h grad_k_rotated_h[s][nope + t]: one key read by every head
//   grad_c_kv   [s][u]        = Σ_col [grad_k_nope_h | grad_v_h][s][col] · kv_b_proj.weight[col][u]
//   grad_c_q    [i][u]        = Σ_col grad_q_h[i][col] · q_b_proj.weight[col][u]
//   through the latents' RMS norms: dz = (g − x̂ · mean(g x̂)) / σ, g = w ∘ grad_c, over the row;
//   dC = [dz of c_kv | dk_pe], dk_pe[s][t] = Σ_h grad_k_h[s][nope + t] (the heads' copies)
//   grad_w_kv_b [u][col] = Σ c_kv[s][u] · d[k_nope | V][s][col]; grad_w_q [u][col] = Σ c_q[i][u] ·
//   grad_q[i][col] (x without q_lora_rank); grad_kv_a_norm_weight [u] = Σ grad_c_kv[s][u] · x̂[s][u],
//   grad_q_a_norm_weight likewise; grad_w_kv_a [m][c] = Σ x[s][m] · dC[s][c], grad_b_kv_a [c] =
//   Σ dC[s][c]; grad_w_q_a, grad_b_q_a from dz of c_q; sums over the tokens and the batch items
//   grad_x [i][m] = Σ_c dC[i][c] · W_kva[c][m] + Σ_u dz_q[i][u] · W_qa[u][m] (or Σ_col grad_q[i][col]
//                   · W_q[col][m]) (+ grad_residual[i][m])
// The weights as the request's state dict holds them (out_in, DeepSeek's names); their gradients
// in in_out. The block (W_o = o_proj.weightᵀ, the residual, the layer norm) is lib/backward-block.js's,
// read with o_proj's weight and bias as w_o, b_o; a layer given by `config` is read with the
// fields the config gave (lib/pick.js asRead). Not here (undefined: the page shows the service's
// number): weights the request does not hold as a state dict.
import { pick } from "./pick.js";
import { blockCell, projectionCell, BLOCK } from "./backward-block.js";
import { queryPosition, ropeAngles, ropeSettings, ropeUsed } from "./positions.js";

const sum = (terms) => terms.reduce((s, x) => s + x.value, 0);
const depth = (a) => (Array.isArray(a) ? 1 + depth(a[0]) : 0);
const transpose = (m) => m[0].map((_, c) => m.map((row) => row[c]));

/** Whether ctx's answer is of an MLA layer (the request's mla, or a config's: the latents). */
const isMla = (ctx) =>
  ctx.endpoint === "multihead" && (!!ctx.request.mla || Array.isArray(ctx.data.c_kv));

/** A state dict entry under its dotted name or with underscores, or undefined. */
function field(request, name) {
  const a = request[name] ?? request[name.replace(/\./g, "_")];
  return Array.isArray(a) ? a : undefined;
}

/** The layer's sizes, read off the answer (as mla gave them). */
function dimsOf(ctx) {
  const head0 = (name) => pick({ ...ctx, head: 0, batch: 0 }, name);
  const width = (name, h = false) => {
    const m = h ? head0(name) : pick({ ...ctx, head: null, batch: 0 }, name);
    return Array.isArray(m) && Array.isArray(m[0]) ? m[0].length : undefined;
  };
  const mla = ctx.request.mla && typeof ctx.request.mla === "object" ? ctx.request.mla : {};
  return {
    heads: ctx.data.heads.length,
    nope: width("q_nope", true) ?? mla.qk_nope_head_dim,
    rope: width("k_rope") ?? mla.qk_rope_head_dim,
    dv: width("v", true) ?? mla.v_head_dim,
    kvRank: width("c_kv") ?? mla.kv_lora_rank,
    qLatent: Array.isArray(ctx.data.c_q),
    eps: Number(mla.eps ?? 1e-6), // DeepSeek's latent norms (the service's mla.eps)
  };
}

/** The batch items (null: not batched). */
function items(ctx) {
  const x = ctx.request.x ?? ctx.data.x;
  return depth(x) > 2 ? x.map((_, b) => b) : [null];
}

/** Array `name` of batch item b: top level (head null) or head h's. */
const at = (ctx, name, b, head = null) => pick({ ...ctx, head, batch: b }, name);

/** x's rows for batch item b. */
function xRows(ctx, b) {
  const x = ctx.request.x ?? ctx.data.x;
  return depth(x) > 2 ? x[b ?? 0] : x;
}

/** x W_aᵀ + b for one row (W out_in, as the state dict holds it). */
const linear = (row, w, bias) =>
  w.map((wr, u) => wr.reduce((s, wt, t) => s + row[t] * wt, 0) + (bias ? bias[u] : 0));

/** The heads' rows side by side: row r of `name` of every head, concatenated (in_out columns). */
function sideBySide(ctx, names, b, r) {
  return ctx.data.heads.flatMap((_, h) => names.flatMap((n) => at(ctx, n, b, h)[r]));
}

// ---- Q's and K's parts, the shared key, RoPE's transpose

/** grad_<part>[i][j] = grad_<whole>[i][start + j]: a slice of the rotated Q or K. */
function part(ctx, whole, i, j, start) {
  const g = pick(ctx, whole);
  if (!Array.isArray(g)) return undefined;
  const col = start + j;
  return { kind: "mla-part", whole, col, total: g[i][col] };
}

/** grad_k_rope[s][t] = Σ_h grad_k_rotated_h[s][nope + t]. */
function sharedKey(ctx, s, t) {
  const d = dimsOf(ctx);
  const col = d.nope + t;
  const terms = ctx.data.heads.map((_, h) => {
    const a = at(ctx, "grad_k_rotated", ctx.batch ?? null, h)[s][col];
    return { c: h, a, value: a };
  });
  return { kind: "mla-shared-key", col, terms, total: sum(terms) };
}

/** Feature t of a rope part before RoPE, from the gradient `g` [r] of its rotated features at
 * position pos: DeepSeek's layout undone, then the pair turned back by −φ. */
function ropeBack(ctx, g, pos, t) {
  const r = g.length;
  const half = r / 2;
  const used = ropeUsed(ctx);
  if (used === undefined) return undefined;
  const interleaved = ropeSettings(ctx.request, r).style === "interleaved";
  const pair = interleaved ? Math.floor(t / 2) : t % half;
  const first = interleaved ? t % 2 === 0 : t < half;
  const phi = ropeAngles(ropeSettings(ctx.request, r), used.theta, pos)[pair];
  const c = Math.cos(phi) * used.gain,
    s = Math.sin(phi) * used.gain;
  const a = g[pair],
    b = g[half + pair];
  const total = first ? a * c + b * s : b * c - a * s;
  return { pair, first, interleaved, phi, c, s, a, b, gain: used.gain, pos, half, total };
}

/** grad_q or grad_k (head h) at [i][t]: the nope part as the scores' gradient gave it, the rope
 * part RoPE's transpose of the head's rope columns of grad_<side>_rotated. */
function beforeRope(ctx, side, i, t) {
  const d = dimsOf(ctx);
  const whole = `grad_${side}_rotated`;
  if (t < d.nope) return part(ctx, whole, i, t, 0);
  const g = pick(ctx, whole);
  if (!Array.isArray(g) || !Array.isArray(ctx.data.query_positions)) return undefined;
  const back = ropeBack(ctx, g[i].slice(d.nope), queryPosition(ctx, i), t - d.nope);
  return back && { kind: "mla-rope-back", side, whole, nope: d.nope, t: t - d.nope, ...back };
}

// ---- the latents' up-projections: grad_c_kv, grad_c_q

/** Σ_col d[row][col] · W[col][u] (W out_in [cols][u]): a latent's gradient from its
 * up-projection's. */
function upBack(ctx, which, row, u) {
  const kv = which === "c_kv";
  const w = field(ctx.request, kv ? "kv_b_proj.weight" : "q_b_proj.weight");
  if (!w) return undefined;
  const names = kv ? ["grad_k_nope", "grad_v"] : ["grad_q"];
  const d = sideBySide(ctx, names, ctx.batch ?? null, row);
  const terms = d.map((a, col) => ({ c: col, a, b: w[col][u], value: a * w[col][u] }));
  const dims = dimsOf(ctx);
  const per = kv ? dims.nope + dims.dv : dims.nope + dims.rope;
  return { kind: "mla-up", which, names, per, terms, total: sum(terms) };
}

// ---- the latents' RMS norms

/** The latent before its norm for every row of batch item b: x W_aᵀ + b (c_kv's first
 * kv_lora_rank features; k_pe the rest). */
function preNorm(ctx, which, b) {
  const kv = which === "c_kv";
  const w = field(ctx.request, kv ? "kv_a_proj_with_mqa.weight" : "q_a_proj.weight");
  const bias = field(ctx.request, kv ? "kv_a_proj_with_mqa.bias" : "q_a_proj.bias");
  if (!w) return undefined;
  const width = kv ? dimsOf(ctx).kvRank : w.length;
  return xRows(ctx, b).map((row) => linear(row, w, bias).slice(0, width));
}

/** The norm weight of `which` (1 when the request has none). */
function normWeight(ctx, which, n) {
  const name = which === "c_kv" ? "kv_a_layernorm.weight" : "q_a_layernorm.weight";
  return field(ctx.request, name) ?? Array(n).fill(1);
}

/** RMS norm's backward over row z: σ = √(mean z² + eps), x̂ = z/σ, g = w ∘ gy,
 * dz = (g − x̂ · mean(g x̂)) / σ. */
function rmsBack(z, w, gy, eps) {
  const sigma = Math.sqrt(z.reduce((s, v) => s + v * v, 0) / z.length + eps);
  const terms = z.map((v, k) => {
    const xhat = v / sigma;
    const g = w[k] * gy[k];
    return { c: k, a: gy[k], gamma: w[k], g, xhat, value: g * xhat };
  });
  const meanGX = sum(terms) / terms.length;
  const dz = terms.map((x) => (x.g - x.xhat * meanGX) / sigma);
  return { sigma, terms, meanGX, dz };
}

/** The gradients of the latents before their norms for batch item b, row by row (dz), with
 * each row's norm backward; undefined when a weight is missing. */
function latentBack(ctx, which, b) {
  const z = preNorm(ctx, which, b);
  const gy = at(ctx, "grad_" + which, b);
  if (!z || !Array.isArray(gy)) return undefined;
  const w = normWeight(ctx, which, z[0].length);
  const eps = dimsOf(ctx).eps;
  return z.map((row, r) => rmsBack(row, w, gy[r], eps));
}

/** dk_pe[s][t] = Σ_h grad_k_h[s][nope + t]: the heads' copies of the shared key's gradient. */
function peBack(ctx, b, s) {
  const d = dimsOf(ctx);
  return Array.from({ length: d.rope }, (_, t) =>
    ctx.data.heads.reduce((acc, _, h) => acc + at(ctx, "grad_k", b, h)[s][d.nope + t], 0),
  );
}

/** The rows of the gradient before a down projection for batch item b: kv_a_proj_with_mqa's
 * [dz of c_kv | dk_pe], q_a_proj's dz of c_q. */
function downRows(ctx, which, b) {
  const back = latentBack(ctx, which, b);
  if (!back) return undefined;
  return back.map((n, s) => (which === "c_kv" ? [...n.dz, ...peBack(ctx, b, s)] : n.dz));
}

// ---- the weights' gradients: Σ over the tokens and the batch items

/** Σ_b Σ_r a(b)[r][m] · d(b)[r][c] (a bias: Σ d[r][c]); the rows' terms. */
function summed(ctx, left, right, m, c) {
  const terms = [];
  for (const b of items(ctx)) {
    const a = left ? left(b) : null,
      d = right(b);
    if ((left && !a) || !d) return undefined;
    d.forEach((row, r) => {
      const [x, y] = a ? [a[r][m], row[c]] : [row[c], 1]; // a bias: the gradient, times 1
      terms.push({ item: b, c: r, a: x, b: y, value: x * y });
    });
  }
  return terms;
}

// a weight or bias gradient: what its rows read (a), the gradient after it (d), as names
const WEIGHTS = {
  w_kv_b: { a: "c_kv", d: "d[k_nope | V]", rows: (ctx, b) => at(ctx, "c_kv", b) },
  w_q: { a: "c_q", d: "grad_q", rows: (ctx, b) => at(ctx, "c_q", b) },
  w_kv_a: { a: "x", d: "dC", rows: (ctx, b) => xRows(ctx, b) },
  w_q_a: { a: "x", d: "dz_q", rows: (ctx, b) => xRows(ctx, b) },
  b_kv_a: { a: null, d: "dC", rows: null },
  b_q_a: { a: null, d: "dz_q", rows: null },
};

/** The gradient rows each weight's d names, for batch item b. */
const DROWS = {
  "d[k_nope | V]": (ctx, b) =>
    at(ctx, "c_kv", b).map((_, s) => sideBySide(ctx, ["grad_k_nope", "grad_v"], b, s)),
  grad_q: (ctx, b) => xRows(ctx, b).map((_, i) => sideBySide(ctx, ["grad_q"], b, i)),
  dC: (ctx, b) => downRows(ctx, "c_kv", b),
  dz_q: (ctx, b) => downRows(ctx, "c_q", b),
};

/** A weight's [m][c] (in_out) or a bias's [c] gradient. */
function weightBack(ctx, of, i, j) {
  const spec = WEIGHTS[of];
  const d = dimsOf(ctx);
  const fromX = of === "w_q" && !d.qLatent; // q_proj: the queries straight from x
  const a = fromX ? "x" : spec.a;
  const rows = fromX ? (b) => xRows(ctx, b) : spec.rows && ((b) => spec.rows(ctx, b));
  const bias = spec.a === null;
  const [m, c] = bias ? [0, j] : [i, j];
  const terms = summed(ctx, rows, (b) => DROWS[spec.d](ctx, b), m, c);
  if (!terms) return undefined;
  const kind = bias ? "mla-bias" : "mla-weight";
  return { kind, a, d: spec.d, m, c, kvRank: d.kvRank, nope: d.nope, terms, total: sum(terms) };
}

/** grad_<norm>_weight[u] = Σ_b Σ_r grad_c[r][u] · x̂[r][u]. */
function normWeightBack(ctx, which, u) {
  const terms = [];
  for (const b of items(ctx)) {
    const back = latentBack(ctx, which, b);
    if (!back) return undefined;
    back.forEach((n, r) => {
      const t = n.terms[u];
      terms.push({ item: b, c: r, a: t.a, b: t.xhat, value: t.a * t.xhat });
    });
  }
  return { kind: "mla-norm-weight", which, terms, total: sum(terms) };
}

// ---- grad_x

/** grad_x[i][m]: the latents' shares (kv_a_proj_with_mqa's, q_a_proj's or q_proj's) and the
 * residual's. */
function xBack(ctx, i, m) {
  const b = ctx.batch ?? null;
  const d = dimsOf(ctx);
  const q = d.qLatent
    ? { w: "q_a_proj.weight", d: "dz_q", rows: () => downRows(ctx, "c_q", b) }
    : { w: "q_proj.weight", d: "grad_q", rows: () => DROWS.grad_q(ctx, b) };
  const kv = { w: "kv_a_proj_with_mqa.weight", d: "dC", rows: () => downRows(ctx, "c_kv", b) };
  const parts = [];
  for (const p of [kv, q]) {
    const w = field(ctx.request, p.w),
      rows = p.rows();
    if (!w || !rows) return undefined;
    const terms = rows[i].map((g, c) => ({ c, a: g, b: w[c][m], value: g * w[c][m] }));
    parts.push({ w: p.w, d: p.d, terms, total: sum(terms) });
  }
  const norms = ["c_kv", ...(d.qLatent ? ["c_q"] : [])].map((which) => ({
    which,
    ...latentBack(ctx, which, b)[i],
  }));
  const res = ctx.request.residual ? pick({ ...ctx, head: null }, "grad_residual") : null;
  const residual = Array.isArray(res) ? res[i][m] : null;
  const total = parts.reduce((s, p) => s + p.total, 0) + (residual ?? 0);
  return { kind: "mla-x", parts, norms, pe: peBack(ctx, b, i), residual, total };
}

// ---- the block: lib/backward-block.js's, with o_proj as W_o

/** The request as lib/backward-block.js reads a block: o_proj's weight (transposed: in_out, as
 * the service gives grad_w_o) and bias as w_o, b_o; mla left out. */
function blockRequest(request) {
  const { mla, ...rest } = request;
  const w = field(request, "o_proj.weight"),
    b = field(request, "o_proj.bias");
  return {
    ...rest,
    weight_layout: "in_out",
    ...(w ? { w_o: transpose(w) } : {}),
    ...(b ? { b_o: b } : {}),
  };
}

const BLOCK_PARAMS = new Set(["w_o", "b_o", "ln_gamma", "ln_beta"]);

function blockBack(ctx, of, i, j) {
  const seen = { ...ctx, request: blockRequest(ctx.request) };
  return BLOCK.includes(of) ? blockCell(seen, of, i, j) : projectionCell(seen, of, i, j);
}

/** A cell whose rows are the keys' tokens (the explanation says "key i"). */
const keyRows = (cell) => cell && { ...cell, keyRows: true };

// each gradient of an MLA answer this module computes: the array it is the gradient of → its cell
const CELLS = {
  q_nope: (ctx, i, j) => part(ctx, "grad_q_rotated", i, j, 0),
  q_rope: (ctx, i, j) => part(ctx, "grad_q_rotated", i, j, dimsOf(ctx).nope),
  k_nope: (ctx, i, j) => keyRows(part(ctx, "grad_k_rotated", i, j, 0)),
  q: (ctx, i, j) => beforeRope(ctx, "q", i, j),
  k: (ctx, i, j) => beforeRope(ctx, "k", i, j),
  k_rope: (ctx, i, j) => keyRows(sharedKey(ctx, i, j)),
  c_kv: (ctx, i, j) => keyRows(upBack(ctx, "c_kv", i, j)),
  c_q: (ctx, i, j) => upBack(ctx, "c_q", i, j),
  kv_a_norm_weight: (ctx, i, j) => normWeightBack(ctx, "c_kv", j),
  q_a_norm_weight: (ctx, i, j) => normWeightBack(ctx, "c_q", j),
  x: xBack,
  ...Object.fromEntries(
    Object.keys(WEIGHTS).map((n) => [n, (ctx, i, j) => weightBack(ctx, n, i, j)]),
  ),
  ...Object.fromEntries(
    [...BLOCK, ...BLOCK_PARAMS].map((n) => [n, (ctx, i, j) => blockBack(ctx, n, i, j)]),
  ),
};

/** Whether the gradient of `of` in ctx's answer is MLA's (this module's). */
export const latentOwns = (ctx, of) => isMla(ctx) && Object.hasOwn(CELLS, of);

/** The gradient of `of` at [i][j] in an MLA answer, or undefined. */
export function latentGradCell(ctx, of, i, j) {
  return CELLS[of](ctx, i, j);
}
