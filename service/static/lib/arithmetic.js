// @ts-check
// The arithmetic of a cell's explanation (explain.js draws it), a leaf: the clicked cell computed
// again from the step before, in float64 as the service does (dot products, scale, softcap,
// position bias, mask, softmax with a sink, the weighted sum of V), with RoPE's and ALiBi's
// numbers as the answer carries them (positions.js); the cells of today's layers (norms, a
// rotated feature, the temperature, the gate) are layers.js's. The steps' order is the OpenAPI
// document's (schema.js: scoreChain, and x-chain for the forms of q, k and v), so the document
// is loaded before this module is ready.
import { loadSpec } from "./state.js";
import { scoreChain } from "./schema.js";
import { NEG_INF, num, pick } from "./pick.js";
import { explains, formBefore, heldForms, lastForm, layerCell, layerNames } from "./layers.js";
import {
  alibiBias,
  alibiSlope,
  keyRowPosition,
  pairScalings,
  queryPosition,
  relativePosition,
  ropeAngles,
  ropeSettings,
  ropeUsed,
  rotate,
  scalingNote,
} from "./positions.js";

await loadSpec(); // the chains (of score maps: stepFrom; of a head's forms: lib/layers.js)

// a response's arrays for the clicked cell (lib/pick.js), as this module has always offered them
export { NEG_INF, num, pick };
// which outputs' cells explain themselves (lib/layers.js, where they are listed once)
export { explains };

/** The q and k a score was computed from: the last form each took (lib/layers.js), and every
 * form the queries took, in order. */
export function scoreInputs(ctx) {
  const qName = lastForm(ctx, "q"),
    kName = lastForm(ctx, "k");
  if (qName === undefined || kName === undefined) return undefined;
  return { q: pick(ctx, qName), k: pick(ctx, kName), qName, kName, forms: heldForms(ctx, "q") };
}

/** scores[i][j] = sum_t q[i][t] k[j][t]: the terms and their sum. */
export function scoreTerms(qRow, kRow) {
  const terms = qRow.map((qt, t) => ({ t, q: qt, k: kRow[t], value: qt * kRow[t] }));
  const total = terms.reduce((s, x) => s + x.value, 0);
  return { terms, total };
}

/** The row's softmax as the service takes it: max (with the sink), each exp, the sum. */
export function softmaxRow(row, sink = null, fullyMasked = "zero") {
  const m = row.map(num);
  let max = Math.max(...m);
  if (sink !== null && sink !== undefined) max = Math.max(max, sink);
  if (max === NEG_INF) {
    const S = m.length;
    const w = fullyMasked === "uniform" ? 1 / S : 0;
    return {
      max,
      exps: m.map(() => 0),
      sinkExp: null,
      sum: 0,
      weights: m.map(() => w),
      fullyMasked: true,
    };
  }
  const exps = m.map((x) => (x === NEG_INF ? 0 : Math.exp(x - max)));
  let sum = exps.reduce((s, e) => s + e, 0);
  let sinkExp = null;
  if (sink !== null && sink !== undefined) {
    sinkExp = Math.exp(sink - max);
    sum += sinkExp;
  }
  return { max, exps, sinkExp, sum, weights: exps.map((e) => e / sum), fullyMasked: false };
}

/** output[i][c] = sum_j weights[i][j] v[j][c]. */
export function outputTerms(wRow, v, c) {
  const terms = wRow.map((w, j) => ({ j, w: num(w), v: v[j][c], value: num(w) * v[j][c] }));
  return { terms, total: terms.reduce((s, x) => s + x.value, 0) };
}

/** RoPE as it turned query row i and key row j: positions, the sequence's length n (the
 * queries', for keys too), each pair's θ, what the scaling did to it (`scaled`, in words) and
 * the angles, the factor on cos and sin (`gain`), and the rows before and after (the page's own
 * rotation of the rows the service rotated). */
export function ropeOf(ctx, i, j) {
  const before = [formBefore(ctx, "q_rotated") ?? "q", formBefore(ctx, "k_rotated") ?? "k"];
  const q = pick(ctx, before[0]),
    k = pick(ctx, before[1]);
  if (q === undefined || k === undefined) return undefined;
  const used = ropeUsed(ctx);
  if (used === undefined) return undefined;
  const settings = ropeSettings(ctx.request, q[i].length);
  const { theta, gain, n } = used; // as the service turned the rows (rope_frequencies, rope_gain)
  const qPos = queryPosition(ctx, i),
    kPos = keyRowPosition(ctx, j, k.length);
  const qAngles = ropeAngles(settings, theta, qPos),
    kAngles = ropeAngles(settings, theta, kPos);
  return {
    settings,
    n,
    theta,
    scaled: pairScalings(settings, theta, n),
    scalingNote: scalingNote(settings, n, gain),
    gain,
    qPos,
    kPos,
    qAngles,
    kAngles,
    before,
    qBefore: q[i],
    kBefore: k[j],
    qRotated: rotate(q[i], qAngles, settings, gain),
    kRotated: rotate(k[j], kAngles, settings, gain),
  };
}

/** ALiBi's bias of cell (i, j): the head's slope and the distance between the positions. */
export function alibiOf(ctx, i, j) {
  if (!ctx.request.alibi) return undefined;
  const h = ctx.head ?? 0,
    n = Number(ctx.data.num_heads ?? 1);
  if (!Array.isArray(ctx.data.alibi_slopes)) return undefined;
  const slope = alibiSlope(ctx, h);
  return { slope, head: h, n, ...alibiBias(ctx, slope, i, j) };
}

/** The step `name` was computed from: {prev, m} (m its matrix), from the score maps held. */
function stepFrom(ctx, name) {
  const steps = scoreChain(ctx.endpoint); // the schema's chain of score maps (schema.js)
  const at = name === "weights" ? steps.length : steps.indexOf(name);
  for (let k = at - 1; k >= 0; k--) {
    const m = pick(ctx, steps[k]);
    if (m !== undefined) return { prev: steps[k], m };
  }
  return { prev: steps[0], m: undefined };
}

function sinkLogit(ctx) {
  const s = ctx.request.sinks;
  if (s === undefined || s === null || s === false) return null;
  if (Array.isArray(s)) return s[ctx.head ?? 0];
  return Number(s);
}

/** Recompute the clicked cell: {name, formula, terms, total, service, ...}; null if not explained. */
export function recompute(ctx) {
  const { name, i, j } = ctx;
  if (!explains(name)) return null;
  if (
    ctx.endpoint === "multihead" &&
    name === "output" &&
    (ctx.head === null || ctx.head === undefined)
  )
    return null;
  const here = pick(ctx, name);
  if (here === undefined) return null;
  const service = here[i][j];
  if (layerNames().has(name)) {
    const cell = layerCell(ctx, name, i, j);
    return cell === undefined ? null : { name, ...cell, service };
  }
  if (name === "scores") {
    const inp = scoreInputs(ctx);
    if (!inp) return null;
    const { terms, total } = scoreTerms(inp.q[i], inp.k[j]);
    const { qName, kName, forms } = inp;
    const out = { name, kind: "dot", qName, kName, forms, terms, total, service };
    if (inp.qName === "q_rotated") out.rope = ropeOf(ctx, i, j);
    return out;
  }
  if (name === "position_bias") {
    // ALiBi's, recomputed; T5's is looked up in its learned table
    const a = alibiOf(ctx, i, j);
    if (a) return { name, kind: "alibi", alibi: a, terms: [], total: a.bias, service };
    const distance = relativePosition(ctx, i, j);
    return { name, kind: "t5", distance, terms: [], total: service, service, lookedUp: true };
  }
  if (name === "scaled_scores") {
    const s = pick(ctx, "scores");
    const before = s === undefined ? undefined : s[i][j];
    const scale = Number(ctx.data.scale);
    return {
      name,
      kind: "scale",
      before,
      scale,
      terms: [],
      total: before === undefined ? undefined : before * scale,
      service,
    };
  }
  if (name === "capped_scores") {
    const before = stepFrom(ctx, name).m[i][j];
    const c = Number(ctx.request.softcap);
    return {
      name,
      kind: "cap",
      before,
      cap: c,
      terms: [],
      total: c * Math.tanh(before / c),
      service,
    };
  }
  if (name === "biased_scores") {
    const { prev, m } = stepFrom(ctx, name);
    const before = m[i][j];
    const pb = pick(ctx, "position_bias");
    const alibi = alibiOf(ctx, i, j);
    const bias = alibi ? alibi.bias : pb !== undefined ? pb[i][j] : service - before;
    return {
      name,
      kind: "bias",
      prev,
      before,
      bias,
      alibi,
      biasFromService: !alibi && pb !== undefined,
      terms: [],
      total: before + bias,
      service,
    };
  }
  if (name === "masked_scores") {
    const { prev, m } = stepFrom(ctx, name);
    const before = m[i][j];
    const am = pick(ctx, "additive_mask");
    const entry = am !== undefined ? num(am[i][j]) : num(service) - before;
    return {
      name,
      kind: "mask",
      prev,
      before,
      entry,
      terms: [],
      total: before + entry,
      service: num(service),
    };
  }
  if (name === "weights") {
    const { prev, m } = stepFrom(ctx, name);
    const row = m[i];
    const sink = sinkLogit(ctx);
    const sm = softmaxRow(
      row,
      sink,
      ctx.request.fully_masked_rows === "uniform" ? "uniform" : "zero",
    );
    const terms = row.map((x, k) => ({ k, m: num(x), exp: sm.exps[k] }));
    const sw = pick(ctx, "sink_weights", 1);
    return {
      name,
      kind: "softmax",
      prev,
      row: row.map(num),
      max: sm.max,
      sink,
      sinkExp: sm.sinkExp,
      sinkWeight: Array.isArray(sw) ? sw[i] : undefined,
      sum: sm.sum,
      fullyMasked: sm.fullyMasked,
      uniform: ctx.request.fully_masked_rows === "uniform",
      terms,
      total: sm.weights[j],
      service,
    };
  }
  if (name === "output") {
    const w = pick(ctx, "weights");
    const vName = lastForm(ctx, "v"); // weights V as the last step left them (V_c, V_n)
    const v = pick(ctx, vName);
    if (w === undefined || v === undefined) return null;
    const { terms, total } = outputTerms(w[i], v, j);
    return { name, kind: "weighted", vName, terms, total, service };
  }
  return null;
}
