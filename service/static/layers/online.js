// @ts-check
// The arithmetic of the online softmax (API 2.10, FlashAttention's blockwise softmax), a block at
// a time for one query row: what the service returned for the chosen head and batch item
// (`onlineOf`), and each block's state computed again from the block before (`blockStep`), in
// float64 as the service does (service/core/softmax.py online_softmax): m_new = max(m, max_j s_j),
// the rescaling factor exp(m − m_new), ℓ = ℓ·exp(m − m_new) + Σ_j exp(s_j − m_new), and
// o = (o·ℓ_old·exp(m − m_new) + Σ_j exp(s_j − m_new) v_j) / ℓ. The view is layers/blocks.js.
import { NEG_INF, num, pick } from "../lib/pick.js";
import { lastForm } from "../lib/layers.js";

/** @typedef {{keys: number[], m: (number | null)[], l: number[], o: number[][]}} Block */

/** One row's state: the running max (−∞ before any allowed key), sum and output. */
/** @typedef {{m: number, l: number, o: number[]}} RowState */

const isNumberRow = (a) => Array.isArray(a) && !a.some(Array.isArray);

/** ctx's list of blocks ({keys, m [L], l [L], o [L][d_v]}) for its head and batch item, or
 * undefined when the answer has none. On /multihead each head has its own list.
 * @returns {Block[] | undefined} */
export function blocksOf(ctx) {
  const { data, head, batch } = ctx;
  const list =
    head !== null && head !== undefined
      ? data.heads && data.heads[head] && data.heads[head].online_softmax
      : data.online_softmax;
  if (!Array.isArray(list) || !list.length) return undefined;
  const b = batch ?? 0;
  return list.map((e) => ({
    keys: e.keys,
    m: isNumberRow(e.m) ? e.m : e.m[b], // [L], or [B][L] when batched
    l: isNumberRow(e.l) ? e.l : e.l[b],
    o: Array.isArray(e.o[0]) && Array.isArray(e.o[0][0]) ? e.o[b] : e.o,
  }));
}

/** The final scores the softmax read (the last map of the scores the answer holds: masked,
 * biased, capped or scaled) and their name. */
export function finalScores(ctx) {
  const name = lastForm(ctx, "scores");
  return name === undefined ? undefined : { name, m: pick(ctx, name) };
}

/** The values the output read: the cache after a decode step (present_v; on /multihead the
 * head's key/value group), or V as the last step left it (clipped, normalised). */
export function valuesOf(ctx) {
  const { data, head } = ctx;
  if (data.present_v !== undefined && data.present_v !== null) {
    let group = null;
    if (head !== null && head !== undefined) {
      const h = Number(data.num_heads),
        kv = Number(data.num_kv_heads ?? data.num_heads);
      group = Math.floor(head / (h / kv));
    }
    return { name: "present_v", v: pick({ ...ctx, head: group }, "present_v") };
  }
  const name = lastForm(ctx, "v"); // V as the last step left it
  return { name, v: pick(ctx, name) };
}

/** The sink's logit for ctx's head (gpt-oss), or null without sinks. */
export function sinkOf(ctx) {
  const s = ctx.request.sinks;
  if (s === undefined || s === null || s === false) return null;
  return Array.isArray(s) ? Number(s[ctx.head ?? 0]) : Number(s);
}

/** A row's state before any block: m = −∞, ℓ = 0, o = 0; with a sink m = sink, ℓ = 1.
 * @returns {RowState} */
export function initialState(sink, dv) {
  const none = sink === null || sink === undefined;
  return { m: none ? NEG_INF : sink, l: none ? 0 : 1, o: Array(dv).fill(0) };
}

/** The service's state of row i after block k.
 * @param {Block[]} blocks
 * @returns {RowState} */
export function serviceState(blocks, k, i) {
  const e = blocks[k];
  return { m: num(e.m[i]), l: e.l[i], o: e.o[i] };
}

/**
 * Block [a, b) of row `sRow` (the final scores, null or −∞ masked) and the values `v` [S][d_v],
 * from the state before it: every number of the update.
 * @param {RowState} before
 * @param {(number | null)[]} sRow
 * @param {number[][]} v
 * @param {number} a
 * @param {number} b
 */
export function blockStep(before, sRow, v, a, b) {
  const s = sRow.slice(a, b).map(num);
  const blockMax = Math.max(...s);
  const mNew = Math.max(before.m, blockMax);
  const seen = Number.isFinite(mNew); // the row has met an allowed key (or a sink)
  const safe = seen ? mNew : 0; // as the service: no −∞ − −∞
  const rescale = Math.exp(before.m - safe); // exp(m_old − m_new); 0 while m_old is −∞
  const terms = s.map((x, n) => ({ j: a + n, s: x, p: Math.exp(x - safe) })); // masked: 0
  const sumP = terms.reduce((t, x) => t + x.p, 0);
  const l = before.l * rescale + sumP;
  const dv = before.o.length;
  const acc = before.o.map((o) => o * before.l); // the unnormalised output so far: o·ℓ
  const kept = acc.map((x) => x * rescale);
  const pv = Array.from({ length: dv }, (_, c) => terms.reduce((t, x) => t + x.p * v[x.j][c], 0));
  const o = kept.map((x, c) => (x + pv[c]) / (l > 0 ? l : 1));
  return {
    a,
    b,
    mOld: before.m,
    blockMax,
    m: mNew,
    seen,
    rescale,
    terms,
    sumP,
    lOld: before.l,
    l,
    oOld: before.o,
    acc,
    kept,
    pv,
    o,
  };
}

/** Every block of row i computed again, each from the service's state after the block before
 * (the first from the initial state), beside the service's: [{page, service}]. */
export function rowBlocks(ctx, i) {
  const blocks = blocksOf(ctx);
  const scores = finalScores(ctx);
  const { v } = valuesOf(ctx);
  if (!blocks || !scores || v === undefined) return undefined;
  const start = initialState(sinkOf(ctx), v[0].length);
  return blocks.map((e, k) => ({
    page: blockStep(
      k ? serviceState(blocks, k - 1, i) : start,
      scores.m[i],
      v,
      e.keys[0],
      e.keys[1],
    ),
    service: serviceState(blocks, k, i),
  }));
}
