// @ts-check
// The position variants as the explanations recompute them from a request (API 2.6): RoPE's
// frequencies, angles and rotation, and ALiBi's slopes and bias. The page's own arithmetic, in
// float64 as the service's; a browser test checks it against the service's q_rotated, k_rotated
// and position_bias. RoPE follows service/core/positions.py and rope_scaling.py function by
// function (each names its own and the transformers function it follows).
import { formatNumber } from "./format.js";

/** The rows' positions: `positions` for queries, `context_positions` for keys (each 0 … n−1 when
 * absent, each [B][n] when batched). */
export function positionOf(request, field, r, batch) {
  let pos = request[field];
  if (Array.isArray(pos) && Array.isArray(pos[0])) pos = pos[batch ?? 0];
  return Array.isArray(pos) ? pos[r] : r;
}

/** The field holding the keys' positions: `context_positions`; without it, in self-attention
 * (the keys are the queries' own tokens: no context, no direct q/k/v, no past), the queries'
 * `positions`, as the service defaults them (a token has one position).
 * @param {any} request
 * @returns {"positions" | "context_positions"} */
export function keyPositions(request) {
  if (request.context_positions != null) return "context_positions";
  const direct = request.q != null && request.k != null && request.v != null;
  const own = request.context == null && request.past == null && !direct;
  return own ? "positions" : "context_positions";
}

/** The relative position p'_j − p_i of key j seen from query i (negative for earlier keys). */
export function relativePosition(request, i, j, batch) {
  return (
    positionOf(request, keyPositions(request), j, batch) -
    positionOf(request, "positions", i, batch)
  );
}

/**
 * @typedef {object} RopeSettings
 * @property {number} base
 * @property {"half" | "interleaved" | "proportional"} style
 * @property {number} rotaryDim the request's rotary_dim (d_k when absent)
 * @property {number} dk the head's width d_k
 * @property {any} scaling the request's `rope.scaling` object ({type, …}), or null
 */

/** RoPE's settings with their defaults: `true` or {base, style, rotary_dim, scaling}.
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

/** n = the largest query position + 1 (1 when there are none): the sequence's length, which
 * dynamic NTK and LongRoPE scale by, the keys taking the queries' (positions.sequence_length).
 * `L` is the number of queries, at 0 … L−1 when the request gives no `positions`.
 * @param {any} request
 * @param {number} L
 * @returns {number} */
export function sequenceLength(request, L) {
  const pos = request.positions;
  if (!Array.isArray(pos)) return Math.max(L, 1); // 0 … L−1
  return pos.length ? Math.max(...pos) + 1 : 1;
}

/** (r/2): θ_i = base^(−2i/r), computed as transformers does, 1 / base^(2i/r)
 * (rope_scaling.default_frequencies; transformers' _compute_default_rope_parameters).
 * @param {number} rotaryDim
 * @param {number} base
 * @returns {number[]} */
export function defaultFrequencies(rotaryDim, base) {
  return Array.from({ length: rotaryDim / 2 }, (_, i) => 1 / base ** ((2 * i) / rotaryDim));
}

// ---- the scalings (service/core/rope_scaling.py, one function each), float64 as the service

const LLAMA3 = { factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position: 8192 };
const YARN = { beta_fast: 32, beta_slow: 1, truncate: true };

/** LLaMA 3.1's bands (Llama3Scaling; transformers' _compute_llama3_parameters): with λ_i = 2π/θ_i,
 * θ_i kept when λ_i < M/high_freq_factor, ÷ factor when λ_i > M/low_freq_factor, and blended
 * (1 − s)·θ_i/factor + s·θ_i between. {theta, band, s} per pair.
 * @param {any} scaling
 * @param {number[]} theta
 * @returns {{theta: number, band: string, s: number}[]} */
export function llama3Bands(scaling, theta) {
  const {
    factor,
    low_freq_factor: low,
    high_freq_factor: high,
    original_max_position: old,
  } = { ...LLAMA3, ...scaling };
  return theta.map((t) => {
    const wavelen = (2 * Math.PI) / t;
    const s = (old / wavelen - low) / (high - low);
    if (wavelen > old / low) return { theta: t / factor, band: "slowed", s };
    if (wavelen < old / high) return { theta: t, band: "kept", s };
    return { theta: ((1 - s) * t) / factor + s * t, band: "blended", s };
  });
}

/** YaRN's ramp (YarnScaling._ramp; transformers' _compute_yarn_parameters: find_correction_range,
 * linear_ramp_factor): each pair's extrapolation share `kept` (1 kept … 0 interpolated) and the
 * ramp's ends, the pair indices turning beta_fast and beta_slow times over the original context.
 * @param {any} scaling
 * @param {number} rotaryDim
 * @param {number} base
 * @returns {{kept: number[], low: number, high: number}} */
export function yarnRamp(scaling, rotaryDim, base) {
  const { beta_fast, beta_slow, truncate } = { ...YARN, ...scaling };
  const correction = (rotations) => {
    const turns = scaling.original_max_position / (rotations * 2 * Math.PI);
    return (rotaryDim * Math.log(turns)) / (2 * Math.log(base));
  };
  let low = correction(beta_fast),
    high = correction(beta_slow);
  if (truncate) [low, high] = [Math.floor(low), Math.ceil(high)];
  [low, high] = [Math.max(low, 0), Math.min(high, rotaryDim - 1)];
  if (low === high) high += 0.001; // as transformers: no division by zero
  const kept = Array.from(
    { length: Math.floor(rotaryDim / 2) },
    (_, i) => 1 - Math.min(Math.max((i - low) / (high - low), 0), 1),
  );
  return { kept, low, high };
}

/** YaRN's θ_i (YarnScaling.frequencies): θ_i/factor·(1 − kept_i) + θ_i·kept_i.
 * @param {any} scaling
 * @param {number} rotaryDim
 * @param {number} base
 * @returns {number[]} */
export function yarnFrequencies(scaling, rotaryDim, base) {
  const { kept } = yarnRamp(scaling, rotaryDim, base);
  return defaultFrequencies(rotaryDim, base).map(
    (t, i) => (t / scaling.factor) * (1 - kept[i]) + t * kept[i],
  );
}

/** YaRN's mscale (transformers' get_mscale): 1 for scale ≤ 1, else 0.1·mscale·ln(scale) + 1.
 * @param {number} scale
 * @param {number} [mscale]
 * @returns {number} */
function yarnMscale(scale, mscale = 1) {
  return scale <= 1 ? 1 : 0.1 * mscale * Math.log(scale) + 1;
}

/** Dynamic NTK's base (DynamicScaling.grown_base; transformers' _compute_dynamic_ntk_parameters):
 * base·(f·n/M − (f − 1))^(r/(r − 2)) with n raised to M when shorter (then: the base itself).
 * @param {any} scaling
 * @param {number} rotaryDim
 * @param {number} base
 * @param {number} n
 * @returns {number} */
export function dynamicBase(scaling, rotaryDim, base, n) {
  const { factor, original_max_position: m } = scaling;
  const length = Math.max(n, m);
  return base * ((factor * length) / m - (factor - 1)) ** (rotaryDim / (rotaryDim - 2));
}

/** LongRoPE's per-pair factors (LongRopeScaling._factors; transformers'
 * _compute_longrope_parameters): long_factor when n > original_max_position, else short_factor.
 * @param {any} scaling
 * @param {number} n
 * @returns {{factors: number[], name: string}} */
export function longropeFactors(scaling, n) {
  const name = n > scaling.original_max_position ? "long_factor" : "short_factor";
  return { factors: scaling[name], name };
}

/** LongRoPE's θ_i (LongRopeScaling.frequencies): 1 / (factor_i · base^(2i/r)).
 * @param {any} scaling
 * @param {number} rotaryDim
 * @param {number} base
 * @param {number} n
 * @returns {number[]} */
export function longropeFrequencies(scaling, rotaryDim, base, n) {
  const { factors } = longropeFactors(scaling, n);
  return factors.map((f, i) => 1 / (f * base ** ((2 * i) / rotaryDim)));
}

/** The factor multiplying cos and sin (Scaling.attention_factor): YaRN's (given, else
 * mscale(f, mscale)/mscale(f, mscale_all_dim) when both are set, else 0.1·ln f + 1), LongRoPE's
 * (given, else √(1 + ln f / ln M), f = factor or max_position/M, 1 when f ≤ 1); 1 otherwise.
 * @param {RopeSettings} settings
 * @returns {number} */
export function attentionFactor({ scaling }) {
  if (!scaling) return 1;
  if (scaling.type === "yarn") {
    if (scaling.attention_factor != null) return scaling.attention_factor;
    if (scaling.mscale && scaling.mscale_all_dim)
      return (
        yarnMscale(scaling.factor, scaling.mscale) /
        yarnMscale(scaling.factor, scaling.mscale_all_dim)
      );
    return yarnMscale(scaling.factor);
  }
  if (scaling.type === "longrope") {
    if (scaling.attention_factor != null) return scaling.attention_factor;
    const m = scaling.original_max_position;
    const f = scaling.factor ?? (scaling.max_position || m) / m;
    return f <= 1 ? 1 : Math.sqrt(1 + Math.log(f) / Math.log(m));
  }
  return 1;
}

/** Proportional RoPE's θ (Gemma 4; positions.rope's "proportional" branch, transformers'
 * _compute_proportional_rope_parameters): d_k/2 pairs, θ_i = base^(−2i/d_k) for i < r/2, 0 (the
 * pair unturned) for the others.
 * @param {RopeSettings} settings
 * @returns {number[]} */
export function proportionalFrequencies({ base, rotaryDim, dk }) {
  const turned = defaultFrequencies(dk, base).slice(0, Math.floor(rotaryDim / 2));
  return [...turned, ...Array(dk / 2 - turned.length).fill(0)];
}

/** Each pair's θ_i for a sequence of length n (positions.rope_frequencies, and the proportional
 * style's): base^(−2i/r) as the scaling changes it (linear scaling turns the positions instead).
 * @param {RopeSettings} settings
 * @param {number} [n]
 * @returns {number[]} */
export function ropeFrequencies(settings, n = 1) {
  const { base, rotaryDim: r, scaling } = settings;
  if (settings.style === "proportional") return proportionalFrequencies(settings);
  const type = scaling ? scaling.type : null;
  if (type === "llama3")
    return llama3Bands(scaling, defaultFrequencies(r, base)).map((b) => b.theta);
  if (type === "yarn") return yarnFrequencies(scaling, r, base);
  if (type === "dynamic") return defaultFrequencies(r, dynamicBase(scaling, r, base, n));
  if (type === "longrope") return longropeFrequencies(scaling, r, base, n);
  return defaultFrequencies(r, base);
}

/** What the scaling (or the proportional style) did to each pair's θ_i, in words: "kept",
 * "interpolated: θ/32", "blended: …", "base raised to …", "÷ long_factor[5] = 1.25", … ("" when
 * nothing changes it).
 * @param {RopeSettings} settings
 * @param {number} n
 * @returns {string[]} */
export function pairScalings(settings, n) {
  const { base, rotaryDim: r, scaling } = settings;
  const g = (x) => formatNumber(x, 6, true);
  if (settings.style === "proportional")
    return proportionalFrequencies(settings).map((_, i) =>
      i < r / 2 ? `turned: ${g(base)}^(−2·${i}/${settings.dk})` : "unturned (θ = 0)",
    );
  const pairs = Array.from({ length: r / 2 }, (_, i) => i);
  const type = scaling ? scaling.type : null;
  if (type === "linear") return pairs.map(() => `θ kept; positions ÷ ${g(scaling.factor)}`);
  if (type === "llama3") {
    const factor = scaling.factor ?? LLAMA3.factor;
    return llama3Bands(scaling, defaultFrequencies(r, base)).map((b) =>
      b.band === "kept"
        ? "kept (short wavelength)"
        : b.band === "slowed"
          ? `slowed: θ/${g(factor)} (long wavelength)`
          : `blended: ${g(1 - b.s)} of θ/${g(factor)} + ${g(b.s)} of θ`,
    );
  }
  if (type === "yarn") {
    const { kept } = yarnRamp(scaling, r, base);
    return kept.map((k, i) =>
      k === 1
        ? `θ_${i} kept`
        : k === 0
          ? `θ_${i} interpolated: θ/${g(scaling.factor)}`
          : `θ_${i} blended: ${g(1 - k)} of θ/${g(scaling.factor)} + ${g(k)} of θ`,
    );
  }
  if (type === "dynamic") {
    const m = scaling.original_max_position;
    const said =
      n > m
        ? `dynamic NTK: base raised to ${formatNumber(dynamicBase(scaling, r, base, n), 8, true)} (n = ${n} > ${m})`
        : `unchanged: n = ${n} ≤ ${m}`;
    return pairs.map(() => said);
  }
  if (type === "longrope") {
    const { factors, name } = longropeFactors(scaling, n);
    return factors.map((f, i) => `θ ÷ ${name}[${i}] = ${g(f)}`);
  }
  return pairs.map(() => "");
}

/** One sentence on the scaling for the note above the pairs: n where it matters, and the factor
 * on cos and sin when it is not 1 ("" without scaling).
 * @param {RopeSettings} settings
 * @param {number} n
 * @returns {string} */
export function scalingNote(settings, n) {
  const { scaling } = settings;
  if (!scaling) return "";
  const parts = [];
  if (scaling.type === "dynamic" || scaling.type === "longrope")
    parts.push(
      `n = ${n} (the largest query position + 1, keys too) against original_max_position ${scaling.original_max_position}`,
    );
  const gain = attentionFactor(settings);
  if (gain !== 1)
    parts.push(`cos and sin × ${formatNumber(gain, 6, true)} (${scaling.type}'s attention factor)`);
  return parts.length ? `${scaling.type} scaling: ${parts.join("; ")}.` : "";
}

/** The angle p·θ_i of each pair for a token at position p (p/factor with linear scaling:
 * LinearScaling.positions, then positions.rope_angles).
 * @param {RopeSettings} settings
 * @param {number[]} theta
 * @param {number} p
 * @returns {number[]} */
export function ropeAngles(settings, theta, p) {
  const scaled =
    settings.scaling && settings.scaling.type === "linear" ? p / settings.scaling.factor : p;
  return theta.map((t) => scaled * t);
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
 * and s = sin φ · gain (gain: the scaling's attention factor); features past the turned width
 * unchanged.
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

/** The ALiBi slope of head h (0-based) of n (Press et al. 2022, the paper's rule for n not a
 * power of two), or the request's own `alibi.slopes[h]`. */
export function alibiSlope(request, h, n) {
  if (request.alibi && Array.isArray(request.alibi.slopes)) return request.alibi.slopes[h];
  const p = 2 ** Math.floor(Math.log2(n)); // the largest power of two ≤ n
  return h < p ? 2 ** ((-8 * (h + 1)) / p) : 2 ** ((-8 * (2 * (h - p) + 1)) / (2 * p));
}

/** ALiBi's bias of query i and key j: slope · (p'_j − p_i), or −slope · |p'_j − p_i| when symmetric. */
export function alibiBias(request, slope, i, j, batch) {
  const distance = relativePosition(request, i, j, batch);
  const symmetric = !!(request.alibi && request.alibi.symmetric);
  return { distance, symmetric, bias: slope * (symmetric ? -Math.abs(distance) : distance) };
}
