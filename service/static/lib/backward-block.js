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
// gradient); generated ones in_out; under other names (weightOf) as the service reads them:
// PyTorch's in_proj_weight (rows q, k, v) and out_proj_weight, the state dict's q_proj.weight …
// o_proj.weight (BERT's self.query.weight …, output.dense.weight), always out_in, their
// gradients in_out; the per-head `heads` (each head's columns, in weight_layout); with gate: true
// q_proj.weight's query rows (each head's d query rows, then its d gate rows). And:
//   the gate (gate = sigmoid(x W_gᵀ + b_g), W_g out_in), dz = grad_gate ∘ gate ∘ (1 − gate):
//   grad_gate_w[c][m] = Σ_b Σ_i x[i][m] · dz[i][c]; grad_gate_b[c] = Σ_b Σ_i dz[i][c];
//   grad_x's gate share Σ_c dz[i][c] · W_g[c][m]
//   k_eq_v: the values are the keys' projection: W_v is W_k, grad_w_k = Σ x · (dK + dV)
//   positional_encoding: the projections (and the gate) read x_in = x + PE, not x
//   output.LayerNorm.weight/.bias: the layer norm's γ and β; its eps the request's (a config's
//   as the service read it: lib/pick.js asRead)
//   past (a decode step): the projections read the new tokens' x only, and grad_q … are the new
//   tokens' (the cache's rows have their own, grad_past_k/v: lib/backward.js's)
//   clip_qkv: grad_q, grad_k, grad_v are the projections' outputs' (before the clamp: 0 where
//   it cut), so the projections read them as they are
//   fused projections (qkv_proj.weight, query_key_value.weight, Wqkv.weight, c_attn.weight):
//   W_q, W_k, W_v read out of the fused weight as the service unpacks it (service/wire/fused.py):
//   the rows (GPT-2's Conv1D: the columns) its qkv_layout gives — the request's, or a config
//   family's as the service read it — for h, h_kv, d; c_proj.weight as W_o
//   ([in][out] under the Conv1D, [out][in] otherwise); their gradients in_out, each weight
//   cell also named as the fused weight's entry (grad_state_dict holds it there)
// Not here (undefined: the page shows the service's number): MLA (its own or a config's), whose
// block lib/backward-latent.js hands here with mla left out and o_proj as W_o.
import { pick } from "./pick.js";
import { gateWeights, normOf } from "./layers.js";
import { weightAt } from "./projection.js";

/** The block's arrays in the forward's order. */
export const BLOCK = ["concat", "gated", "projected", "residual", "layer_norm", "gate"];
const SIDES = ["q", "k", "v"];
const PARAMS = new Set(["w_o", "b_o", "ln_gamma", "ln_beta"]);
// request fields whose backward this is not: MLA
const AWAY = ["mla"];
// each projection's weight under a module's names (service/wire/schemas/requests.py: the state
// dict's, nn.MultiheadAttention's, BERT's), always out_in
const NAMES = {
  q: ["q_proj.weight", "q_proj_weight", "self.query.weight", "query.weight", "q.weight"],
  k: ["k_proj.weight", "k_proj_weight", "self.key.weight", "key.weight", "k.weight"],
  v: ["v_proj.weight", "v_proj_weight", "self.value.weight", "value.weight", "v.weight"],
  o: [
    "out_proj_weight",
    "out_proj.weight",
    "o_proj.weight",
    "o_proj_weight",
    "dense.weight",
    "output.dense.weight",
    "o.weight",
  ],
};
// the fused projections (service/wire/fused.py's FUSED): each weight's names, the module's first
const FUSED = [
  ["qkv_proj.weight", "qkv_proj_weight"],
  ["query_key_value.weight", "query_key_value_weight"],
  ["Wqkv.weight", "Wqkv_weight", "wqkv_weight"],
  ["c_attn.weight", "c_attn_weight"],
];
// GPT-2's and GPTBigCode's output projection beside c_attn.weight
const C_PROJ = ["c_proj.weight", "c_proj_weight"];
const MP_NUM = 4; // CodeGen's qkv_proj: 4 blocks (CodeGenAttention's mp_num)
const range = (n, from = 0) => Array.from({ length: n }, (_, t) => from + t);
/** d rows from each start, one after the other. */
const runs = (starts, d) => starts.flatMap((s) => range(d, s));
/** [q; k; v] one after the other: W_q h·d rows, then W_k and W_v h_kv·d each. */
const stacked = ({ h, kv, d }) => [range(h * d), range(kv * d, h * d), range(kv * d, (h + kv) * d)];
// each layout's indices of W_q's, W_k's and W_v's rows (W[c] the fused axis's entry) in the
// fused axis, for h query heads and kv key/value heads of d features (service/wire/fused.py's
// LAYOUTS, in the order of q_proj.weight's rows, head by head)
const LAYOUTS = {
  rows: stacked,
  columns: stacked, // GPT-2's Conv1D: the columns
  per_head: ({ h, d }) => {
    const first = range(h).map((i) => 3 * d * i); // head i's query row
    return [
      runs(first, d),
      runs(
        first.map((s) => s + d),
        d,
      ),
      runs(
        first.map((s) => s + 2 * d),
        d,
      ),
    ];
  },
  grouped: ({ h, kv, d }) => {
    const g = h / kv; // query heads per key/value head: its g·d query rows, then k, then v
    const group = range(kv).map((i) => (g + 2) * d * i);
    return [
      runs(group, g * d),
      runs(
        group.map((s) => s + g * d),
        d,
      ),
      runs(
        group.map((s) => s + (g + 1) * d),
        d,
      ),
    ];
  },
  codegen: ({ h, d }) => {
    const per = h / MP_NUM,
      local = (h * d) / MP_NUM; // each block: its heads' q, then v, then k, local rows each
    const first = range(h).map((j) => 3 * local * Math.floor(j / per) + d * (j % per));
    const at = (shift) =>
      runs(
        first.map((s) => s + shift),
        d,
      );
    return [at(0), at(2 * local), at(local)];
  },
};

// BERT's output.LayerNorm: the layer norm's γ and β
const LN_NAMES = {
  gamma: ["output.LayerNorm.weight", "output_LayerNorm_weight"],
  beta: ["output.LayerNorm.bias", "output_LayerNorm_bias"],
};

const sum = (terms) => terms.reduce((s, x) => s + x.value, 0);
const depth = (a) => (Array.isArray(a) ? 1 + depth(a[0]) : 0);
/** Whether the answer's backward is not this file's: a field of AWAY (a config's mla too, the
 * request being read as the service read it). */
const away = (ctx) => AWAY.some((f) => ctx.request[f] !== undefined && ctx.request[f] !== false);
const given = (request, names) => names.find((n) => Array.isArray(request[n]));

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

/** The layer norm's settings: eps and γ (1 when not given), from layer_norm (a config's as the
 * service read it: lib/pick.js asRead) or BERT's output.LayerNorm.weight; eps 1e-5 when not
 * given (LayerNormOptions' default). */
function lnSettings(ctx, width) {
  const r = ctx.request;
  const o = r.layer_norm && typeof r.layer_norm === "object" ? r.layer_norm : {};
  const named = (side) => {
    const n = given(r, LN_NAMES[side]);
    return n && r[n];
  };
  const gamma = o.gamma ?? named("gamma") ?? Array(width).fill(1);
  return { eps: Number(o.eps ?? 1e-5), gamma, beta: o.beta ?? named("beta") };
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
  const w = weightOf(ctx, "o"),
    dy = pick(ctx, "grad_projected");
  if (!w || !dy) return undefined;
  const terms = dy[i].map((d, o) => {
    const wv = weightAt(w.layout, w.m, c, o);
    return { c: o, a: d, b: wv, value: d * wv };
  });
  const fused = w.fused && { fused: w.fused, kind: "concat-back-fused" };
  return { kind: "concat-back", layout: w.layout, terms, total: sum(terms), ...fused };
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

/** W_<side> (q, k, v, o) as the page reads it: {m, layout, grad, from}: m read by weightAt in
 * `layout`, `grad` the layout of its gradient in the answer (the request's weight_layout for a
 * w_<side> given, else in_out), `from` where it came from. The request's w_<side>, a module's
 * name, in_proj_weight's rows, the heads' columns, the generated one; W_o the identity when not
 * given; W_v is W_k under k_eq_v. */
function weightOf(ctx, side) {
  if (side === "v" && kEqV(ctx)) return weightOf(ctx, "k");
  const r = ctx.request,
    field = "w_" + side;
  if (Array.isArray(r[field])) {
    const layout = r.weight_layout ?? "in_out";
    return { m: r[field], layout, grad: layout, from: field };
  }
  const named = given(r, NAMES[side]);
  if (named)
    return { m: queryRows(ctx, side, r[named]), layout: "out_in", grad: "in_out", from: named };
  const other = side === "o" ? cProjOf(ctx) : (packedOf(ctx, side) ?? fusedOf(ctx, side));
  if (other) return other;
  const made = ctx.data[field];
  if (Array.isArray(made)) return { m: made, layout: "in_out", grad: "in_out", from: field };
  return side === "o" && !given(r, C_PROJ)
    ? { m: null, layout: "identity", grad: "in_out", from: "identity" }
    : undefined;
}

/** The fused projection's layout: the request's qkv_layout (a config's family's as the service
 * read it: lib/pick.js asRead). */
function fusedLayout(ctx) {
  const layout = ctx.request.qkv_layout;
  return typeof layout === "string" ? layout : undefined;
}

/** W_<side> (q, k, v) out of a fused weight as the service unpacks it (service/wire/fused.py):
 * its layout's rows of the fused weight (out_in), or GPT-2's Conv1D columns (in_out); with
 * `fused` {name, layout, rows: the fused axis's index of each of W's output columns, conv1d,
 * bias: the fused bias's name}; undefined without one (or an unknown layout). */
function fusedOf(ctx, side) {
  const r = ctx.request;
  const names = FUSED.find((n) => given(r, n));
  const layout = fusedLayout(ctx);
  if (!names || !layout || !(layout in LAYOUTS)) return undefined;
  const h = Number(ctx.data.num_heads),
    d = Number(ctx.data.d_k);
  const kv = Number(ctx.data.num_kv_heads ?? h);
  const rows = LAYOUTS[layout]({ h, kv, d })[SIDES.indexOf(side)];
  const w = r[given(r, names)];
  const conv1d = layout === "columns";
  const m = conv1d ? w.map((row) => rows.map((n) => row[n])) : rows.map((n) => w[n]);
  const name = names[0];
  const fused = { name, layout, rows, conv1d, bias: name.replace(".weight", ".bias") };
  return { m, layout: conv1d ? "in_out" : "out_in", grad: "in_out", from: name, fused };
}

/** W_o from c_proj.weight (with c_attn.weight): stored [in][out] (in_out) under GPT-2's
 * Conv1D (the columns layout), [out][in] (out_in) under GPTBigCode's Linear. */
function cProjOf(ctx) {
  if (!given(ctx.request, C_PROJ)) return undefined;
  const layout = fusedLayout(ctx);
  if (!layout || !(layout in LAYOUTS)) return undefined;
  const conv1d = layout === "columns";
  const m = ctx.request[given(ctx.request, C_PROJ)];
  const fused = { name: "c_proj.weight", layout, conv1d, output: true, bias: "c_proj.bias" };
  return { m, layout: conv1d ? "in_out" : "out_in", grad: "in_out", from: "c_proj.weight", fused };
}

/** Whether the values are the keys' projection (k_eq_v, or a config's attention_k_eq_v). */
const kEqV = (ctx) => ctx.request.k_eq_v === true;

/** Whether the answer has the output gate (gate: {w, b}, gate: true, or a config's). */
const gated = (ctx) => Array.isArray(ctx.data.gate);

/** q_proj.weight's query rows under gate: true (each head's d query rows, then its d gate
 * rows); any other weight as it is. */
function queryRows(ctx, side, m) {
  const g = ctx.request.gate;
  if (side !== "q" || !gated(ctx) || (g && typeof g === "object")) return m;
  const h = Number(ctx.data.num_heads ?? ctx.request.num_heads);
  const d = m.length / (2 * h);
  return m.filter((_, row) => row % (2 * d) < d);
}

/** W_<side> from PyTorch's in_proj_weight (rows q, k, v, each d_model, out_in) or the heads'
 * own weights (head n's columns n·d …, in weight_layout), or undefined. */
function packedOf(ctx, side) {
  const r = ctx.request;
  const at = SIDES.indexOf(side);
  if (Array.isArray(r.in_proj_weight)) {
    const n = r.in_proj_weight.length / 3;
    const m = r.in_proj_weight.slice(at * n, (at + 1) * n);
    return { m, layout: "out_in", grad: "in_out", from: "in_proj_weight", row0: at * n };
  }
  if (!Array.isArray(r.heads)) return undefined;
  const layout = r.weight_layout ?? "in_out";
  const each = r.heads.map((hd) => hd["w_" + side]);
  const m =
    layout === "out_in"
      ? each.flat(1) // [d][d_model] per head: rows stacked
      : each[0].map((_, t) => each.flatMap((w) => w[t])); // [d_model][d]: columns side by side
  return { m, layout, grad: "in_out", from: "heads" };
}

/** The rows a projection (or the gate) read for batch item b: x (x_in = x + PE when the answer
 * has it), or the context for k and v in cross-attention. */
function inputOf(ctx, side, b) {
  const field = side !== "q" && side !== "gate" && hasContext(ctx) ? "context" : inputName(ctx);
  const sent = field === "x_in" ? undefined : ctx.request[field];
  const a = Array.isArray(sent) ? sent : ctx.data[field];
  if (!Array.isArray(a)) return undefined;
  return depth(a) > 2 ? a[b ?? 0] : a;
}

/** What the projections read: x_in (x after the positional encoding) where the answer has it. */
const inputName = (ctx) => (ctx.data.x_in !== undefined ? "x_in" : "x");

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

/** grad_x[i][m] = Σ_side Σ_c d<side>[i][c] · W_<side>[m][c] (+ the gate's share Σ_c dz[i][c] ·
 * W_g[c][m]) (+ grad_residual[i][m]). Kind "x-back" with the request's w_q … (or generated
 * ones), "x-back-forms" with weights under other names, k_eq_v, x + PE or the gate. */
function xBack(ctx, i, m) {
  return readBack(ctx, i, m, hasContext(ctx) ? ["q"] : SIDES, true);
}

/** grad_context[i][m] = Σ_c dK[i][c] · W_k[m][c] + Σ_c dV[i][c] · W_v[m][c]: cross-attention's
 * keys and values read the context (no gate, no residual there). */
const contextBack = (ctx, i, m) =>
  hasContext(ctx) ? readBack(ctx, i, m, ["k", "v"], false) : undefined;

/** The gradient of what the projections `sides` read, at [i][m]: each side's share (and, for x
 * on /multihead's block, the gate's and the residual's when `block`). */
function readBack(ctx, i, m, sides, block) {
  const parts = [];
  for (const side of sides) {
    const w = weightOf(ctx, side),
      d = sideGrad(ctx, side, ctx.batch ?? null);
    if (!w || !d) return undefined;
    const terms = d[i].map((g, c) => {
      const wv = weightAt(w.layout, w.m, m, c);
      return { c, a: g, b: wv, value: g * wv };
    });
    parts.push({ side, layout: w.layout, from: w.from, fused: w.fused, terms, total: sum(terms) });
  }
  if (block && gated(ctx)) {
    const share = gateShare(ctx, i, m);
    if (!share) return undefined;
    parts.push(share);
  }
  const res = block && held(ctx).includes("residual") ? pick(ctx, "grad_residual") : null;
  const residual = Array.isArray(res) ? res[i][m] : null;
  const total = parts.reduce((s, p) => s + p.total, 0) + (residual ?? 0);
  const plain = parts.every((p) => p.from === "w_" + p.side) && (!block || inputName(ctx) === "x");
  const kind = parts.some((p) => p.fused)
    ? "x-back-fused"
    : plain && !kEqV(ctx)
      ? "x-back"
      : "x-back-forms";
  return { kind, parts, residual, total };
}

/** dz = grad_gate ∘ gate ∘ (1 − gate) for batch item b: the gate's gradient back through the
 * sigmoid, what W_g and b_g get. */
function gateDz(ctx, b) {
  const g = at(ctx, "grad_gate", b),
    gate = at(ctx, "gate", b);
  if (!Array.isArray(g) || !Array.isArray(gate)) return undefined;
  return g.map((row, r) =>
    row.map((x, c) => ({ g: x, s: gate[r][c], value: x * gate[r][c] * (1 - gate[r][c]) })),
  );
}

/** The gate's weights as gateWeights reads them (gate: true under a config as well). */
function gateOf(ctx) {
  const g = ctx.request.gate;
  const request = g === undefined ? { ...ctx.request, gate: true } : ctx.request;
  return gated(ctx) ? gateWeights({ ...ctx, request }) : undefined;
}

/** grad_x's share from the gate: Σ_c dz[i][c] · W_g[c][m] (W_g out_in). */
function gateShare(ctx, i, m) {
  const w = gateOf(ctx),
    dz = gateDz(ctx, ctx.batch ?? null);
  if (!w || !dz) return undefined;
  const terms = dz[i].map((z, c) => ({ c, a: z.value, b: w.w[c][m], value: z.value * w.w[c][m] }));
  return {
    side: "gate",
    layout: "out_in",
    from: w.field,
    fused: undefined,
    terms,
    total: sum(terms),
  };
}

/** grad_gate_w[c][m] = Σ_b Σ_i x[i][m] · dz[i][c] (out_in, as gate.w); grad_gate_b[c] =
 * Σ_b Σ_i dz[i][c]; x the rows the gate read (x_in with a positional encoding). */
function gateParamBack(ctx, field, i, j) {
  const bias = field === "gate_b";
  const [c, m] = bias ? [j, 0] : [i, j];
  const terms = [];
  for (const b of items(ctx, "gate")) {
    const x = inputOf(ctx, "gate", b),
      dz = gateDz(ctx, b);
    if (!x || !dz) return undefined;
    dz.forEach((row, r) => {
      const z = row[c];
      const a = bias ? 1 : x[r][m];
      terms.push({ item: b, c: r, a, g: z.g, s: z.s, dz: z.value, value: a * z.value });
    });
  }
  return {
    kind: bias ? "gate-b-back" : "gate-w-back",
    m,
    c,
    x: inputName(ctx),
    terms,
    total: sum(terms),
  };
}

const SUMMED = {
  w: (x, g, m, c) => ({ a: x[m], b: g[c], value: x[m] * g[c] }),
  b: (x, g, m, c) => ({ a: g[c], b: 1, value: g[c] }),
};

/** What W_o reads: the concat, or with the gate the gated concat. */
const gatedName = (ctx) => (Array.isArray(ctx.data.gated) ? "gated" : "concat");

/** The projections' outputs whose gradients W_<side> gets: its own, and under k_eq_v W_k the
 * values' too (one parameter read twice). */
const readsOf = (ctx, side) => (side === "k" && kEqV(ctx) ? ["k", "v"] : [side]);

/** A weight's or a bias's gradient: Σ over batch items and rows of input · gradient. Kind
 * "weight-back"/"bias-back" with the request's w_q … (or generated ones), "weight-back-forms" and
 * "bias-back-forms" with weights under other names, k_eq_v's two reads, or x + PE. */
function paramBack(ctx, field, i, j) {
  const [what, side] = field.split("_");
  const out = side === "o";
  if (!out && !SIDES.includes(side)) return undefined;
  if (side === "v" && kEqV(ctx)) return undefined; // no grad_w_v: W_k's holds both reads
  const w = weightOf(ctx, side);
  if (!w) return undefined;
  // [m][c] of W (input feature m, output column c), stored [c][m] when out_in; a bias's [c]
  const [m, c] = what === "b" ? [0, j] : w.grad === "out_in" ? [j, i] : [i, j];
  const reads = out ? ["o"] : readsOf(ctx, side);
  const terms = [];
  for (const read of reads)
    for (const b of items(ctx, out ? gatedName(ctx) : "grad_x")) {
      const x = out ? at(ctx, gatedName(ctx), b) : inputOf(ctx, read, b);
      const g = out ? at(ctx, "grad_projected", b) : sideGrad(ctx, read, b);
      if (!x || !g) return undefined;
      g.forEach((row, r) => terms.push({ item: b, c: r, read, ...SUMMED[what](x[r], row, m, c) }));
    }
  const plain = (w.from === "w_" + side || w.from === "identity") && reads.length === 1;
  const kind = what === "b" ? "bias-back" : "weight-back";
  const fused = w.fused && {
    kind: kind + "-fused",
    fused: w.fused,
    entry: fusedEntry(w.fused, what, m, c),
    flat: what === "b", // a bias's cell: one row
  };
  return {
    kind: plain && (out || inputName(ctx) === "x") ? kind : kind + "-forms",
    bias: what === "b",
    side,
    m,
    c,
    layout: w.grad,
    from: w.from,
    x: out ? gatedName(ctx) : hasContext(ctx) && side !== "q" ? "context" : inputName(ctx),
    reads,
    terms,
    total: sum(terms),
    ...fused,
  };
}

/** Where W[m][c] (b[c]) of a fused projection is in the weight (the bias) the request gave:
 * [name, index…]. W_q's column c is the fused axis's rows[c] (c_proj: W_o as stored). */
function fusedEntry(fused, what, m, c) {
  const at = fused.output ? c : fused.rows[c];
  if (what === "b") return [fused.bias, at];
  if (fused.output) return [fused.name, ...(fused.conv1d ? [m, c] : [c, m])];
  return [fused.name, ...(fused.conv1d ? [m, at] : [at, m])];
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
  if (of === "context") return contextBack(ctx, i, j);
  if (of === "ln_gamma" || of === "ln_beta")
    return ctx.endpoint === "multihead" ? lnParamBack(ctx, of, j) : undefined;
  if (PARAMS.has(of) && ctx.endpoint !== "multihead") return undefined;
  if (/^[wb]_[qkvo]$/.test(of)) return paramBack(ctx, of, i, j);
  if (of === "gate_w" || of === "gate_b")
    return ctx.endpoint === "multihead" && gated(ctx) ? gateParamBack(ctx, of, i, j) : undefined;
  return undefined;
}
