// @ts-check
// The arithmetic of a cell's explanation (explain.js draws it), a leaf: the clicked cell computed
// again from the step before, in float64 as the service does (dot products, scale, softcap,
// position bias, mask, softmax with a sink, the weighted sum of V), with RoPE's and ALiBi's
// numbers as the answer carries them (positions.js); the cells of today's layers (norms, a
// rotated feature, the temperature, the gate) are layers.js's. Which arithmetic a cell takes is
// its step's kind, and the form it read the one made before it, by the OpenAPI document's
// x-chain and the answer's steps (lib/layers.js), so the document is loaded before this module
// is ready.
import { loadSpec } from "./state.js";
import { NEG_INF, num, pick } from "./pick.js";
import {
  explains,
  formBefore,
  formsOf,
  heldForms,
  kindOf,
  lastForm,
  layerCell,
  layerNames,
  slotOf,
  POSITION_BIAS,
  SINK_WEIGHTS,
} from "./layers.js";
import {
  alibiBias,
  alibiSlope,
  keyPosition,
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

await loadSpec(); // the chain (x-chain): each step's kind and slot (lib/layers.js)

// a response's arrays for the clicked cell (lib/pick.js), as this module has always offered them
export { NEG_INF, num, pick };
// which outputs' cells explain themselves (lib/layers.js, where they are listed once)
export { explains, kindOf };

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
  // the forms RoPE turned: the queries and keys before their step of kind "rotate"
  const before = ["q", "k"].map((side) => {
    const turned = formsOf(ctx, side).find((n) => kindOf(n) === "rotate");
    return (turned && formBefore(ctx, turned)) ?? side;
  });
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

// where each key's distance starts (service/core/positions.py ALIBI_ORIGINS), by the distance
// the answer's position_bias step writes: the paper's from the query, BLOOM's and Falcon's
// from position 0, MPT's from the last key
const ALIBI_ORIGINS = { "p'_j − p_i": "query", "p'_j": "zero", "p'_j − p'_last": "last_key" };

/** The ALiBi origin the answer's position_bias step states, or undefined when it states none. */
function statedOrigin(ctx) {
  const step = (ctx.data.steps || []).find((s) => s.name === POSITION_BIAS);
  const said = step && /^ALiBi: slope · \(([^)]*)\)/.exec(String(step.formula));
  return said ? ALIBI_ORIGINS[said[1]] : undefined;
}

/** ALiBi's bias of cell (i, j): the head's slope and the distance of key j from the origin the
 * request gives (service/core/positions.py alibi_bias): from the query p'_j − p_i (the paper's,
 * the default, −|·| when symmetric), from zero p'_j (BLOOM's and Falcon's build_alibi_tensor),
 * or from the last key p'_j − p'_last (MPT's build_mpt_alibi_tensor); undefined when the
 * answer's step states another origin. */
export function alibiOf(ctx, i, j) {
  if (!ctx.request.alibi) return undefined;
  const origin = ctx.request.alibi.origin ?? "query";
  const stated = statedOrigin(ctx);
  if (!Object.values(ALIBI_ORIGINS).includes(origin)) return undefined;
  if (stated !== undefined && stated !== origin) return undefined;
  const h = ctx.head ?? 0,
    n = Number(ctx.data.num_heads ?? 1);
  if (!Array.isArray(ctx.data.alibi_slopes)) return undefined;
  const slope = alibiSlope(ctx, h);
  if (origin === "query") return { slope, head: h, n, origin, ...alibiBias(ctx, slope, i, j) };
  const keys = ctx.data.key_positions;
  const key = keyPosition(ctx, j);
  const last = origin === "last_key" ? Number(keys[keys.length - 1]) : 0;
  const distance = key - last;
  return {
    slope,
    head: h,
    n,
    origin,
    key,
    last,
    distance,
    symmetric: false,
    bias: slope * distance,
  };
}

function sinkLogit(ctx) {
  const s = ctx.request.sinks;
  if (s === undefined || s === null || s === false) return null;
  if (Array.isArray(s)) return s[ctx.head ?? 0];
  return Number(s);
}

/** The map the step `name` read, {prev, m}: the scores as the step before left them (the
 * answer's steps say which), or undefined when the answer does not hold it. */
function scoresRead(ctx, name) {
  const prev = slotOf(name) === "scores" ? formBefore(ctx, name) : lastForm(ctx, "scores");
  const m = prev === undefined ? undefined : pick(ctx, prev);
  return m === undefined ? undefined : { prev, m };
}

// ---- each step's arithmetic for cell (i, j), by the step's kind (x-chain); `service` the
// answer's number there

function dotCell(ctx, name, i, j, service) {
  const inp = scoreInputs(ctx);
  if (!inp) return null;
  const { terms, total } = scoreTerms(inp.q[i], inp.k[j]);
  const { qName, kName, forms } = inp;
  const out = { name, kind: "scores", qName, kName, forms, terms, total, service };
  if (kindOf(qName) === "rotate") out.rope = ropeOf(ctx, i, j);
  return out;
}

function scaleCell(ctx, name, i, j, service) {
  const read = scoresRead(ctx, name);
  if (!read) return null;
  const before = read.m[i][j];
  const scale = Number(ctx.data.scale);
  return {
    name,
    kind: "scale",
    prev: read.prev,
    before,
    scale,
    terms: [],
    total: before * scale,
    service,
  };
}

function softcapCell(ctx, name, i, j, service) {
  const read = scoresRead(ctx, name);
  if (!read) return null;
  const before = read.m[i][j];
  const c = Number(ctx.request.softcap);
  const total = c * Math.tanh(before / c);
  return { name, kind: "softcap", prev: read.prev, before, cap: c, terms: [], total, service };
}

function biasCell(ctx, name, i, j, service) {
  const read = scoresRead(ctx, name);
  if (!read) return null;
  const before = read.m[i][j];
  const pb = pick(ctx, POSITION_BIAS);
  const alibi = alibiOf(ctx, i, j);
  const bias = alibi ? alibi.bias : pb !== undefined ? pb[i][j] : service - before;
  return {
    name,
    kind: "bias",
    prev: read.prev,
    before,
    bias,
    alibi,
    biasFromService: !alibi && pb !== undefined,
    terms: [],
    total: before + bias,
    service,
  };
}

function maskCell(ctx, name, i, j, service) {
  const read = scoresRead(ctx, name);
  if (!read) return null;
  const before = read.m[i][j];
  const am = pick(ctx, "additive_mask");
  const entry = am !== undefined ? num(am[i][j]) : num(service) - before;
  return {
    name,
    kind: "mask",
    prev: read.prev,
    before,
    entry,
    terms: [],
    total: before + entry,
    service: num(service),
  };
}

function softmaxCell(ctx, name, i, j, service) {
  const read = scoresRead(ctx, name);
  if (!read) return null;
  const row = read.m[i];
  const sink = sinkLogit(ctx);
  const uniform = ctx.request.fully_masked_rows === "uniform";
  const sm = softmaxRow(row, sink, uniform ? "uniform" : "zero");
  const terms = row.map((x, k) => ({ k, m: num(x), exp: sm.exps[k] }));
  const sw = pick(ctx, SINK_WEIGHTS, 1);
  return {
    name,
    kind: "softmax",
    prev: read.prev,
    row: row.map(num),
    max: sm.max,
    sink,
    sinkExp: sm.sinkExp,
    sinkWeight: Array.isArray(sw) ? sw[i] : undefined,
    sum: sm.sum,
    fullyMasked: sm.fullyMasked,
    uniform,
    terms,
    total: sm.weights[j],
    service,
  };
}

function outputCell(ctx, name, i, j, service) {
  const w = pick(ctx, lastForm(ctx, "weights"));
  const vForms = heldForms(ctx, "v"); // weights V as the last step left them
  const vName = vForms.at(-1);
  const v = pick(ctx, vName);
  if (w === undefined || v === undefined) return null;
  const { terms, total } = outputTerms(w[i], v, j);
  return { name, kind: "output", vName, vForms, terms, total, service };
}

const CELLS = {
  scores: dotCell,
  scale: scaleCell,
  softcap: softcapCell,
  bias: biasCell,
  mask: maskCell,
  softmax: softmaxCell,
  output: outputCell,
};

/** The position bias of cell (i, j): ALiBi's recomputed, T5's looked up in its learned table. */
function positionBiasCell(ctx, name, i, j, service) {
  const a = alibiOf(ctx, i, j);
  if (a) return { name, kind: "alibi", alibi: a, terms: [], total: a.bias, service };
  const distance = relativePosition(ctx, i, j);
  return { name, kind: "t5", distance, terms: [], total: service, service, lookedUp: true };
}

/** Recompute the clicked cell: {name, kind, terms, total, service, ...}; null if not explained. */
export function recompute(ctx) {
  const { name, i, j } = ctx;
  if (!explains(name)) return null;
  if (
    ctx.endpoint === "multihead" &&
    slotOf(name) === "out" &&
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
  const cell = name === POSITION_BIAS ? positionBiasCell : CELLS[kindOf(name)];
  return cell ? cell(ctx, name, i, j, service) : null;
}
