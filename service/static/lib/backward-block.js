// @ts-check
// The arithmetic of the gradients of /multihead's block and of the projections (backward-explain.js
// draws them), a leaf beside lib/backward.js: each clicked cell computed again in float64 from the
// gradient after it and the forward's arrays, as the service's backward does
// (service/core/backward.py; API "The backward pass, every step"). The block runs concat →
// projected (· W_o + b_o) → residual (+ x) → layer_norm; each of these the answer holds:
//   the last one's     dY = grad_output as given ("sum": 1)
//   grad_residual      through the layer norm: (γ·dy − mean(γ·dy) − x̂ · mean(γ·dy·x̂)) / σ,
//                      x̂ = (z − mean z)/σ, σ = √(var z + eps), over the row's features
//   grad_projected     = grad_residual (the residual adds x; its derivative is 1)
//   grad_concat        [i][c] = Σ_o dY[i][o] · W_o[c][o]   (dY = grad_projected)
//   grad_w_o           [c][o] = Σ_b Σ_i concat[i][c] · dY[i][o]; grad_b_o[o] = Σ_b Σ_i dY[i][o]
//   grad_ln_gamma/beta [t] = Σ_b Σ_i dy[i][t] · x̂[i][t] / Σ_b Σ_i dy[i][t]
// and the projections (q = x · W_q + b_q, k and v likewise, from the context in cross-attention):
//   grad_x   [i][m] = Σ_c dQ[i][c] · W_q[m][c] + (the k and v terms) (+ grad_residual[i][m])
//   grad_w_q [m][c] = Σ_b Σ_i x[i][m] · dQ[i][c]; grad_b_q[c] = Σ_b Σ_i dQ[i][c]
// dQ, dK, dV the heads' grad_q … side by side (a key/value head's: the query heads' sharing it,
// summed). Weights in the request's weight_layout (out_in: W[m][c] is stored [c][m], and so is its
// gradient); generated ones in_out. Not here (undefined: the page shows the service's number):
// the gate, `past`, MLA, a positional encoding under the weights' gradients, weights given in
// another form (in_proj_weight, per head, a state dict).
import { pick } from "./pick.js";
import { normOf } from "./layers.js";
import { weightAt } from "./projection.js";

/** The block's arrays in the forward's order. */
export const BLOCK = ["concat", "gated", "projected", "residual", "layer_norm", "gate"];
const SIDES = ["q", "k", "v"];
const PARAMS = new Set(["w_o", "b_o", "ln_gamma", "ln_beta"]);
// request fields whose backward (or whose weights) this is not: the gate, a cache, MLA, the clamp,
// shared k and v, a model's config, the per-head weights, a layer norm's weights by its module's
// name
const AWAY = [
  "past",
  "mla",
  "clip_qkv",
  "k_eq_v",
  "config",
  "heads",
  "output_layer_norm_weight",
  "output_layer_norm_bias",
];
// W_o under its other names: without any, W_o is the identity (api.md: w_o's default)
const W_O_FIELDS = ["w_o", "out_proj_weight", "o_proj_weight", "c_proj_weight"];

const sum = (terms) => terms.reduce((s, x) => s + x.value, 0);
const depth = (a) => (Array.isArray(a) ? 1 + depth(a[0]) : 0);
const away = (ctx) => AWAY.some((f) => ctx.request[f] !== undefined && ctx.request[f] !== false);

/** The batch items of the answer (null: not batched), by the depth of `name`. */
function items(ctx, name, rank = 2) {
  const a = ctx.data[name];
  return depth(a) > rank ? a.map((_, b) => b) : [null];
}

/** `name` for batch item b (2-D). */
const at = (ctx, name, b) => pick({ ...ctx, head: null, batch: b }, name);

/** The block's arrays the answer holds, in order (the gate aside: what "gated" multiplies by). */
const held = (ctx) => BLOCK.filter((n) => n !== "gate" && Array.isArray(ctx.data[n]));

/** The array after `name` in the block, or undefined when `name` is the last. */
function afterIn(ctx, name) {
  const h = held(ctx);
  return h[h.indexOf(name) + 1];
}

/** The layer norm's settings: eps and γ (1 when not given). */
function lnSettings(ctx, width) {
  const ln = ctx.request.layer_norm;
  const o = ln && typeof ln === "object" ? ln : {};
  return { eps: Number(o.eps ?? 1e-5), gamma: o.gamma ?? Array(width).fill(1), beta: o.beta };
}

/** x̂ and σ of row z (normOf's, γ and β left out). */
function hat(z, eps) {
  const n = normOf(z, 0, { type: "layer", eps });
  return { mean: n.mean, sigma: n.denom, xhat: n.terms.map((x) => x.c / n.denom) };
}

/** The layer norm's backward at [i][t]: (g − mean g − x̂ · mean(g x̂)) / σ, g = γ · dy. */
function lnBack(ctx, before, i, t) {
  const z = pick(ctx, before)[i],
    dy = pick(ctx, "grad_layer_norm")[i];
  const { eps, gamma } = lnSettings(ctx, z.length);
  const h = hat(z, eps);
  const terms = dy.map((d, k) => ({
    c: k,
    a: d,
    gamma: gamma[k],
    g: gamma[k] * d,
    xhat: h.xhat[k],
    value: gamma[k] * d * h.xhat[k],
  }));
  const meanG = terms.reduce((s, x) => s + x.g, 0) / terms.length;
  const meanGX = sum(terms) / terms.length;
  const g = terms[t].g;
  const total = (g - meanG - h.xhat[t] * meanGX) / h.sigma;
  return { kind: "ln-back", before, terms, meanG, meanGX, g, ...h, eps, xt: h.xhat[t], total };
}

/** grad_concat[i][c] = Σ_o dY[i][o] · W_o[c][o]. */
function concatBack(ctx, i, c) {
  const w = weightOf(ctx, "w_o"),
    dy = pick(ctx, "grad_projected");
  if (!w || !dy) return undefined;
  const terms = dy[i].map((d, o) => {
    const wv = weightAt(w.layout, w.m, c, o);
    return { c: o, a: d, b: wv, value: d * wv };
  });
  return { kind: "concat-back", layout: w.layout, terms, total: sum(terms) };
}

/** The gradient of block array `of` at [i][j], or undefined. */
export function blockCell(ctx, of, i, j) {
  if (ctx.endpoint !== "multihead" || away(ctx)) return undefined;
  if (of === "gate") return gateBack(ctx, i, j);
  if (!held(ctx).includes(of)) return undefined;
  const next = afterIn(ctx, of);
  if (next === "gated") return gatedBack(ctx, i, j);
  if (next === undefined) return lastCell(ctx, i, j);
  if (next === "layer_norm") return lnBack(ctx, of, i, j);
  if (next === "residual") {
    const g = pick(ctx, "grad_residual");
    return g && { kind: "residual-back", g: g[i][j], total: g[i][j] };
  }
  if (next === "projected") return concatBack(ctx, i, j);
  return undefined;
}

/** Back through the gate's product (gated = concat ∘ gate): grad_concat = grad_gated ∘ gate. */
function gatedBack(ctx, i, c) {
  const g = pick(ctx, "grad_gated"),
    gate = pick(ctx, "gate");
  if (!g || !gate) return undefined;
  const a = g[i][c],
    b = gate[i][c];
  return { kind: "gate-back", by: "gate", a, b, total: a * b };
}

/** The gate's gradient (gated = concat ∘ gate): grad_gate = grad_gated ∘ concat. */
function gateBack(ctx, i, c) {
  const g = pick(ctx, "grad_gated"),
    concat = pick(ctx, "concat");
  if (!g || !concat) return undefined;
  const a = g[i][c],
    b = concat[i][c];
  return { kind: "gate-back", by: "concat", a, b, total: a * b };
}

/** The block's last array's gradient: dO as the request gives it. */
function lastCell(ctx, i, j) {
  const given = ctx.request.grad_output;
  if (given === "sum") return { kind: "dO", sum: true, total: 1 };
  if (!Array.isArray(given)) return undefined;
  const a = Array.isArray(given[0][0]) ? given[ctx.batch ?? 0] : given;
  return { kind: "dO", total: a[i][j] };
}

/** A weight and its layout: the request's (in weight_layout) or the generated one (in_out). */
function weightOf(ctx, field) {
  const given = ctx.request[field];
  if (Array.isArray(given)) return { m: given, layout: ctx.request.weight_layout ?? "in_out" };
  const made = ctx.data[field];
  if (Array.isArray(made)) return { m: made, layout: "in_out" };
  const namedO = W_O_FIELDS.some((f) => ctx.request[f] !== undefined);
  return field === "w_o" && !namedO ? { m: null, layout: "identity" } : undefined;
}

/** The rows a projection read for batch item b: x, or the context for k and v in
 * cross-attention. */
function inputOf(ctx, side, b) {
  const field = side !== "q" && hasContext(ctx) ? "context" : "x";
  const given = ctx.request[field];
  const a = Array.isArray(given) ? given : ctx.data[field];
  if (!Array.isArray(a)) return undefined;
  return depth(a) > 2 ? a[b ?? 0] : a;
}

const hasContext = (ctx) => Array.isArray(ctx.request.context) || Array.isArray(ctx.data.context);

/** The gradient of the projection's output `side` (q, k or v) for batch item b, all heads side by
 * side; a key/value head's the sum of its query heads'. */
function sideGrad(ctx, side, b) {
  const name = "grad_" + side;
  if (ctx.endpoint !== "multihead") return at(ctx, name, b);
  const heads = ctx.data.heads;
  if (!Array.isArray(heads)) return undefined;
  const grouped = ctx.data[name]; // grouped-query heads: [kv head][row][column], per batch item
  if (Array.isArray(grouped)) return byKvHead(grouped, b);
  const each = heads.map((_, h) => pick({ ...ctx, head: h, batch: b }, name));
  if (each.some((g) => !Array.isArray(g))) return undefined;
  const kv = side === "q" ? heads.length : Number(ctx.data.num_kv_heads || heads.length);
  const group = heads.length / kv;
  return each[0].map((_, i) =>
    Array.from({ length: kv }, (_, o) =>
      each[o * group][i].map((_, c) =>
        each.slice(o * group, (o + 1) * group).reduce((s, g) => s + g[i][c], 0),
      ),
    ).flat(),
  );
}

/** A key/value gradient held per key/value head ([kv][row][column], batched [item][kv]…) as
 * rows: the heads side by side. */
function byKvHead(a, b) {
  const each = depth(a) > 3 ? a[b ?? 0] : a;
  return each[0].map((_, i) => each.map((g) => g[i]).flat());
}

/** grad_x[i][m] = Σ_side Σ_c d<side>[i][c] · W_<side>[m][c] (+ grad_residual[i][m]). */
function xBack(ctx, i, m) {
  if (Array.isArray(ctx.data.gate)) return undefined; // the gate's share (through the sigmoid)
  const sides = hasContext(ctx) ? ["q"] : SIDES;
  const parts = [];
  for (const side of sides) {
    const w = weightOf(ctx, "w_" + side),
      d = sideGrad(ctx, side, ctx.batch ?? null);
    if (!w || !d) return undefined;
    const terms = d[i].map((g, c) => {
      const wv = weightAt(w.layout, w.m, m, c);
      return { c, a: g, b: wv, value: g * wv };
    });
    parts.push({ side, layout: w.layout, terms, total: sum(terms) });
  }
  const res =
    ctx.endpoint === "multihead" && ctx.request.residual ? pick(ctx, "grad_residual") : null;
  const residual = Array.isArray(res) ? res[i][m] : null;
  const total = parts.reduce((s, p) => s + p.total, 0) + (residual ?? 0);
  return { kind: "x-back", parts, residual, total };
}

const SUMMED = {
  w: (x, g, m, c) => ({ a: x[m], b: g[c], value: x[m] * g[c] }),
  b: (x, g, m, c) => ({ a: g[c], b: 1, value: g[c] }),
};

/** What W_o reads: the concat, or with the gate the gated concat. */
const gatedName = (ctx) => (Array.isArray(ctx.data.gated) ? "gated" : "concat");

/** A weight's or a bias's gradient: Σ over batch items and rows of input · gradient. */
function paramBack(ctx, field, i, j) {
  const [what, side] = field.split("_");
  const out = side === "o";
  if (!out && !SIDES.includes(side)) return undefined;
  if (ctx.request.positional_encoding && what === "w") return undefined; // x + PE is not x
  const w = weightOf(ctx, "w_" + side);
  if (!w) return undefined;
  // [m][c] of W (input feature m, output column c), stored [c][m] when out_in; a bias's [c]
  const [m, c] = what === "b" ? [0, j] : w.layout === "out_in" ? [j, i] : [i, j];
  const terms = [];
  for (const b of items(ctx, out ? gatedName(ctx) : "grad_x")) {
    const x = out ? at(ctx, gatedName(ctx), b) : inputOf(ctx, side, b);
    const g = out ? at(ctx, "grad_projected", b) : sideGrad(ctx, side, b);
    if (!x || !g) return undefined;
    g.forEach((row, r) => terms.push({ item: b, c: r, ...SUMMED[what](x[r], row, m, c) }));
  }
  return {
    kind: what === "b" ? "bias-back" : "weight-back",
    side,
    m,
    c,
    layout: w.layout,
    terms,
    total: sum(terms),
  };
}

/** grad_ln_gamma[t] = Σ dy[i][t] · x̂[i][t]; grad_ln_beta[t] = Σ dy[i][t]. */
function lnParamBack(ctx, field, t) {
  const before = held(ctx)[held(ctx).indexOf("layer_norm") - 1];
  if (!before) return undefined;
  const terms = [];
  for (const b of items(ctx, "layer_norm")) {
    const z = at(ctx, before, b),
      dy = at(ctx, "grad_layer_norm", b);
    const { eps } = lnSettings(ctx, z[0].length);
    z.forEach((row, r) => {
      const xh = hat(row, eps).xhat[t];
      const beta = field === "ln_beta";
      terms.push({ item: b, c: r, a: dy[r][t], b: xh, value: beta ? dy[r][t] : dy[r][t] * xh });
    });
  }
  return { kind: "ln-param-back", beta: field === "ln_beta", before, terms, total: sum(terms) };
}

/** The gradient of a projection's input or parameter `of` at [i][j], or undefined. */
export function projectionCell(ctx, of, i, j) {
  if (away(ctx)) return undefined;
  if (of === "x") return xBack(ctx, i, j);
  if (of === "ln_gamma" || of === "ln_beta")
    return ctx.endpoint === "multihead" ? lnParamBack(ctx, of, j) : undefined;
  if (PARAMS.has(of) && ctx.endpoint !== "multihead") return undefined;
  if (/^[wb]_[qkvo]$/.test(of)) return paramBack(ctx, of, i, j);
  return undefined;
}
