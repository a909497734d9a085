// @ts-check
// The arithmetic of DeepSeek's multi-head latent attention cells (API 2.6, "Multi-head latent
// attention"; layers/explain.js draws it), each computed again in float64 from the request's
// x and state dict, as the service does (service/core/latent.py):
//   c_q[i]   = rms_norm(x[i] W_qaᵀ + b) · w_qa                      (q_a_proj, q_a_layernorm)
//   c_kv[i]  = rms_norm(first kv_lora_rank of x[i] W_kvaᵀ + b) · w_kva (kv_a_proj_with_mqa,
//              kv_a_layernorm); the other qk_rope_head_dim features are k_pe, the shared key
//   k_rope[i] = RoPE(k_pe[i]) at token i's position, one key for every head
//   q_rope[i] = RoPE(the head's last qk_rope_head_dim features of c_q[i] W_qbᵀ (or x[i] W_qᵀ))
// DeepSeek's interleaved layout turns pairs (2n, 2n + 1) and returns the pairs' first members,
// then their second members; the half layout pairs (n, n + r/2) in place. With mla the heads'
// rotated queries and keys are [q_nope | q_rope] and [k_nope | k_rope].
import { pick } from "../lib/pick.js";
import { kindOf, normOf } from "../lib/layers.js";
import {
  anglePosition,
  pairScalings,
  queryPosition,
  ropeAngles,
  ropeSettings,
  ropeUsed,
  scalingNote,
} from "../lib/positions.js";

export const LATENT_NAMES = new Set(["c_q", "c_kv", "k_rope", "q_rope"]);

/** Whether ctx's answer is of an MLA layer. */
export function isLatent(ctx) {
  return !!ctx.request.mla || (ctx.data.c_kv !== undefined && ctx.data.c_kv !== null);
}

/** Whether ctx's cell is explained here rather than by lib/arithmetic.js. */
export function latentExplains(ctx) {
  // the heads' rotated queries and keys are [·_nope | ·_rope] with mla
  return LATENT_NAMES.has(ctx.name) || (kindOf(ctx.name) === "rotate" && isLatent(ctx));
}

/** A state dict entry under its dotted name, or with underscores. */
function field(request, name) {
  return request[name] ?? request[name.replace(/\./g, "_")] ?? null;
}

/** The sizes of the layer, read off the answer (as the config or mla gave them). */
function dimsOf(ctx) {
  const top = { ...ctx, head: null };
  const width = (name) => {
    const m = pick(top, name);
    return Array.isArray(m) && Array.isArray(m[0]) ? m[0].length : null;
  };
  const head0 = { ...ctx, head: 0 };
  const qNope = pick(head0, "q_nope");
  const mla = ctx.request.mla && typeof ctx.request.mla === "object" ? ctx.request.mla : {};
  return {
    qRank: width("c_q"),
    kvRank: width("c_kv") ?? mla.kv_lora_rank,
    rope: width("k_rope") ?? mla.qk_rope_head_dim,
    nope: Array.isArray(qNope) ? qNope[0].length : mla.qk_nope_head_dim,
    eps: mla.eps ?? 1e-6,
  };
}

/** The rows x the projections read: the answer's generated x, else the request's. */
function xRows(ctx) {
  const held = pick({ ...ctx, head: null }, "x");
  if (held !== undefined) return held;
  let x = ctx.request.x;
  if (Array.isArray(x) && Array.isArray(x[0]) && Array.isArray(x[0][0])) x = x[ctx.batch ?? 0];
  return x;
}

/** x W_aᵀ + b for one row (W out_in, as the state dict holds it). */
function linear(row, w, b) {
  return w.map((wr, u) => wr.reduce((s, wt, t) => s + row[t] * wt, 0) + (b ? b[u] : 0));
}

/** The terms of feature u of x W_aᵀ + b: x[t] · W[u][t]. */
function dotTerms(row, w, b, u) {
  const terms = row.map((xt, t) => ({ t, x: xt, w: w[u][t], value: xt * w[u][t] }));
  const dot = terms.reduce((s, x) => s + x.value, 0);
  const bias = b ? b[u] : null;
  return { terms, dot, bias, value: dot + (bias ?? 0) };
}

/** The latent row before the norm, its clicked feature's terms, and the norm of feature j. */
function latentNorm(ctx, row, j, which) {
  const d = dimsOf(ctx);
  const q = which === "c_q";
  const proj = q ? "q_a_proj" : "kv_a_proj_with_mqa";
  const norm = q ? "q_a_layernorm" : "kv_a_layernorm";
  const w = field(ctx.request, `${proj}.weight`),
    b = field(ctx.request, `${proj}.bias`);
  const x = xRows(ctx);
  const full = linear(x[row], w, b); // c_q: q_lora_rank; c_kv: kv_lora_rank + the rope features
  const latent = q ? full : full.slice(0, d.kvRank);
  const weight = field(ctx.request, `${norm}.weight`);
  const normed = normOf(latent, j, { eps: d.eps, weight });
  return {
    kind: "latent-norm",
    from: "x",
    proj,
    norm,
    latent,
    ropePart: q ? null : full.slice(d.kvRank),
    dotJ: dotTerms(x[row], w, b, j),
    ...normed,
  };
}

/** Row `row`'s queries before RoPE, all heads: c_q W_qbᵀ, or x W_qᵀ without q_lora_rank. */
function queriesOf(ctx, row) {
  const d = dimsOf(ctx);
  const x = xRows(ctx);
  if (d.qRank === null) return linear(x[row], field(ctx.request, "q_proj.weight"), null);
  const w = field(ctx.request, "q_a_proj.weight"),
    b = field(ctx.request, "q_a_proj.bias");
  const latent = linear(x[row], w, b);
  const weight = field(ctx.request, "q_a_layernorm.weight");
  const cq = latent.map((_, u) => normOf(latent, u, { eps: d.eps, weight }).total);
  return linear(cq, field(ctx.request, "q_b_proj.weight"), null);
}

/** RoPE of feature j of the rope part `pe` [r] of token `row`, in the request's layout. */
function ropeFeature(ctx, pe, row, j) {
  const r = pe.length;
  const given = ropeSettings(ctx.request, r);
  /** @type {import("../lib/positions.js").RopeSettings} */
  const settings = {
    ...given,
    style: given.style === "interleaved" ? "interleaved" : "half",
    rotaryDim: r,
    dk: r,
  };
  const style = settings.style;
  const used = ropeUsed(ctx); // θ_i over the rope features, as the service turned them
  if (used === undefined) throw new Error("the answer has no rope_frequencies");
  const { theta, gain, n } = used;
  const pos = queryPosition(ctx, row); // keys at the queries' positions (self-attention)
  const angles = ropeAngles(settings, theta, pos);
  const half = r / 2;
  const pair = j % half;
  const first = j < half;
  const [f, g] = style === "interleaved" ? [2 * pair, 2 * pair + 1] : [pair, pair + half];
  const phi = angles[pair];
  const c = Math.cos(phi) * gain,
    s = Math.sin(phi) * gain;
  const a = pe[f],
    b = pe[g];
  return {
    kind: "latent-rope",
    settings,
    pe,
    pos,
    at: anglePosition(settings, pos),
    n,
    theta,
    angles,
    scaled: pairScalings(settings, theta, n),
    scalingNote: scalingNote(settings, n, gain),
    gain,
    pair,
    first,
    f,
    g,
    phi,
    c,
    s,
    a,
    b,
    total: first ? a * c - b * s : b * c + a * s,
  };
}

/** Cell [i][j] of ctx's latent output computed again ({name, kind, total, service, …}), or null
 * when the request does not hold what it needs.
 * @returns {any} */
export function latentCell(ctx) {
  const { name, i, j } = ctx;
  const here = pick(ctx, name);
  if (here === undefined) return null;
  const service = here[i][j];
  const d = dimsOf(ctx);
  const side = name[0] === "k" ? "k" : "q";
  let t = j;
  if (kindOf(name) === "rotate") {
    if (j < d.nope) {
      // the features RoPE leaves: the head's q_nope or k_nope, as the service made them
      return {
        name,
        kind: "latent-pass",
        from: `${side}_nope`,
        nope: d.nope,
        total: service,
        service,
        lookedUp: true,
      };
    }
    t = j - d.nope;
  }
  try {
    if (name === "c_kv" || name === "c_q") return { name, ...latentNorm(ctx, i, j, name), service };
    const h = ctx.head ?? 0;
    // the service's rope part before RoPE: the head's q or k (before RoPE) past its nope features
    const before = pick({ ...ctx, head: h }, side);
    const held = Array.isArray(before) ? before[i].slice(d.nope) : null;
    if (side === "k") {
      const pe = latentNorm(ctx, i, 0, "c_kv").ropePart;
      return { name, side, t, from: "k_pe", held, ...ropeFeature(ctx, pe, i, t), service };
    }
    const q = queriesOf(ctx, i);
    const at = h * (d.nope + d.rope) + d.nope;
    const pe = q.slice(at, at + d.rope);
    return { name, side, t, from: "q_pe", held, head: h, ...ropeFeature(ctx, pe, i, t), service };
  } catch {
    return null; // a weight the request does not hold (a config's, say)
  }
}
