// @ts-check
// The position variants as the explanations recompute them from a request (API 2.6): RoPE's
// frequencies, angles and rotation, and ALiBi's slopes and bias. The page's own arithmetic, in
// float64 as the service's; a browser test checks it against the service's q_rotated, k_rotated
// and position_bias.

/** The rows' positions: `positions` for queries, `context_positions` for keys (each 0 … n−1 when
 * absent, each [B][n] when batched). */
export function positionOf(request, field, r, batch) {
  let pos = request[field];
  if (Array.isArray(pos) && Array.isArray(pos[0])) pos = pos[batch ?? 0];
  return Array.isArray(pos) ? pos[r] : r;
}

/** The relative position p'_j − p_i of key j seen from query i (negative for earlier keys). */
export function relativePosition(request, i, j, batch) {
  return (
    positionOf(request, "context_positions", j, batch) - positionOf(request, "positions", i, batch)
  );
}

/** RoPE's settings with their defaults: `true` or {base, style, rotary_dim, scaling}. */
export function ropeSettings(request, dk) {
  const rope = request.rope && typeof request.rope === "object" ? request.rope : {};
  return {
    base: rope.base ?? 10000,
    style: rope.style ?? "half",
    rotaryDim: rope.rotary_dim ?? dk,
    scaling: rope.scaling ?? null,
  };
}

/** (rotary_dim/2): θ_i = base^(−2i/rotary_dim), rescaled as LLaMA 3.1 with llama3 scaling. */
export function ropeFrequencies({ base, rotaryDim, scaling }) {
  const theta = Array.from({ length: rotaryDim / 2 }, (_, i) => 1 / base ** ((2 * i) / rotaryDim));
  if (!scaling || scaling.type !== "llama3") return theta;
  const factor = scaling.factor ?? 8,
    low = scaling.low_freq_factor ?? 1,
    high = scaling.high_freq_factor ?? 4;
  const old = scaling.original_max_position ?? 8192;
  return theta.map((t) => {
    const wavelength = (2 * Math.PI) / t;
    if (wavelength < old / high) return t; // short waves kept
    if (wavelength > old / low) return t / factor; // long waves slowed
    const s = (old / wavelength - low) / (high - low);
    return (1 - s) * (t / factor) + s * t; // blended between
  });
}

/** The angle p·θ_i of each pair for a token at position p (p/factor with linear scaling). */
export function ropeAngles(settings, theta, p) {
  const scaled =
    settings.scaling && settings.scaling.type === "linear" ? p / settings.scaling.factor : p;
  return theta.map((t) => scaled * t);
}

/** The two features pair i turns: (i, i + r/2) for "half", (2i, 2i+1) for "interleaved". */
export function pairFeatures(style, rotaryDim, i) {
  return style === "half" ? [i, i + rotaryDim / 2] : [2 * i, 2 * i + 1];
}

/** `x` turned pair by pair: (a, b) → (a·cos φ − b·sin φ, b·cos φ + a·sin φ); features past
 * rotary_dim unchanged. */
export function rotate(x, angles, settings) {
  const out = x.slice();
  angles.forEach((phi, i) => {
    const [f, g] = pairFeatures(settings.style, settings.rotaryDim, i);
    const a = x[f],
      b = x[g],
      c = Math.cos(phi),
      s = Math.sin(phi);
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
