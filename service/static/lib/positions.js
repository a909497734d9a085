// @ts-check
// The position variants as a cell's explanation reads them from the answer (API 2.6, 3.2): the
// positions the service used (query_positions, key_positions), RoPE's θ_i after the scaling
// (rope_frequencies) and the factor on cos and sin (rope_gain), each head's ALiBi slope
// (alibi_slopes). The page keeps only one cell's arithmetic: the angle p·θ_i, the pair turned
// with the gain, the bias slope · distance. What a scaling did to each θ_i is said in words by
// setting the answer's θ_i beside base^(−2i/r), with the request's factor: the scalings are not
// computed here (they are the service's, service/core/rope_scaling.py).
import { formatNumber } from "./format.js";
import { state } from "./state.js";

/** The position of query i, as the service used it (the answer's query_positions). */
export function queryPosition(ctx, i) {
  return Number(ctx.data.query_positions[i]);
}

/** The position of key j of all S keys (with a cache, its keys first): key_positions[j]. */
export function keyPosition(ctx, j) {
  return Number(ctx.data.key_positions[j]);
}

/** The position of row j of `rows` keys this request computed (k, or as RoPE turned it: with a cache, the
 * new tokens', the last of key_positions). */
export function keyRowPosition(ctx, j, rows) {
  const all = ctx.data.key_positions;
  return Number(all[all.length - rows + j]);
}

/** The relative position p'_j − p_i of key j seen from query i (negative for earlier keys). */
export function relativePosition(ctx, i, j) {
  return keyPosition(ctx, j) - queryPosition(ctx, i);
}

/**
 * @typedef {object} RopeSettings
 * @property {number} base
 * @property {"half" | "interleaved" | "proportional"} style
 * @property {number} rotaryDim the request's rotary_dim (d_k when absent)
 * @property {number} dk the head's width d_k
 * @property {any} scaling the request's `rope.scaling` object ({type, …}), or null
 */

/** RoPE's settings as the request gives them: `true` or {base, style, rotary_dim, scaling}.
 * @param {any} request
 * @param {number} dk
 * @returns {RopeSettings} */
export function ropeSettings(request, dk) {
  const rope = request.rope && typeof request.rope === "object" ? request.rope : {};
  return {
    base: rope.base ?? 10000,
    style: rope.style ?? "half",
    rotaryDim: rope.rotary_dim ?? dk,
    dk,
    scaling: rope.scaling ?? null,
  };
}

/** What the rotation used, from the answer: θ_i after the scaling, the factor on cos and sin,
 * and n = the largest query position + 1 (the length the scalings read); undefined when the
 * answer does not carry them.
 * @returns {{theta: number[], gain: number, n: number} | undefined} */
export function ropeUsed(ctx) {
  const { rope_frequencies: theta, rope_gain: gain, query_positions: p } = ctx.data;
  if (!Array.isArray(theta) || !Array.isArray(p)) return undefined;
  return {
    theta: theta.map(Number),
    gain: Number(gain ?? 1),
    n: p.length ? Math.max(...p) + 1 : 1,
  };
}

/** A scaling field's value, or its default as the service's schema gives it (factor 8 for
 * llama3). */
function scalingField(scaling, field) {
  if (scaling[field] !== undefined && scaling[field] !== null) return scaling[field];
  const schemas = state.spec ? state.spec.components.schemas : {};
  const name = Object.keys(schemas).find(
    (k) => k.endsWith("ScalingOptions") && typeOf(schemas[k]) === scaling.type,
  );
  return name ? schemas[name].properties[field]?.default : undefined;
}

/** The `type` a scaling's schema names (a literal: const, or an enum of one). */
function typeOf(schema) {
  const t = schema.properties && schema.properties.type;
  return t ? (t.const ?? (t.enum || [])[0]) : undefined;
}

const CLOSE = 1e-12; // a ratio this near 1 or 1/factor is that one (the page's pow and NumPy's)

/** The words for pair i of a scaling that mixes θ_i/f and θ_i (yarn, llama3): from the ratio
 * ρ = θ'_i / θ_i of the answer's θ to base^(−2i/r), the share s of θ_i: ρ = (1 − s)/f + s. */
function mixWords(type, i, ratio, f) {
  const g = (x) => formatNumber(x, 6, true);
  const yarn = type === "yarn";
  const who = yarn ? `θ_${i} ` : "";
  if (Math.abs(ratio - 1) <= CLOSE) return yarn ? `${who}kept` : "kept (short wavelength)";
  if (Math.abs(ratio * f - 1) <= CLOSE)
    return yarn ? `${who}interpolated: θ/${g(f)}` : `slowed: θ/${g(f)} (long wavelength)`;
  const s = (ratio - 1 / f) / (1 - 1 / f);
  return `${who}blended: ${g(1 - s)} of θ/${g(f)} + ${g(s)} of θ`;
}

/** What the scaling (or the proportional style) did to each pair's θ_i, in words: "kept",
 * "interpolated: θ/32", "blended: …", "base raised to …", "÷ long_factor[5] = 1.25", … ("" when
 * nothing changes it); from the answer's θ (`theta`) beside base^(−2i/r), and n.
 * @param {RopeSettings} settings
 * @param {number[]} theta
 * @param {number} n
 * @returns {string[]} */
export function pairScalings(settings, theta, n) {
  const { base, scaling } = settings;
  const g = (x) => formatNumber(x, 6, true);
  if (settings.style === "proportional")
    return theta.map((t, i) =>
      t === 0 ? "unturned (θ = 0)" : `turned: ${g(base)}^(−2·${i}/${settings.dk})`,
    );
  const r = 2 * theta.length;
  const plain = theta.map((_, i) => 1 / base ** ((2 * i) / r)); // base^(−2i/r), unscaled
  const type = scaling ? scaling.type : null;
  if (type === "linear") return theta.map(() => `θ kept; positions ÷ ${g(scaling.factor)}`);
  if (type === "llama3" || type === "yarn") {
    const f = Number(scalingField(scaling, "factor"));
    return theta.map((t, i) => mixWords(type, i, t / plain[i], f));
  }
  if (type === "dynamic") {
    const m = scaling.original_max_position;
    const grown = theta.length > 1 ? (1 / theta[1]) ** (r / 2) : base; // θ_1 = base'^(−2/r)
    const said =
      n > m
        ? `dynamic NTK: base raised to ${formatNumber(grown, 8, true)} (n = ${n} > ${m})`
        : `unchanged: n = ${n} ≤ ${m}`;
    return theta.map(() => said);
  }
  if (type === "longrope") {
    const name = n > scaling.original_max_position ? "long_factor" : "short_factor";
    return theta.map((t, i) => `θ ÷ ${name}[${i}] = ${g(plain[i] / t)}`);
  }
  return theta.map(() => "");
}

/** One sentence on the scaling for the note above the pairs: n where it matters, and the factor
 * on cos and sin (the answer's rope_gain) when it is not 1 ("" without scaling).
 * @param {RopeSettings} settings
 * @param {number} n
 * @param {number} gain
 * @returns {string} */
export function scalingNote(settings, n, gain) {
  const { scaling } = settings;
  if (!scaling) return "";
  const parts = [];
  if (scaling.type === "dynamic" || scaling.type === "longrope")
    parts.push(
      `n = ${n} (the largest query position + 1, keys too) against original_max_position ${scaling.original_max_position}`,
    );
  if (gain !== 1)
    parts.push(`cos and sin × ${formatNumber(gain, 6, true)} (${scaling.type}'s attention factor)`);
  return parts.length ? `${scaling.type} scaling: ${parts.join("; ")}.` : "";
}

/** The angle p·θ_i of each pair for a token at position p (p/factor with linear scaling, as
 * query_positions says the angles take it).
 * @param {RopeSettings} settings
 * @param {number[]} theta
 * @param {number} p
 * @returns {number[]} */
export function ropeAngles(settings, theta, p) {
  return theta.map((t) => anglePosition(settings, p) * t);
}

/** The position the angles take: p, or p/factor with linear scaling. */
export function anglePosition(settings, p) {
  return settings.scaling && settings.scaling.type === "linear" ? p / settings.scaling.factor : p;
}

/** The features RoPE turns in pairs: rotary_dim, or all of d_k with the proportional style.
 * @param {RopeSettings} settings
 * @returns {number} */
export function turnedWidth(settings) {
  return settings.style === "proportional" ? settings.dk : settings.rotaryDim;
}

/** The two features pair i turns: (2i, 2i+1) for "interleaved", else (i, i + width/2) ("half"
 * over rotary_dim, "proportional" over d_k: see turnedWidth).
 * @param {string} style
 * @param {number} width
 * @param {number} i
 * @returns {[number, number]} */
export function pairFeatures(style, width, i) {
  return style === "interleaved" ? [2 * i, 2 * i + 1] : [i, i + width / 2];
}

/** `x` turned pair by pair (positions.rope): (a, b) → (a·c − b·s, b·c + a·s) with c = cos φ · gain
 * and s = sin φ · gain (gain: the answer's rope_gain); features past the turned width unchanged.
 * @param {number[]} x
 * @param {number[]} angles
 * @param {RopeSettings} settings
 * @param {number} [gain]
 * @returns {number[]} */
export function rotate(x, angles, settings, gain = 1) {
  const out = x.slice();
  const width = turnedWidth(settings);
  angles.forEach((phi, i) => {
    const [f, g] = pairFeatures(settings.style, width, i);
    const a = x[f],
      b = x[g],
      c = Math.cos(phi) * gain,
      s = Math.sin(phi) * gain;
    out[f] = a * c - b * s;
    out[g] = b * c + a * s;
  });
  return out;
}

/** The ALiBi slope of head h (0-based): the answer's alibi_slopes[h]. */
export function alibiSlope(ctx, h) {
  return Number(ctx.data.alibi_slopes[h]);
}

/** ALiBi's bias of query i and key j: slope · (p'_j − p_i), or −slope · |p'_j − p_i| when symmetric. */
export function alibiBias(ctx, slope, i, j) {
  const distance = relativePosition(ctx, i, j);
  const symmetric = !!(ctx.request.alibi && ctx.request.alibi.symmetric);
  return { distance, symmetric, bias: slope * (symmetric ? -Math.abs(distance) : distance) };
}
