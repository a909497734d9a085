// @ts-check
// The arithmetic of the gradients of what the score side reads besides Q and K (backward-explain.js
// draws them), a leaf beside lib/backward.js: each clicked cell computed again in float64 from the
// gradient after it and the forward's arrays, as the service's backward does
// (service/core/chain.py _weights_back and _biased_back, service/trace/backward.py bias_table; API
// "The backward pass, every step"):
//   grad_sinks[h]   a sink is one more logit of the row's softmax with no value: its dP is 0, so
//                   its dS is p_sink · (0 − D), summed over the rows (and batch items):
//                   −Σ_b Σ_i sink_weights[b][h][i] · D[b][h][i],  D[i] = Σ_c dO[i][c] · O[i][c]
//                   (one per head on /multihead; /attention's one sink is [0])
//   grad_relative_bias_table[b][h]
//                   T5's bias is table[bucket(p'_j − p_i)][h], added to the scores (after the
//                   scale: no scale in its gradient): Σ over the batch items and the (i, j) whose
//                   bucket is b of grad_biased_scores[h][i][j] (the gradient after the bias)
// T5's bucket as the service's t5_bucket (service/core/positions.py): float32 at every step, the
// correctly rounded float32 logarithm; where a float64 logarithm lies near a float32 midpoint (its
// last bit is the CPU's) the candidates are told apart by the forward's position_bias, and a cell
// they cannot tell apart is not computed (undefined: the page shows the service's number). The
// bucketing is the request's relative_bias, or (a T5 config's) as the position_bias step states it.
import { pick } from "./pick.js";
import { formsOf, kindOf, POSITION_BIAS } from "./layers.js";
import { keyPosition, queryPosition } from "./positions.js";

/** The arrays whose gradients this module computes (backward.js's computeCell sends them). */
export const SCORE_PARAMS = new Set(["sinks", "relative_bias_table"]);

const sum = (terms) => terms.reduce((s, x) => s + x.value, 0);
const depth = (a) => (Array.isArray(a) ? 1 + depth(a[0]) : 0);

/** ctx for head h (null on /attention) and batch item b. */
const at = (ctx, h, b) => ({ ...ctx, head: h, batch: b });

/** The batch items of `name` for head h (null: not batched), by the depth of its array. */
function itemsOf(ctx, h, name, rank) {
  const a = h === null ? ctx.data[name] : ctx.data.heads?.[h]?.[name];
  return depth(a) > rank ? a.map((_, b) => b) : [null];
}

/** The head column j of a per-head parameter: j on /multihead, null on /attention. */
const headOf = (ctx, j) => (ctx.endpoint === "multihead" ? j : null);

/** D[i] = Σ_c dO[i][c] · O[i][c] of head h, batch item b. */
function rowDotOf(ctx, i) {
  const dO = pick(ctx, "grad_output"),
    o = pick(ctx, "output");
  if (!Array.isArray(dO) || !Array.isArray(o)) return undefined;
  return dO[i].reduce((s, g, c) => s + g * o[i][c], 0);
}

/** grad_sinks[h] = −Σ_b Σ_i sink_weights[b][h][i] · D[b][h][i]. */
function sinkCell(ctx, j) {
  const h = headOf(ctx, j);
  if (h === null && j !== 0) return undefined;
  const terms = [];
  for (const b of itemsOf(ctx, h, "sink_weights", 1)) {
    const here = at(ctx, h, b);
    const p = pick(here, "sink_weights", 1);
    if (!Array.isArray(p)) return undefined;
    for (const [i, w] of p.entries()) {
      const d = rowDotOf(here, i);
      if (d === undefined) return undefined;
      terms.push({ item: b, c: i, a: w, b: d, value: -w * d });
    }
  }
  return { kind: "sink-back", head: h, terms, total: sum(terms) };
}

// ---- T5's bucket, as service/core/positions.py t5_bucket ------------------------------------

const f32 = Math.fround;
const NEAR_MIDPOINT_ULPS = 16; // as the service's: a float64 log this close decides nothing

/** The float32 next to x (a float32) towards +∞ (up) or −∞. */
function nextF32(x, up) {
  const f = new Float32Array([x]);
  const bits = new Int32Array(f.buffer);
  if (x === 0) return up ? 1.401298464324817e-45 : -1.401298464324817e-45;
  bits[0] += x > 0 === up ? 1 : -1;
  return f[0];
}

/** The distance from |x| to the next float64 away from 0 (NumPy's spacing). */
function spacing(x) {
  const a = Math.abs(x);
  return a === 0 ? Number.MIN_VALUE : 2 ** (Math.floor(Math.log2(a)) - 52);
}

/** The float32 of a float64 logarithm `log`: one value, or the two float32s it lies between
 * when it is within a few float64 ulps of their midpoint (its last bit decides there). */
function f32Candidates(log) {
  const out = f32(log);
  const other = nextF32(out, log >= out);
  const near = Math.abs(log - (out + other) / 2) <= NEAR_MIDPOINT_ULPS * spacing(log);
  return near ? [out, other] : [out];
}

/** T5's bucketing as the request's relative_bias gives it (defaults: bidirectional, 128), else
 * as the position_bias step states it (a config's: "(bidirectional), distances ≥ 128 …"). */
function bucketing(ctx) {
  const rb = ctx.request.relative_bias;
  if (rb && typeof rb === "object")
    return { bidirectional: rb.bidirectional ?? true, maxDistance: Number(rb.max_distance ?? 128) };
  const step = (ctx.data.steps || []).find((x) => x.name === POSITION_BIAS);
  const said = step && /\((bi|uni)directional\), distances ≥ (\d+)/.exec(String(step.formula));
  return said ? { bidirectional: said[1] === "bi", maxDistance: Number(said[2]) } : undefined;
}

/** T5's bucket settings for a table of `numBuckets` rows, or undefined. */
function bucketSettings(ctx, numBuckets) {
  const given = bucketing(ctx);
  if (!given) return undefined;
  const { bidirectional, maxDistance } = given;
  const b = bidirectional ? Math.floor(numBuckets / 2) : numBuckets;
  const m = Math.floor(b / 2);
  return { bidirectional, b, m, maxDistance, logs: f32Candidates(Math.log(maxDistance / m)) };
}

/** The buckets relative position `rel` may fall in (one but at a float32 tie). */
function bucketsOf(s, rel) {
  const offset = s.bidirectional && rel > 0 ? s.b : 0;
  const d = s.bidirectional ? Math.abs(rel) : -Math.min(rel, 0);
  if (d < s.m) return [offset + d];
  const ratio = f32(f32(Math.max(d, s.m)) / f32(s.m));
  const found = new Set();
  for (const log of f32Candidates(Math.log(ratio)))
    for (const c of s.logs) {
      const bin = f32(f32(log / c) * f32(s.b - s.m));
      found.add(offset + Math.min(s.m + Math.trunc(bin), s.b - 1));
    }
  return [...found];
}

// where a request gives T5's table: relative_bias.table, or a T5 state dict's
const TABLE_FIELDS = ["relative_attention_bias.weight", "relative_attention_bias_weight"];

/** The table's rows as [bucket][head] (a vector on /attention is one column). */
function tableOf(ctx) {
  const named = TABLE_FIELDS.map((f) => ctx.request[f]).find(Array.isArray);
  const t = ctx.request.relative_bias?.table ?? named;
  if (!Array.isArray(t)) return undefined;
  return t.map((row) => (Array.isArray(row) ? row : [row]));
}

/** The bucket of (i, j): the one candidate whose table values are the forward's position_bias
 * at (i, j) in every head; undefined when they cannot be told apart. */
function bucketOf(ctx, s, heads, i, j) {
  const rel = keyPosition(ctx, j) - queryPosition(ctx, i);
  const found = bucketsOf(s, rel);
  if (found.length === 1) return { rel, bucket: found[0] };
  const table = tableOf(ctx);
  if (!table) return undefined;
  const bias = (h) => pick(at(ctx, h, itemsOf(ctx, h, "position_bias", 2)[0]), "position_bias");
  const fits = found.filter((k) =>
    heads.every((h, n) => table[k] && bias(h)?.[i]?.[j] === table[k][n]),
  );
  return fits.length === 1 ? { rel, bucket: fits[0] } : undefined;
}

/** The gradient after the bias: grad_ + the score form the bias step made. */
const biasedName = (ctx) => formsOf(ctx, "scores").find((n) => kindOf(n) === "bias");

/** grad_relative_bias_table[k][n] = Σ_b Σ_{(i, j): bucket k} grad_biased_scores[b][n][i][j]. */
function tableCell(ctx, k, n) {
  const all = pick({ ...ctx, head: null, batch: null }, "grad_relative_bias_table");
  const biased = biasedName(ctx);
  const s = Array.isArray(all) && bucketSettings(ctx, all.length);
  if (!s || !biased) return undefined;
  const heads = all[0].map((_, c) => headOf(ctx, c));
  const h = heads[n];
  const terms = [];
  for (const b of itemsOf(ctx, h, "grad_" + biased, 2)) {
    const g = pick(at(ctx, h, b), "grad_" + biased);
    if (!Array.isArray(g)) return undefined;
    for (const [i, row] of g.entries())
      for (const [j, x] of row.entries()) {
        const where = bucketOf(ctx, s, heads, i, j);
        if (where === undefined) return undefined;
        if (where.bucket === k) terms.push({ item: b, i, j, rel: where.rel, a: x, value: x });
      }
  }
  const { bidirectional, b, m, maxDistance } = s;
  const settings = { bidirectional, perSide: b, exact: m, maxDistance };
  return { kind: "bias-table-back", head: h, biased, ...settings, terms, total: sum(terms) };
}

/** The gradient of `of` (the sinks, T5's table) at [i][j], or undefined. */
export function scoreParamCell(ctx, of, i, j) {
  if (of === "sinks") return i === 0 ? sinkCell(ctx, j) : undefined;
  if (of === "relative_bias_table") return tableCell(ctx, i, j);
  return undefined;
}
