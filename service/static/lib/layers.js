// @ts-check
// Today's layers, a leaf (layers/explain.js draws them): what each step does and the slot it
// advances (kindOf, slotOf: the OpenAPI document's x-chain, service/core/chain.py's HEAD and
// BLOCK), the order of the forms the queries, keys, values and scores take (the answer's steps,
// placed by x-chain), which the scores and the output read the last of; the outputs whose cells
// a click explains; and the arithmetic of a cell of each layer by its step's kind (CELLS: the
// clamp of OLMo's clip_qkv, qk_norm's norm before RoPE or after it with weights w or 1 + w,
// over a head or a token's whole projection (OLMo 2), a weight row per head (Cohere), a bias
// (Phi), a config's settings as the answer's step states them,
// Gemma 4's weightless v_norm, RoPE with the answer's θ_i and gain (lib/positions.js), Llama 4's
// temperature, and /multihead's gated, with the gate it multiplies by (Qwen3-Next)), each
// computed again from the form before it in float64 as the service does
// (service/core/variants.py, chain.py's steps, multihead.py).
import { asRead, pick } from "./pick.js";
import { chainSteps } from "./schema.js";
import {
  anglePosition,
  keyRowPosition,
  pairFeatures,
  pairScalings,
  queryPosition,
  ropeAngles,
  ropeSettings,
  ropeUsed,
  scalingNote,
  turnedWidth,
} from "./positions.js";

const DEFAULT_EPS = 1e-6; // qk_norm's and v_norm's (variant_fields.py)
const TEMPERATURE = { floor_scale: 8192, attn_scale: 0.1, position_shift: 1 }; // TemperatureOptions' defaults

// ---- the chain's order (x-chain) and the cells a click explains

const SIDES = new Set(["q", "k", "v"]); // the slots of the queries, keys and values
// the slots of the score maps, the weights and the output (lib/arithmetic.js explains their cells)
const SCORED = new Set(["scores", "weights", "out"]);
// /multihead's output gate (Qwen3-Next), sigmoid(x W_g + b_g): not a step of the chain but what
// its step of kind "gated" multiplies the concat by
const GATE = "gate";
// what two steps keep besides the form they make (chain.py's Step.also, which x-chain does not
// carry): the position bias the step of kind "bias" adds (T5's, ALiBi's), and the share of each
// query's weight the sink takes in the softmax (gpt-oss)
export const POSITION_BIAS = "position_bias";
export const SINK_WEIGHTS = "sink_weights";
// explained besides the chain's steps: the position bias, and DeepSeek's MLA (layers/latent.js):
// the latents, the shared rope key, each head's rope queries
const OTHER_EXPLAINED = [POSITION_BIAS, "c_q", "c_kv", "k_rope", "q_rope"];

/** The request's qk_norm as an object ({} for `true`), or null when it is off. */
export function qkNormOptions(request) {
  const o = request.qk_norm;
  return o && typeof o === "object" ? o : o ? {} : null;
}

/** The chain's step that makes `name` (x-chain), or undefined (a projection, the gate). */
function stepOf(name) {
  return chainSteps().find((s) => s.name === name);
}

/** The slot (q, k, v, scores, weights, out, block) whose latest form the step `name` makes, by
 * the chain; undefined for a name the chain does not make (a projection, the gate). */
export function slotOf(name) {
  const step = stepOf(name);
  return step && step.advances;
}

/** What the step `name` does (clip, norm, rotate, temper, cache, scale, softcap, bias, mask,
 * softmax, output, gated, …), by the chain; undefined for a name the chain does not make. */
export function kindOf(name) {
  const step = stepOf(name);
  return step && step.kind;
}

/** The names of the steps made, in order: the answer's steps, or (an answer without them) the
 * chain's, a step the chain states at two places (qk_norm, before RoPE or after it) taken where
 * the request's qk_norm.after_rope puts it. */
function stepsMade(ctx) {
  const steps = ctx.data && ctx.data.steps;
  if (Array.isArray(steps)) return steps.map((s) => s.name);
  const after = !!(qkNormOptions(ctx.request) || {}).after_rope;
  const names = chainSteps().map((s) => s.name);
  return names.filter((n, at) => (after ? names.lastIndexOf(n) : names.indexOf(n)) === at);
}

/** The forms of `slot` in ctx's answer, in the order they were made: for the queries ("q"), keys
 * ("k") and values ("v") the projection, then each step made that advances the slot (the
 * cache aside); for the scores each map of the chain of scores. */
export function formsOf(ctx, slot) {
  const made = stepsMade(ctx).filter((n) => slotOf(n) === slot && kindOf(n) !== "cache");
  return SIDES.has(slot) ? [slot, ...made] : made;
}

/** The forms ctx's answer holds for its head and batch item, in order. */
export function heldForms(ctx, slot) {
  return formsOf(ctx, slot).filter((n) => pick(ctx, n) !== undefined);
}

/** The form the next step reads (the scores read q's and k's, the output v's): the last made. */
export function lastForm(ctx, side) {
  return heldForms(ctx, side).at(-1);
}

/** The form the step `name` (a norm, a rotation, a map of the scores, …) was made from: the one
 * made right before it, by the answer's steps; an answer without steps, the one before it of
 * those it holds (a step that was off holds nothing). */
export function formBefore(ctx, name) {
  const slot = slotOf(name);
  const forms = Array.isArray(ctx.data && ctx.data.steps)
    ? formsOf(ctx, slot)
    : heldForms(ctx, slot);
  const at = forms.indexOf(name);
  return at > 0 ? forms[at - 1] : undefined;
}

let layersOf = { steps: /** @type {any} */ (null), names: new Set() };
/** Today's layers: the chain's steps that advance the queries, keys or values (the cache
 * aside) or whose arithmetic CELLS holds (/multihead's gated), and the gate; each cell explained
 * from the form before it.
 * @returns {Set<string>} */
export function layerNames() {
  const steps = chainSteps();
  if (layersOf.steps !== steps) {
    const names = steps.filter(
      (s) => (SIDES.has(s.advances) && s.kind !== "cache") || s.kind in CELLS,
    );
    layersOf = { steps, names: new Set([...names.map((s) => s.name), GATE]) };
  }
  return layersOf.names;
}

/** Whether a click on a cell of output `name` explains it: the chain's score maps, weights and
 * output, the position bias, MLA's latents and today's layers. */
export function explains(name) {
  return SCORED.has(slotOf(name)) || OTHER_EXPLAINED.includes(name) || layerNames().has(name);
}

// ---- the norms

/** The norm of one vector (service/core/variants.py qk_norm): "rms" x / √(mean(x²) + eps),
 * "layer" (x − mean) / √(mean((x − mean)²) + eps); feature t times w_t, or 1 + w_t when
 * zero-centred, plus b_t with a bias (Phi's LayerNorm). `weight` and `bias` run along x. */
export function normOf(
  x,
  t,
  { type = "rms", eps = DEFAULT_EPS, weight = null, zeroCentered = false, bias = null },
) {
  const n = x.length;
  const mean = type === "rms" ? 0 : x.reduce((s, v) => s + v, 0) / n;
  const centred = type === "rms" ? x : x.map((v) => v - mean);
  const squares = centred.map((c) => c * c);
  const spread = squares.reduce((s, v) => s + v, 0) / n; // mean(x²), or the biased variance
  const denom = Math.sqrt(spread + eps);
  const normed = centred[t] / denom;
  const factor = weight === null ? null : zeroCentered ? 1 + weight[t] : weight[t];
  const scaled = factor === null ? normed : normed * factor;
  const b = bias === null ? null : bias[t];
  return {
    type,
    eps,
    mean,
    terms: x.map((v, k) => ({ t: k, x: v, c: centred[k], sq: squares[k] })),
    spread,
    denom,
    normed,
    w: weight === null ? null : weight[t],
    factor,
    zeroCentered,
    b,
    total: b === null ? scaled : scaled + b,
  };
}

/** The first array of `request` under `keys`, or null. */
function firstArray(request, keys) {
  const key = keys.find((k) => Array.isArray(request[k]));
  return key === undefined ? null : { key, a: request[key] };
}

/** qk_norm's weight of the queries (`side` "q") or keys ("k"), and the field it came from:
 * /multihead's q_norm.weight (or q_norm_weight) over qk_norm.q_weight, as
 * service/trace/rows/variants.py; null when none. */
function normArray(request, side, what) {
  const o = qkNormOptions(request) || {};
  const held = firstArray(request, [`${side}_norm.${what}`, `${side}_norm_${what}`]);
  if (held) return held;
  const own = o[`${side}_${what}`];
  return Array.isArray(own) ? { key: `qk_norm.${side}_${what}`, a: own } : null;
}

/** qk_norm's weight of the queries (`side` "q") or keys ("k"); null when none. */
export function normWeight(request, side) {
  const w = normArray(request, side, "weight");
  return w && w.a;
}

/** A weight or bias as rows of d_k, [h_w][d_k]: one row per head (Cohere, StableLM), a
 * projection's [h_w·d_k] cut in rows (OLMo 2), or a shared [d_k] as one row. */
function rowsOf(a, dk) {
  if (Array.isArray(a[0])) return a;
  return Array.from({ length: a.length / dk }, (_, g) => a.slice(g * dk, (g + 1) * dk));
}

/** The row of `rows` head `head` of `heads` takes: each row serves heads / rows.length heads
 * in a row (service/core/variants.py _along, as repeat_interleave; the keys come repeated to
 * the query heads). */
function rowIndex(rows, head, heads) {
  return Math.floor(head / (heads / rows.length));
}

/** Where the norm's eps came from: qk_norm.eps, or the config's key the answer's
 * conventions.config names ("config.rms_norm_eps", "config.rms_norm_eps (absent: …)"). */
function epsFrom(ctx) {
  const from = ctx.data.conventions?.config?.["qk_norm.eps"];
  return typeof from === "string" && from !== "request" ? `config.${from}` : "qk_norm.eps";
}

/** The norm's settings for `side`: the request's qk_norm (a config's as the service read it);
 * undefined when it is off or its weights are under another family's names. */
function normSettings(ctx, side) {
  const request = ctx.request;
  const stateless = ["q_layernorm", "k_layernorm", "query_layernorm", "key_layernorm"].some((p) =>
    Object.keys(request).some((key) => key.startsWith(p)),
  );
  if (stateless) return undefined; // Phi's, StableLM's, HunYuan's names: read by the service
  const weight = normArray(request, side, "weight");
  const bias = normArray(request, side, "bias");
  const o = qkNormOptions(request); // a config's as the service read it (lib/pick.js asRead)
  if (o) {
    return {
      type: o.type ?? "rms",
      eps: o.eps ?? DEFAULT_EPS,
      zeroCentered: !!o.zero_centered,
      over: o.over ?? "head",
      afterRope: !!o.after_rope,
      weight,
      bias,
      field: epsFrom(ctx),
    };
  }
  return undefined;
}

/** The projection's vector the norm of head `head`'s row r spans: over "head" the head's own
 * row; over "projection" the row of every head side by side (the keys' h_kv heads, each once),
 * with where head `head`'s features start. */
function normInput(ctx, from, r, over, side) {
  const own = pick(ctx, from)[r];
  if (over !== "projection") return { x: own, heads: null, start: 0 };
  const h = Number(ctx.data.num_heads);
  const hs = side === "k" ? Number(ctx.data.num_kv_heads ?? h) : h;
  const group = h / hs; // query heads per key head: heads[g·group] holds key head g
  const heads = Array.from({ length: hs }, (_, g) => g * group);
  const x = heads.flatMap((hh) => pick({ ...ctx, head: hh }, from)[r]);
  return { x, heads, start: Math.floor(ctx.head / group) * own.length };
}

/** A weight or bias laid along the vector the norm spans (per feature of x), and the entry
 * feature t of head `head` takes: [row, t] of rows per head, or the index of a flat array. */
function along(given, ctx, dk, input) {
  if (given === null) return { a: null, entry: null };
  const rows = rowsOf(given.a, dk);
  const h = Number(ctx.data.num_heads ?? 1);
  const heads = input.heads ?? [ctx.head ?? 0];
  const a = heads.flatMap((hh) => rows[rowIndex(rows, hh, h)]);
  const row = rowIndex(rows, ctx.head ?? 0, h);
  const perHead = Array.isArray(given.a[0]);
  const shared = !perHead && given.a.length === dk;
  return { a, entry: { key: given.key, row, perHead, shared } };
}

/** What the norm `name` of row r reads (its backward reads it too, lib/backward.js): the side,
 * the form before, the settings, the vector it spans (input), its weight and bias along that
 * vector; v_norm's (weightless, "rms") with s.over "head"; undefined when the page cannot tell. */
export function normParts(ctx, name, r) {
  const side = slotOf(name);
  const from = formBefore(ctx, name); // the projection, or the form a step before made
  const dk = pick(ctx, from)[r].length;
  if (side === "v") {
    const o =
      ctx.request.v_norm && typeof ctx.request.v_norm === "object" ? ctx.request.v_norm : {};
    const s = {
      type: "rms",
      eps: o.eps ?? DEFAULT_EPS,
      zeroCentered: false,
      over: "head",
      afterRope: false,
      field: "v_norm.eps",
    };
    const input = { x: pick(ctx, from)[r], heads: null, start: 0 };
    return { side, from, dk, s, input, w: { a: null, entry: null }, b: { a: null, entry: null } };
  }
  const s = normSettings(ctx, side);
  if (s === undefined) return undefined;
  const input = normInput(ctx, from, r, s.over, side);
  const w = along(s.weight, ctx, dk, input);
  const b = along(s.bias, ctx, dk, input);
  return { side, from, dk, s, input, w, b };
}

function normCell(ctx, name, r, t) {
  const parts = normParts(ctx, name, r);
  if (parts === undefined) return undefined;
  const { side, from, dk, s, input, w, b } = parts;
  if (side === "v") return { kind: "norm", from, side, ...normOf(input.x, t, { eps: s.eps }) };
  const at = input.start + t; // feature t of the head within the vector the norm spans
  const settings = { type: s.type, eps: s.eps, zeroCentered: s.zeroCentered };
  return {
    kind: "norm",
    from,
    side,
    afterRope: s.afterRope,
    over: s.over,
    heads: input.heads,
    at,
    dk,
    epsField: s.field,
    weightEntry: w.entry,
    biasEntry: b.entry,
    ...normOf(input.x, at, { ...settings, weight: w.a, bias: b.a }),
  };
}

// ---- RoPE, one feature

function rotateCell(ctx, name, r, t) {
  const side = slotOf(name);
  const from = formBefore(ctx, name);
  const x = pick(ctx, from)[r];
  const used = ropeUsed(ctx);
  if (used === undefined) return undefined;
  const settings = ropeSettings(ctx.request, x.length);
  const { theta, gain, n } = used; // as the service turned the rows (rope_frequencies, rope_gain)
  const rows = pick(ctx, from).length;
  const pos = side === "q" ? queryPosition(ctx, r) : keyRowPosition(ctx, r, rows);
  const angles = ropeAngles(settings, theta, pos);
  const width = turnedWidth(settings);
  const pairs = theta.map((_, k) => pairFeatures(settings.style, width, k));
  const pair = pairs.findIndex(([f, g]) => f === t || g === t);
  const at = anglePosition(settings, pos); // the position the angles take
  const base = { kind: "rotate", from, side, settings, n, pos, at, theta, angles, pairs, gain };
  const about = {
    scaled: pairScalings(settings, theta, n),
    scalingNote: scalingNote(settings, n, gain),
  };
  if (pair < 0) return { ...base, ...about, pair, a: x[t], total: x[t] }; // past rotary_dim
  const [f, g] = pairs[pair];
  const phi = angles[pair];
  const c = Math.cos(phi) * gain,
    s = Math.sin(phi) * gain;
  const a = x[f],
    b = x[g];
  const first = t === f;
  return {
    ...base,
    ...about,
    pair,
    f,
    g,
    first,
    a,
    b,
    phi,
    c,
    s,
    total: first ? a * c - b * s : b * c + a * s,
  };
}

// ---- OLMo's clip_qkv

/** Cell [r][t] of a form of kind clip (q's, k's, v's): the projection's number clamped to
 * [−c, c] (service/core/variants.py clip; transformers' OlmoAttention clamp_). */
function clipCell(ctx, name, r, t) {
  const from = formBefore(ctx, name);
  const before = pick(ctx, from)[r][t];
  const c = Number(ctx.request.clip_qkv);
  return { kind: "clip", from, before, c, total: Math.min(Math.max(before, -c), c) };
}

// ---- Llama 4's temperature

/** The temperature of the query at position p: log(⌊(p + shift)/floor_scale⌋ + 1) · attn_scale + 1,
 * shift 1 as Llama 4, 0 as Ministral 3 (service/core/variants.py temperature_factors, with log1p
 * as NumPy's). */
export function temperatureOf(request, p) {
  const {
    floor_scale: floor,
    attn_scale: slope,
    position_shift: shift,
  } = { ...TEMPERATURE, ...request.temperature };
  const ratio = (p + shift) / floor;
  const steps = Math.floor(ratio);
  const log = Math.log1p(steps);
  return { floor, slope, shift, p, ratio, steps, log, factor: log * slope + 1 };
}

function temperCell(ctx, name, r, t) {
  const from = formBefore(ctx, name);
  const before = pick(ctx, from)[r][t];
  const temp = temperatureOf(ctx.request, queryPosition(ctx, r));
  return { kind: "temper", from, before, ...temp, total: before * temp.factor };
}

// ---- Qwen3-Next's output gate

/** The gate's weights W_g [h·d_v][d_model] (out_in) and bias, and where row c comes from: the
 * request's gate.w, or (`gate: true`) q_proj.weight's rows, each head's query rows then its gate
 * rows (service/trace/fold.py). */
export function gateWeights(ctx) {
  const g = ctx.request.gate;
  if (g && typeof g === "object") return { w: g.w, b: g.b ?? null, row: (c) => c, field: "gate" };
  const q = ctx.request["q_proj.weight"] ?? ctx.request.q_proj_weight;
  const bias = ctx.request["q_proj.bias"] ?? ctx.request.q_proj_bias ?? null;
  if (g !== true || !Array.isArray(q)) return undefined;
  const h = Number(ctx.data.num_heads ?? ctx.request.num_heads);
  const d = q.length / (2 * h);
  const row = (c) => Math.floor(c / d) * 2 * d + d + (c % d); // head ⌊c/d⌋'s gate row c mod d
  const width = h * d;
  const rows = Array.from({ length: width }, (_, c) => row(c));
  return {
    w: rows.map((k) => q[k]),
    b: bias ? rows.map((k) => bias[k]) : null,
    row,
    field: "q_proj",
    d,
  };
}

/** The rows the gate reads: x after positional encoding (x_in) when the answer has it, else the
 * generated x, else the request's x. */
function gateInput(ctx) {
  const held = pick(ctx, "x_in") ?? pick(ctx, "x");
  if (held !== undefined) return { x: held, name: pick(ctx, "x_in") ? "x_in" : "x" };
  let x = ctx.request.x;
  if (Array.isArray(x) && Array.isArray(x[0]) && Array.isArray(x[0][0])) x = x[ctx.batch ?? 0];
  return { x, name: "x" };
}

/** Cell [i][c] of the gate: sigmoid(x[i] · W_g[c] + b_g[c]). */
function gateCell(ctx, name, i, c) {
  const weights = gateWeights(ctx);
  const { x, name: xName } = gateInput(ctx);
  const wRow = weights.w[c];
  const terms = x[i].map((xt, t) => ({ t, x: xt, w: wRow[t], value: xt * wRow[t] }));
  const dot = terms.reduce((s, term) => s + term.value, 0);
  const bias = weights.b ? weights.b[c] : null;
  const z = dot + (bias ?? 0);
  const e = Math.exp(-z);
  return {
    kind: "gate",
    xName,
    terms,
    dot,
    bias,
    z,
    e,
    source: weights.field,
    sourceRow: weights.row(c),
    total: 1 / (1 + e),
  };
}

/** Cell [i][c] of the step of kind "gated": the form before it (the concat) times the gate. */
function gatedCell(ctx, name, i, c) {
  const from = formBefore(ctx, name);
  const before = pick(ctx, from)[i][c],
    gate = pick(ctx, GATE)[i][c];
  return { kind: "gated", from, concat: before, gate, total: before * gate };
}

// each layer's arithmetic, by the kind of the step that makes the form (x-chain)
const CELLS = {
  clip: clipCell,
  norm: normCell,
  rotate: rotateCell,
  temper: temperCell,
  gated: gatedCell,
};

/** Cell [i][j] of one of today's layers (layerNames) computed again: {kind, total, …} (a shape
 * per kind), or undefined for a layer whose arithmetic the page does not know.
 * @returns {any} */
export function layerCell(given, name, i, j) {
  const ctx = asRead(given); // a config's fields as the service read them
  const cell = name === GATE ? gateCell : CELLS[kindOf(name)];
  return cell && cell(ctx, name, i, j);
}
