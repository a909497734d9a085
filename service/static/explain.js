/* explain.js: how one cell of a map was computed from the step before, with the numbers.
 *
 * explainCell(ctx) returns a <section class="explain">: .explain-title ("weights[1][2] (head 0,
 * batch item 1)"), .explain-who (the query and key tokens), .explain-formula lines,
 * .explain-terms tables (the clicked cell's own term in tr.this-term), .explain-note remarks
 * (RoPE angles, fully masked rows, the sink), .explain-total ("= 0.731059 (the service:
 * 0.731059)", .explain-mismatch when the page's sum differs) and a button.explain-back whose
 * data-step, data-i, data-j name the same cell of the step before. Styles are in explorer.css.
 */

import { formatNumber } from "./heatmap.js";

export const EXPLAINED = new Set([
  "scores", "scaled_scores", "capped_scores", "biased_scores",
  "masked_scores", "weights", "output",
]);

const NEG_INF = -Infinity;

/** A JSON number; null (the service's -inf) becomes -Infinity. */
export function num(x) {
  return x === null || x === undefined ? NEG_INF : Number(x);
}

/** Six significant digits, trailing zeros kept (a column of terms lines up); −∞ for a masked
 * score (null or -Infinity). */
export function fmt(x, digits = 6) {
  return formatNumber(x === undefined || x === NEG_INF ? null : x, digits, false);
}

function depth(a) {
  let d = 0;
  while (Array.isArray(a)) { d += 1; a = a[0]; }
  return d;
}

/** ctx's array `key` for its head and batch item, reduced to `want` dimensions. */
export function pick(ctx, key, want = 2) {
  const { data, head, batch } = ctx;
  let a;
  let fromHead = false;
  if (head !== null && head !== undefined && data.heads && data.heads[head] && key in data.heads[head]) {
    a = data.heads[head][key];
    fromHead = true;
  } else {
    a = data[key];
  }
  if (a === undefined || a === null) return undefined;
  if (!Array.isArray(a)) return a;
  if (depth(a) > want && batch !== null && batch !== undefined) a = a[batch];
  if (!fromHead && depth(a) > want && head !== null && head !== undefined) a = a[head];
  return a;
}

/** The q and k a score was computed from, and which variant they come from. */
export function scoreInputs(ctx) {
  for (const [qn, kn] of [["q_rotated", "k_rotated"], ["q_normed", "k_normed"], ["q", "k"]]) {
    const q = pick(ctx, qn);
    const k = pick(ctx, kn);
    if (q !== undefined && k !== undefined) return { q, k, qName: qn, kName: kn };
  }
  return undefined;
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
    return { max, exps: m.map(() => 0), sinkExp: null, sum: 0, weights: m.map(() => w), fullyMasked: true };
  }
  const exps = m.map((x) => (x === NEG_INF ? 0 : Math.exp(x - max)));
  let sum = exps.reduce((s, e) => s + e, 0);
  let sinkExp = null;
  if (sink !== null && sink !== undefined) { sinkExp = Math.exp(sink - max); sum += sinkExp; }
  return { max, exps, sinkExp, sum, weights: exps.map((e) => e / sum), fullyMasked: false };
}

/** output[i][c] = sum_j weights[i][j] v[j][c]. */
export function outputTerms(wRow, v, c) {
  const terms = wRow.map((w, j) => ({ j, w: num(w), v: v[j][c], value: num(w) * v[j][c] }));
  return { terms, total: terms.reduce((s, x) => s + x.value, 0) };
}

/** RoPE: the angle p·θ_i of each rotated pair, θ_i = base^(−2i/rotary_dim). */
export function ropeAngles(request, dk, p) {
  const rope = request.rope && typeof request.rope === "object" ? request.rope : {};
  const base = rope.base ?? 10000;
  const rd = rope.rotary_dim ?? dk;
  const style = rope.style ?? "half";
  const pairs = [];
  for (let i = 0; i < rd / 2; i++) {
    const theta = Math.pow(base, (-2 * i) / rd);
    const feats = style === "half" ? [i, i + rd / 2] : [2 * i, 2 * i + 1];
    pairs.push({ i, theta, angle: p * theta, features: feats });
  }
  return { base, rotaryDim: rd, style, pairs };
}

function positionOf(request, r, batch) {
  let pos = request.positions;
  if (Array.isArray(pos) && Array.isArray(pos[0])) pos = pos[batch ?? 0];
  return Array.isArray(pos) ? pos[r] : r;
}

function sinkLogit(ctx) {
  const s = ctx.request.sinks;
  if (s === undefined || s === null || s === false) return null;
  if (Array.isArray(s)) return s[ctx.head ?? 0];
  return Number(s);
}

function cell(m, i, j) { return m === undefined ? undefined : m[i][j]; }

/** Recompute the clicked cell: {name, formula, terms, total, service, ...}; null if not explained. */
export function recompute(ctx) {
  const { name, i, j } = ctx;
  if (!EXPLAINED.has(name)) return null;
  if (ctx.endpoint === "multihead" && name === "output" && (ctx.head === null || ctx.head === undefined)) return null;
  const here = pick(ctx, name);
  if (here === undefined) return null;
  const service = here[i][j];
  const scaled = pick(ctx, "scaled_scores");
  const capped = pick(ctx, "capped_scores");
  const biased = pick(ctx, "biased_scores");
  const masked = pick(ctx, "masked_scores");
  if (name === "scores") {
    const inp = scoreInputs(ctx);
    if (!inp) return null;
    const { terms, total } = scoreTerms(inp.q[i], inp.k[j]);
    const out = { name, kind: "dot", qName: inp.qName, kName: inp.kName, terms, total, service };
    if (inp.qName === "q_rotated") {
      const dk = inp.q[i].length;
      out.rope = { query: ropeAngles(ctx.request, dk, positionOf(ctx.request, i, ctx.batch)),
                   key: ropeAngles(ctx.request, dk, positionOf(ctx.request, j, ctx.batch)) };
    }
    return out;
  }
  if (name === "scaled_scores") {
    const s = pick(ctx, "scores");
    const before = s === undefined ? undefined : s[i][j];
    const scale = Number(ctx.data.scale);
    return { name, kind: "scale", before, scale, terms: [], total: before === undefined ? undefined : before * scale, service };
  }
  if (name === "capped_scores") {
    const before = scaled[i][j];
    const c = Number(ctx.request.softcap);
    return { name, kind: "cap", before, cap: c, terms: [], total: c * Math.tanh(before / c), service };
  }
  if (name === "biased_scores") {
    const prev = capped !== undefined ? "capped_scores" : "scaled_scores";
    const before = (capped ?? scaled)[i][j];
    const pb = pick(ctx, "position_bias");
    const bias = pb !== undefined ? pb[i][j] : service - before;
    return { name, kind: "bias", prev, before, bias, biasFromService: pb !== undefined, terms: [], total: before + bias, service };
  }
  if (name === "masked_scores") {
    const prev = biased !== undefined ? "biased_scores" : capped !== undefined ? "capped_scores" : "scaled_scores";
    const before = (biased ?? capped ?? scaled)[i][j];
    const am = pick(ctx, "additive_mask");
    const entry = am !== undefined ? num(am[i][j]) : num(service) - before;
    return { name, kind: "mask", prev, before, entry, terms: [], total: before + entry, service: num(service) };
  }
  if (name === "weights") {
    const prev = masked !== undefined ? "masked_scores" : biased !== undefined ? "biased_scores"
      : capped !== undefined ? "capped_scores" : "scaled_scores";
    const row = (masked ?? biased ?? capped ?? scaled)[i];
    const sink = sinkLogit(ctx);
    const sm = softmaxRow(row, sink, ctx.request.fully_masked_rows === "uniform" ? "uniform" : "zero");
    const terms = row.map((x, k) => ({ k, m: num(x), exp: sm.exps[k] }));
    const sw = pick(ctx, "sink_weights", 1);
    return { name, kind: "softmax", prev, row: row.map(num), max: sm.max, sink, sinkExp: sm.sinkExp,
             sinkWeight: Array.isArray(sw) ? sw[i] : undefined, sum: sm.sum, fullyMasked: sm.fullyMasked,
             uniform: ctx.request.fully_masked_rows === "uniform", terms, total: sm.weights[j], service };
  }
  if (name === "output") {
    const w = pick(ctx, "weights");
    const v = pick(ctx, "v");
    if (w === undefined || v === undefined) return null;
    const { terms, total } = outputTerms(w[i], v, j);
    return { name, kind: "weighted", terms, total, service };
  }
  return null;
}

// ---- the element

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** A table of terms; row `mark` (the clicked cell's own term) is highlighted. */
function table(head, rows, mark = -1) {
  const t = el("table", "explain-terms");
  const hr = el("tr");
  for (const h of head) hr.append(el("th", null, h));
  t.append(hr);
  for (const [n, r] of rows.entries()) {
    const tr = el("tr", n === mark ? "this-term" : null);
    for (const c of r) tr.append(el("td", null, c));
    t.append(tr);
  }
  return t;
}

function totalLine(total, service) {
  const p = el("p", "explain-total", "= " + fmt(total) + " ");
  const same = (total === NEG_INF && (service === null || service === NEG_INF))
    || (typeof service === "number" && Math.abs(total - service) <= 1e-9 * Math.max(1, Math.abs(service)));
  if (!same) p.classList.add("explain-mismatch");
  p.append("(the service: ", el("span", "explain-service", fmt(service === null ? NEG_INF : service)), ")");
  return p;
}

/** The explanation of ctx's cell as an element, or null when that name is not explained. */
export function explainCell(ctx) {
  let r;
  try { r = recompute(ctx); } catch { return null; }
  if (!r || r.total === undefined) return null;
  const { i, j } = ctx;
  const box = el("section", "explain");
  const where = [];
  if (ctx.head !== null && ctx.head !== undefined) where.push("head " + ctx.head);
  if (ctx.batch !== null && ctx.batch !== undefined) where.push("batch item " + ctx.batch);
  box.append(el("h3", "explain-title", `${r.name}[${i}][${j}]` + (where.length ? ` (${where.join(", ")})` : "")));
  const tokens = ctx.data.tokens, keys = ctx.data.context_tokens || tokens;
  if (r.name !== "output" && Array.isArray(tokens) && tokens[i] !== undefined && keys && keys[j] !== undefined) {
    box.append(el("p", "explain-who", `query ${i} “${tokens[i]}” → key ${j} “${keys[j]}”`));
  } else if (r.name === "output" && Array.isArray(tokens) && tokens[i] !== undefined) {
    box.append(el("p", "explain-who", `query ${i} “${tokens[i]}”, feature ${j} of what it takes from the values`));
  }
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  if (r.kind === "dot") {
    f(`scores[${i}][${j}] = Σ_t ${r.qName}[${i}][t] · ${r.kName}[${j}][t], the query row ${i} dotted with the key row ${j}`);
    box.append(table(["t", `${r.qName}[${i}][t]`, `${r.kName}[${j}][t]`, "product"],
      r.terms.map((x) => [String(x.t), fmt(x.q), fmt(x.k), fmt(x.value)])));
    if (r.rope) {
      const q = r.rope.query;
      note(`RoPE (base ${q.base}, rotary_dim ${q.rotaryDim}, style "${q.style}"): each pair of features rotates by p·θ_i, θ_i = ${q.base}^(−2i/${q.rotaryDim}); the query at position ${positionOf(ctx.request, i, ctx.batch)}, the key at position ${positionOf(ctx.request, j, ctx.batch)}.`);
      box.append(table(["pair i", "features", "θ_i", "query angle", "key angle"],
        q.pairs.map((pr, n) => [String(pr.i), `${pr.features[0]} with ${pr.features[1]}`, fmt(pr.theta), fmt(pr.angle), fmt(r.rope.key.pairs[n].angle)])));
    } else if (r.qName === "q_normed") {
      note("qk_norm is on: q and k were normalised before the dot product.");
    }
  } else if (r.kind === "scale") {
    f(`scaled_scores[${i}][${j}] = scores[${i}][${j}] · scale = ${fmt(r.before)} · ${fmt(r.scale)}`);
  } else if (r.kind === "cap") {
    f(`capped_scores[${i}][${j}] = c · tanh(scaled_scores[${i}][${j}] / c) = ${fmt(r.cap)} · tanh(${fmt(r.before)} / ${fmt(r.cap)})`);
  } else if (r.kind === "bias") {
    f(`biased_scores[${i}][${j}] = ${r.prev}[${i}][${j}] + position_bias[${i}][${j}] = ${fmt(r.before)} + ${fmt(r.bias)}`);
    note(r.biasFromService ? "The bias is the service's position_bias (ALiBi: slope · distance; T5: the learned bucket's value)."
      : "The bias is the difference of the two maps (the response carries no position_bias).");
  } else if (r.kind === "mask") {
    f(`masked_scores[${i}][${j}] = ${r.prev}[${i}][${j}] + additive mask[${i}][${j}] = ${fmt(r.before)} + ${fmt(r.entry)}`);
    if (r.entry === NEG_INF) note("This key is masked for this query: −∞, so its weight will be 0.");
  } else if (r.kind === "softmax") {
    f(`weights[${i}][${j}] = exp(m[${i}][${j}] − max) / Σ_k exp(m[${i}][k] − max), m = ${r.prev}`);
    if (r.fullyMasked) {
      note(`Row ${i} is fully masked (every entry −∞): its weights are ${r.uniform ? "1/S each (fully_masked_rows: \"uniform\")" : "0"}.`);
    } else {
      box.append(table(["k", `m[${i}][k]`, "m − max", "exp(m − max)"],
        r.terms.map((x) => [String(x.k) + (x.k === j ? " ←" : ""), fmt(x.m), fmt(x.m - r.max), fmt(x.exp)]), j));
      if (r.sink !== null) {
        note(`The sink (logit ${fmt(r.sink)}) is in the max and the sum: exp(${fmt(r.sink)} − max) = ${fmt(r.sinkExp)}` +
          (r.sinkWeight !== undefined ? `; its weight ${fmt(r.sinkExp / r.sum)} (the service: ${fmt(r.sinkWeight)})` : "") + ".");
      }
      f(`max = ${fmt(r.max)}, sum = ${fmt(r.sum)}, weights[${i}][${j}] = ${fmt(r.terms[j].exp)} / ${fmt(r.sum)}`);
    }
  } else if (r.kind === "weighted") {
    f(`output[${i}][${j}] = Σ_k weights[${i}][k] · v[k][${j}], the weighted sum of the V rows`);
    box.append(table(["k", `weights[${i}][k]`, `v[k][${j}]`, "product"],
      r.terms.map((x) => [String(x.j), fmt(x.w), fmt(x.v), fmt(x.value)])));
  }
  box.append(totalLine(r.total, r.service));
  const before = stepBefore(r);
  if (before) { // walk back one step: the page shows that cell's explanation in place of this one
    const back = el("button", "secondary explain-back", `← how ${before}[${i}][${j}] was computed`);
    back.type = "button";
    Object.assign(back.dataset, { step: before, i: String(i), j: String(j) });
    box.append(back);
  }
  return box;
}

/** The map the cell was computed from, cell for cell (none for scores and output). */
function stepBefore(r) {
  if (r.kind === "scale") return "scores";
  if (r.kind === "cap") return "scaled_scores";
  if (r.kind === "bias" || r.kind === "mask" || r.kind === "softmax") return r.prev;
  return null;
}
