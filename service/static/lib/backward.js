// @ts-check
// The arithmetic of a gradient cell's explanation (backward-explain.js draws it), a leaf: the
// clicked cell of grad_<name> computed again in float64 from the gradient of the step after
// <name> (the backward runs the forward's steps in reverse) and the forward's arrays, as the
// service's backward does (service/core/backward.py; API "The backward pass, every step"):
//   dO      grad_output as given ("sum": 1); a /multihead head's, grad_concat's columns of it
//   dP      grad_weights[i][j] = Σ_c dO[i][c] · V[j][c]   (V: the values the output read)
//   D       row_dot[i] = Σ_c dO[i][c] · O[i][c]
//   dS      the last score before the softmax: P[i][j] · (dP[i][j] − D[i]); 0 on a row that
//           fully_masked_rows "uniform" filled (its weights do not depend on the scores)
//   back through the score steps by their kind (x-chain): mask and bias add constants (the same
//           number), the softcap · (1 − tanh²(x/c)), the scale · s (grad_scores = dS · s)
//   dQ      the queries the scores read: Σ_j grad_scores[i][j] · K[j][t]
//   dK      the keys the scores read:    Σ_i grad_scores[i][j] · Q[i][t]
//   dV      the values the output read:  Σ_i P[i][j] · dO[i][c]
//   back through RoPE (the rotation's transpose: turned back by −φ, cos and sin times the gain)
//   and the temperature (· τ(p)); the q/k norms and v_norm ((g − mean g − x̂ · mean(g x̂)) / σ,
//   g = w · grad, mean g for a layer norm only) and the clamp (passed where |x| ≤ c, else 0);
//   with `past` the keys' and values' new rows (the scores' columns after the cache's P), the
//   cache's own (grad_past_k, grad_past_v: the columns before), RoPE at the shifted positions
//   (query_positions, key_positions' last rows: P … P + L − 1 unless given);
//   the q/k norms' weights and biases: Σ grad_<normed> · x̂ and Σ grad_<normed> over the rows,
//   batch items and the heads a weight row serves;
//   /multihead's gradients per key/value head (grad_k, grad_v under grouped-query heads, the
//   cache's): the sum of its query heads' copies (a norm's: the query heads' gradients summed,
//   then back through the norm, over the head or the key projection).
// /multihead's block (W_o, the gate's product, the residual, the layer norm) and the projections
// are lib/backward-block.js's. Not computed (the cell is "unexplained": the page shows the
// service's number and step): a batched request's per key/value head arrays. MLA's are
// lib/backward-latent.js's.
import { asRead, pick } from "./pick.js";
import { BLOCK, blockCell, projectionCell } from "./backward-block.js";
import { latentGradCell, latentOwns } from "./backward-latent.js";
import { SCORE_PARAMS, scoreParamCell } from "./backward-scores.js";
import { GRAD_PREFIX, PER_KV } from "./schema.js";
import { formsOf, kindOf, lastForm, normOf, normParts, slotOf, temperatureOf } from "./layers.js";
import {
  keyRowPosition,
  pairFeatures,
  queryPosition,
  ropeAngles,
  ropeSettings,
  ropeUsed,
  rotate,
  turnedWidth,
} from "./positions.js";

const SIDES = new Set(["q", "k", "v"]);

/** Whether `name` is a gradient's (grad_ + the name of the array it is the gradient of). */
export const isGradient = (name) => typeof name === "string" && name.startsWith(GRAD_PREFIX);
/** The array `grad` is the gradient of. */
export const forwardOf = (grad) => grad.slice(GRAD_PREFIX.length);

const slotFor = (name) => (SIDES.has(name) ? name : slotOf(name));

/** The form of the same slot made right after `name` (the step its gradient comes back from). */
export function formAfter(ctx, name) {
  const slot = slotFor(name);
  if (slot === undefined) return undefined;
  const forms = formsOf(ctx, slot);
  const at = forms.indexOf(name);
  return at >= 0 && at + 1 < forms.length ? forms[at + 1] : undefined;
}

// the cache /multihead keeps per key/value head (present_k, present_v: [h_kv][P + L][·])
const CACHES = new Set(["present_k", "present_v"]);

/** Query heads per key/value head (1 without grouped-query heads, and on /attention). */
function groupOf(ctx) {
  const h = Number(ctx.data.num_heads ?? 1);
  return h / (Number(ctx.data.num_kv_heads ?? h) || h);
}

/** Array `name` for the clicked head; the cache's, of the key/value head a query head reads. */
function cacheOf(ctx, name) {
  if (!CACHES.has(name) || ctx.endpoint !== "multihead" || ctx.head == null) return pick(ctx, name);
  return pick({ ...ctx, head: Math.floor(ctx.head / groupOf(ctx)) }, name);
}

const dot = (a, b) => a.reduce((s, x, k) => s + x * b[k], 0);
const column = (m, c) => m.map((row) => row[c]);

/** dO[i][c]: as given, 1 for "sum", or (a /multihead head's) grad_concat's column h·d_v + c. */
function dOCell(ctx, i, c) {
  if (ctx.endpoint === "multihead" && ctx.head !== null && ctx.head !== undefined) {
    const concat = pick({ ...ctx, head: null }, "grad_concat");
    const dv = pick(ctx, "output")[0].length;
    if (!Array.isArray(concat)) return undefined;
    const col = ctx.head * dv + c;
    return { kind: "dO", share: { col, dv }, total: concat[i][col] };
  }
  const given = ctx.request.grad_output;
  if (given === "sum") return { kind: "dO", sum: true, total: 1 };
  if (!Array.isArray(given)) return undefined;
  const a = Array.isArray(given[0][0]) ? given[ctx.batch ?? 0] : given;
  return { kind: "dO", total: a[i][c] };
}

/** dP[i][j] = Σ_c dO[i][c] · V[j][c]. */
function dPCell(ctx, i, j) {
  const cache = ctx.request.past && cacheOf(ctx, "present_v") ? "present_v" : undefined;
  const vName = cache ?? lastForm(ctx, "v"); // with `past`, the cache's values and the new ones
  const v = cache ? cacheOf(ctx, cache) : pick(ctx, vName),
    dO = pick(ctx, "grad_output");
  if (!v || !dO || !v[j]) return undefined;
  const terms = dO[i].map((g, c) => ({ c, a: g, b: v[j][c], value: g * v[j][c] }));
  return { kind: "dP", vName, terms, total: terms.reduce((s, x) => s + x.value, 0) };
}

/** D[i] = Σ_c dO[i][c] · O[i][c], its terms, and the service's row_dot[i]. */
export function rowDot(ctx, i) {
  const dO = pick(ctx, "grad_output"),
    o = pick(ctx, "output");
  const terms = dO[i].map((g, c) => ({ c, a: g, b: o[i][c], value: g * o[i][c] }));
  const said = pick(ctx, "row_dot", 1);
  return {
    terms,
    total: terms.reduce((s, x) => s + x.value, 0),
    service: Array.isArray(said) ? said[i] : undefined,
  };
}

/** dS[i][j] = P[i][j] · (dP[i][j] − D[i]). */
function dSCell(ctx, name, i, j) {
  const p = pick(ctx, "weights"),
    dP = pick(ctx, "grad_weights");
  if (!p || !dP) return undefined;
  const D = rowDot(ctx, i);
  const row = pick(ctx, name)[i];
  const filled = ctx.request.fully_masked_rows === "uniform" && row.every((x) => x === null);
  const total = filled ? 0 : p[i][j] * (dP[i][j] - D.total);
  return { kind: "dS", p: p[i][j], dp: dP[i][j], D, masked: row[j] === null, filled, total };
}

// back through a step of the scores, by its kind: the factor on the next gradient
const SCORE_BACK = {
  scale: (ctx) => ({ factor: Number(ctx.data.scale), why: "scale" }),
  softcap: (ctx, name, i, j) => {
    const x = pick(ctx, name)[i][j];
    const c = Number(ctx.request.softcap);
    const t = Math.tanh(x / c);
    return { factor: 1 - t * t, why: "softcap", x, c, t };
  },
  bias: () => ({ factor: 1, why: "constant" }),
  mask: () => ({ factor: 1, why: "constant" }),
};

/** A score's gradient from the next score's: grad_next[i][j] times the step's factor. */
function scoreBackCell(ctx, name, i, j) {
  const next = formAfter(ctx, name);
  const back = next && SCORE_BACK[kindOf(next)];
  const g = next && pick(ctx, GRAD_PREFIX + next);
  if (!back || !g) return undefined;
  const step = back(ctx, name, i, j);
  return { kind: "score-back", next, nextKind: kindOf(next), g: g[i][j], ...step };
}

/** The gradient of the scores' first form (grad_scores = dS · scale): what dQ and dK read. */
function gradScores(ctx) {
  const first = formsOf(ctx, "scores")[0];
  return { name: GRAD_PREFIX + first, m: pick(ctx, GRAD_PREFIX + first) };
}

/** dQ[i][t] = Σ_j grad_scores[i][j] · K[j][t]. */
function dQCell(ctx, i, t) {
  const gs = gradScores(ctx);
  const cache = ctx.request.past && cacheOf(ctx, "present_k") ? "present_k" : undefined;
  const kName = cache ?? lastForm(ctx, "k"); // with `past`, the cache's keys and the new ones
  const k = cacheOf(ctx, kName);
  if (!gs.m || !k || k.length !== gs.m[i].length) return undefined;
  const terms = gs.m[i].map((g, j) => ({ c: j, a: g, b: k[j][t], value: g * k[j][t] }));
  return { kind: "dQ", gs: gs.name, other: kName, terms, total: sum(terms) };
}

/** dK[j][t] = Σ_i grad_scores[i][j] · Q[i][t]. */
function dKCell(ctx, j, t) {
  const gs = gradScores(ctx);
  const qName = lastForm(ctx, "q");
  const q = pick(ctx, qName);
  const cached = pastRows(ctx, "k", gs.m && gs.m[0].length);
  if (!gs.m || !q || cached === undefined) return undefined;
  const col = cached + j; // with a cache, key j of the new tokens is the keys' row P + j
  const terms = column(gs.m, col).map((g, i) => ({ c: i, a: g, b: q[i][t], value: g * q[i][t] }));
  return { kind: "dK", gs: gs.name, other: qName, cached, col, terms, total: sum(terms) };
}

/** dV[j][c] = Σ_i P[i][j] · dO[i][c]. */
function dVCell(ctx, j, c) {
  const p = pick(ctx, "weights"),
    dO = pick(ctx, "grad_output");
  const cached = pastRows(ctx, "v", p && p[0].length);
  if (!p || !dO || cached === undefined) return undefined;
  const col = cached + j;
  const terms = column(p, col).map((w, i) => ({ c: i, a: w, b: dO[i][c], value: w * dO[i][c] }));
  return { kind: "dV", cached, col, terms, total: sum(terms) };
}

/** The cache's rows before the new tokens' (P: the keys the scores read less the new rows of
 * `side`'s last form), 0 without `past`; undefined when the rows do not add up. */
function pastRows(ctx, side, keys) {
  const here = pick(ctx, lastForm(ctx, side) ?? side);
  if (!Array.isArray(here) || typeof keys !== "number") return undefined;
  const cached = keys - here.length;
  if (ctx.request.past) return cached >= 0 ? cached : undefined;
  return cached === 0 ? 0 : undefined;
}

/** Back through the norm `next` (qk_norm, v_norm) at [r][t], over the vector v it spans:
 * g = f · grad_next (f = w, 1 + w zero-centred, or 1), dx = (g − mean(g) − x̂ · mean(g x̂)) / σ,
 * mean(g) only for "layer" (lib/layers.js normParts and normOf give v, f, x̂ and σ). With `kv`
 * (/multihead's key/value head kv under grouped-query heads) grad_next is its query heads'
 * copies' summed: the norm ran on the keys repeated to the query heads, whose σ and mean are
 * the key head's, so the copies' gradients add before the norm's backward. */
function normBackCell(ctx, next, r, t, kv = null) {
  const group = kv === null ? 1 : groupOf(ctx);
  const at0 = kv === null ? ctx : { ...ctx, head: kv * group };
  const parts = normParts(at0, next, r);
  if (parts === undefined) return undefined;
  const { s, input, w } = parts;
  const grouped = parts.side === "k" && kv === null && groupOf(ctx) > 1;
  if (input.heads !== null && grouped) return undefined; // a key head's: asked with kv
  const gy = incoming(ctx, next, r, input, kv === null ? at0.head : kv, group);
  if (!Array.isArray(gy) || gy.length !== input.x.length) return undefined;
  const n = normOf(input.x, 0, { type: s.type, eps: s.eps });
  const factor = (k) => (w.a === null ? 1 : s.zeroCentered ? 1 + w.a[k] : w.a[k]);
  const terms = gy.map((d, k) => {
    const xhat = n.terms[k].c / n.denom;
    const g = factor(k) * d;
    return { c: k, a: d, gamma: factor(k), g, xhat, value: g * xhat };
  });
  const at = input.start + t;
  const meanG = s.type === "layer" ? terms.reduce((m, x) => m + x.g, 0) / terms.length : 0;
  const meanGX = sum(terms) / terms.length;
  const x = terms[at];
  const total = (x.g - meanG - x.xhat * meanGX) / n.denom;
  return {
    kind: kv === null ? "norm-back" : "norm-back-kv",
    next,
    type: s.type,
    eps: s.eps,
    zeroCentered: s.zeroCentered,
    weighted: w.a !== null,
    over: s.over,
    at,
    terms,
    meanG,
    meanGX,
    sigma: n.denom,
    mean: n.mean,
    g: x.g,
    xt: x.xhat,
    kv,
    heads: kv === null ? null : range(group).map((o) => kv * group + o),
    total,
  };
}

/** grad_next's row r along the vector the norm spans (one head's row, or every head's side by
 * side); with a key/value head (`group` > 1 query heads per head), each of its query heads'
 * copies summed. */
function incoming(ctx, next, r, input, head, group) {
  const grad = (hh) => pick(hh === null ? ctx : { ...ctx, head: hh }, GRAD_PREFIX + next);
  const rowOf = (hh) => {
    const copies = range(group).map((o) => grad(hh === null ? null : hh * group + o));
    if (copies.some((g) => !Array.isArray(g))) return undefined;
    return copies[0][r].map((_, k) => copies.reduce((m, g) => m + g[r][k], 0));
  };
  if (group === 1)
    return input.heads === null ? grad(head)?.[r] : input.heads.flatMap((hh) => grad(hh)[r]);
  if (input.heads === null) return rowOf(head);
  const kvHeads = input.heads.map((hh) => hh / group); // heads[g·group] holds key head g
  const rows = kvHeads.map(rowOf);
  return rows.some((x) => x === undefined) ? undefined : rows.flat();
}

const range = (n) => Array.from({ length: n }, (_, k) => k);

/** Back through the clamp `next` (clip_qkv) at [r][t]: grad_next where |x| ≤ c, else 0. */
function clipBackCell(ctx, of, next, r, t) {
  const g = pick(ctx, GRAD_PREFIX + next),
    x = pick(ctx, of);
  if (!g || !x) return undefined;
  const c = Number(ctx.request.clip_qkv);
  const before = x[r][t];
  const passed = Math.abs(before) <= c;
  return { kind: "clip-back", next, c, before, passed, g: g[r][t], total: passed ? g[r][t] : 0 };
}

const sum = (terms) => terms.reduce((s, x) => s + x.value, 0);

/** Back through RoPE: row r of the next gradient turned back by −φ (cos and sin × the gain). */
function ropeBackCell(ctx, name, next, r, t) {
  const g = pick(ctx, GRAD_PREFIX + next);
  const used = ropeUsed(ctx);
  if (!g || used === undefined) return undefined; // with `past`: the shifted positions
  const side = slotFor(name);
  const row = g[r];
  const settings = ropeSettings(ctx.request, row.length);
  const pos = side === "q" ? queryPosition(ctx, r) : keyRowPosition(ctx, r, g.length);
  const angles = ropeAngles(settings, used.theta, pos);
  const back = rotate(
    row,
    angles.map((a) => -a),
    settings,
    used.gain,
  );
  const width = turnedWidth(settings);
  const pairs = used.theta.map((_, n) => pairFeatures(settings.style, width, n));
  const pair = pairs.findIndex(([f, h]) => f === t || h === t);
  const out = { kind: "rope-back", next, side, pos, total: back[t], pair, gain: used.gain };
  if (pair < 0) return { ...out, a: row[t] };
  const [f, h] = pairs[pair];
  const phi = angles[pair];
  return {
    ...out,
    f,
    h,
    first: t === f,
    a: row[f],
    b: row[h],
    phi,
    c: Math.cos(phi) * used.gain,
    s: Math.sin(phi) * used.gain,
  };
}

/** Back through the temperature: the next gradient times τ(p) of the query's position. */
function temperBackCell(ctx, next, r, t) {
  const g = pick(ctx, GRAD_PREFIX + next);
  if (!g) return undefined;
  const temp = temperatureOf(ctx.request, queryPosition(ctx, r));
  return { kind: "temper-back", next, g: g[r][t], factor: temp.factor, p: temp.p };
}

/** The cache's own rows (grad_past_k, grad_past_v: the cache step hands them its gradient's
 * first P rows): key j of the cache is the scores' column j, so
 * grad_past_k[j][t] = Σ_i grad_scores[i][j] · Q[i][t], grad_past_v[j][c] = Σ_i P[i][j] · dO[i][c]. */
function pastCell(ctx, side, j, t) {
  const k = side === "k";
  const gs = gradScores(ctx);
  const by = k ? gs.m : pick(ctx, "weights");
  const other = k ? lastForm(ctx, "q") : "dO";
  const with_ = k ? pick(ctx, other) : pick(ctx, "grad_output");
  const cached = pastRows(ctx, side, by && by[0].length);
  if (!by || !with_ || cached === undefined || j >= cached) return undefined;
  const terms = column(by, j).map((a, i) => ({ c: i, a, b: with_[i][t], value: a * with_[i][t] }));
  return { kind: "past-back", side, gs: gs.name, other, cached, terms, total: sum(terms) };
}

/** A gradient /multihead keeps per key/value head at its top level (PER_KV; [h_kv][rows][·],
 * batched [B][h_kv]…; the key/value head ctx.kv): the sum of the copies its query heads read
 * (repeat_kv's transpose); a norm's backward is taken once, on the copies' gradients summed. */
function kvSummedCell(ctx, of, i, j) {
  const all = ctx.data[GRAD_PREFIX + of];
  if (!Array.isArray(all)) return undefined;
  const batched = Array.isArray(all[0]?.[0]?.[0]);
  const kv = ctx.kv ?? 0;
  const b = batched ? (ctx.batch ?? 0) : null; // the batch item the cell is of
  const group = groupOf(ctx);
  const at = { ...ctx, batch: b, kv: null };
  const next = formAfter({ ...at, head: kv * group }, of);
  if (next && kindOf(next) === "norm") return normBackCell(at, next, i, j, kv);
  const heads = range(group).map((o) => kv * group + o);
  const parts = heads.map((hh) => {
    const cell = computeCell({ ...at, head: hh }, of, i, j);
    return cell && { name: GRAD_PREFIX + of, of, head: hh, ...cell };
  });
  if (parts.some((x) => x === undefined || typeof x.total !== "number")) return undefined;
  if (group === 1) return parts[0]; // one query head per key/value head: its own, at the top level
  return { kind: "kv-sum", kv, heads, parts, total: parts.reduce((m, x) => m + x.total, 0) };
}

/** The gradient of a q/k norm's weight (or bias) at [i][j] (a flat weight's [j]): Σ over the
 * batch items, the heads its row serves and their rows of grad_<normed>[r][t] · x̂[r][t] (the
 * bias's: grad_<normed>[r][t]), x̂ the normalised vector before the weight (normParts, normOf). */
function normParamCell(ctx, side, what, i, j) {
  const grad = ctx.data[GRAD_PREFIX + `${side}_norm_${what}`];
  const named = formsOf(ctx, side).find((n) => kindOf(n) === "norm");
  const dk = Number(ctx.data.d_k);
  if (!named || !Array.isArray(grad) || !(dk > 0)) return undefined;
  const flat = !Array.isArray(grad[0]);
  const [row, t] = flat ? [Math.floor(j / dk), j % dk] : [i, j];
  const rows = flat ? grad.length / dk : grad.length;
  const h = ctx.endpoint === "multihead" ? Number(ctx.data.num_heads) : 1;
  const heads = ctx.endpoint === "multihead" ? range(h) : [null];
  const served = heads.filter((hh) => hh === null || Math.floor(hh / (h / rows)) === row);
  const terms = [];
  let zeroCentered = false;
  for (const hh of served) {
    const one = { ...ctx, head: hh, batch: null };
    const made = pick(one, named, 3);
    if (!Array.isArray(made)) return undefined;
    const items = Array.isArray(made[0][0]) ? range(made.length) : [null];
    for (const b of items) {
      const here = { ...one, batch: b };
      const g = pick(here, GRAD_PREFIX + named);
      if (!Array.isArray(g)) return undefined;
      for (let r = 0; r < g.length; r++) {
        const parts = normParts(here, named, r);
        if (parts === undefined) return undefined;
        zeroCentered = parts.s.zeroCentered;
        const n = normOf(parts.input.x, 0, { type: parts.s.type, eps: parts.s.eps });
        const xhat = n.terms[parts.input.start + t].c / n.denom;
        const a = g[r][t];
        const value = what === "weight" ? a * xhat : a;
        terms.push({ item: b, head: hh, c: r, a, b: xhat, value });
      }
    }
  }
  return {
    kind: "norm-param-back",
    side,
    what,
    named,
    row,
    t,
    flat,
    rows,
    zeroCentered,
    terms,
    total: sum(terms),
  };
}

/** The step the service states for gradient `grad` (its formula), or undefined. */
export function stepOfGradient(ctx, grad) {
  const step = (ctx.data.steps || []).find((s) => s.name === grad);
  return step && String(step.formula);
}

/** The clicked gradient cell computed again: {name, of, kind, total, service, …}; kind
 * "unexplained" (total undefined) for a gradient the page does not compute; null when the
 * answer does not hold the cell. */
export function gradientCell(given) {
  const ctx = asRead(given); // a config's fields as the service read them
  const { name, i, j } = ctx;
  if (!isGradient(name)) return null;
  const held = pick(ctx, name);
  // a number (/attention's grad_sinks) is the one cell [0][0] of a row of one
  const here = typeof held === "number" ? [held] : held;
  if (!Array.isArray(here)) return null;
  const flat = typeof here[0] === "number"; // a bias's or a norm's weight's gradient: one row
  if (flat ? i !== 0 || here[j] === undefined : !Array.isArray(here[i])) return null;
  const of = forwardOf(name);
  const service = flat ? here[j] : here[i][j];
  const base = { name, of, service, step: stepOfGradient(ctx, name) };
  const cell = computeCell(ctx, of, i, j);
  return cell === undefined
    ? { ...base, kind: "unexplained", total: undefined }
    : { ...base, ...cell };
}

const NORM_PARAM = /^([qk])_norm_(weight|bias)$/;

/** k_eq_v with k given per head: the values are that k, so it is read twice (/multihead). */
const keysReadTwice = (ctx) =>
  ctx.endpoint === "multihead" && ctx.request.k_eq_v === true && ctx.request.x === undefined;

/** The given k's gradient under k_eq_v: the keys' read (through the chain to the scores) plus
 * the values' read (grad_v's cell), as the service sums them. */
function readTwiceCell(ctx, i, j) {
  const once = { ...ctx, keyRead: true };
  const keys = computeCell(once, "k", i, j),
    values = computeCell(once, "v", i, j);
  if (typeof keys?.total !== "number" || typeof values?.total !== "number") return undefined;
  return { kind: "k-eq-v", keys, values, total: keys.total + values.total };
}

function computeCell(ctx, of, i, j) {
  if (of === "output") return dOCell(ctx, i, j);
  if (of === "k" && keysReadTwice(ctx) && ctx.keyRead !== true) return readTwiceCell(ctx, i, j);
  if (latentOwns(ctx, of)) return latentGradCell(ctx, of, i, j); // MLA: lib/backward-latent.js
  const topKv = ctx.endpoint === "multihead" && ctx.head == null && PER_KV.has(of);
  if (topKv && Array.isArray(ctx.data[GRAD_PREFIX + of])) return kvSummedCell(ctx, of, i, j);
  if (of === "past_k" || of === "past_v") return pastCell(ctx, of.slice(-1), i, j);
  const param = NORM_PARAM.exec(of);
  if (param) return normParamCell(ctx, param[1], param[2], i, j);
  if (BLOCK.includes(of)) return blockCell(ctx, of, i, j); // /multihead's block
  if (SCORE_PARAMS.has(of)) return scoreParamCell(ctx, of, i, j); // the sinks', T5's table
  const projected = projectionCell(ctx, of, i, j); // x, the weights and biases, the norm's γ, β
  if (projected) return projected;
  const kind = kindOf(of);
  if (kind === "softmax") return dPCell(ctx, i, j);
  if (slotOf(of) === "scores") {
    const scores = formsOf(ctx, "scores");
    if (scores.at(-1) === of) return dSCell(ctx, of, i, j);
    const back = scoreBackCell(ctx, of, i, j);
    return back && { ...back, total: back.g * back.factor };
  }
  if (of === lastForm(ctx, "q")) return dQCell(ctx, i, j);
  if (of === lastForm(ctx, "k")) return dKCell(ctx, i, j);
  if (of === lastForm(ctx, "v")) return dVCell(ctx, i, j);
  const next = formAfter(ctx, of);
  if (!next) return undefined;
  if (kindOf(next) === "norm") return normBackCell(ctx, next, i, j);
  if (kindOf(next) === "clip") return clipBackCell(ctx, of, next, i, j);
  if (slotFor(of) === "v") return undefined;
  if (kindOf(next) === "rotate") return ropeBackCell(ctx, of, next, i, j);
  if (kindOf(next) === "temper") {
    const back = temperBackCell(ctx, next, i, j);
    return back && { ...back, total: back.g * back.factor };
  }
  return undefined;
}
