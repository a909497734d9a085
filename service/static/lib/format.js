// @ts-check
// How a value shows, a leaf: its number (three significant digits on the page), its colour
// (weights white → blue, signed values red → white → blue, a mask blue or white, masked cells
// grey), a label cut short, text escaped for SVG, a matrix as the text of a form box, what an
// array is (a matrix, a stack of them), and a count in words, its noun agreeing with it ("1
// decimal", "2 decimals": every sentence of the page that counts something says it so). Pure
// functions; imports nothing.

/** A label cut to `n` characters, the last an ellipsis. */
export function abbreviate(s, n) {
  s = String(s);
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}
export function escapeXml(s) {
  return String(s).replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c],
  );
}

/** rgbOf as a CSS colour (null for a masked cell, which is hatched instead). */
export function colour(v, kind, scale) {
  return v === null ? null : `rgb(${rgbOf(v, kind, scale).map(Math.round).join(",")})`;
}
export function dark(v, kind, scale) {
  if (v === null) return false;
  const t = kind === "mask" ? (v ? 1 : 0) : Math.abs(v / (scale || 1));
  return t > 0.55;
}

// Numbers: DIGITS significant digits; plain decimals from 1e-4 up to a million (whole numbers
// printed whole), exponent form outside (1.01e-6, 1.00e+22).
export const DIGITS = 3;
export function fmt(v) {
  return formatNumber(v, DIGITS, true);
}

/** `v` with `digits` significant digits; `trim`: drop trailing zeros (0.500 → 0.5). null is −∞
 * (the JSON's masked score), a boolean 1 or 0. */
export function formatNumber(v, digits, trim) {
  if (v === null) return "−∞";
  if (typeof v === "boolean") return v ? "1" : "0";
  if (typeof v !== "number") return String(v);
  if (!Number.isFinite(v)) return Number.isNaN(v) ? "NaN" : v > 0 ? "∞" : "−∞";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a < 1e-4 || a >= 1e6) return v.toExponential(digits - 1);
  const decimals = Math.max(0, digits - 1 - Math.floor(Math.log10(a)));
  let s = v.toFixed(Math.min(decimals, 20));
  if (trim && s.includes(".")) s = s.replace(/\.?0+$/, "");
  return s === "-0" ? "0" : s;
}

/** The largest |value| of a matrix (nulls and booleans skipped). */
export function maxAbs(m) {
  let s = 0;
  for (let i = 0; i < m.length; i++) {
    const row = m[i];
    for (let j = 0; j < row.length; j++) {
      const v = row[j];
      if (typeof v === "number" && (v > s || -v > s)) s = Math.abs(v);
    }
  }
  return s;
}

// `allowed` (optional, the response's mask) hatches masked cells whose value is a plain 0 (weights).
export const isMasked = (m, allowed, i, j) =>
  m[i][j] === null || (allowed && allowed[i] && allowed[i][j] === false);

// The colour of a value as [r, g, b]: weights white → blue by their share of the map's largest,
// signed values diverging (red below 0, blue above) by |value| ÷ the largest, a mask blue or white.
const WHITE = [255, 255, 255],
  BLUE = [36, 88, 166],
  RED = [179, 38, 30];
export const MASKED = [201, 206, 214];
export function rgbOf(v, kind, scale) {
  if (kind === "mask") return v ? BLUE : WHITE;
  let t,
    to = BLUE;
  if (kind === "weights") t = Math.max(0, Math.min(1, v / (scale || 1)));
  else {
    t = scale ? Math.max(-1, Math.min(1, v / scale)) : 0;
    if (t < 0) {
      t = -t;
      to = RED;
    }
  }
  return [255 + (to[0] - 255) * t, 255 + (to[1] - 255) * t, 255 + (to[2] - 255) * t];
}

export const isMatrix = (m) => Array.isArray(m) && Array.isArray(m[0]) && !Array.isArray(m[0][0]);
export const isStack = (m) => Array.isArray(m) && Array.isArray(m[0]) && Array.isArray(m[0][0]);

/** A matrix as the text of a form box: one row a line, or JSON for anything deeper. */
export function formatMatrix(m) {
  if (!Array.isArray(m)) return "";
  const flat = m.every((row) => Array.isArray(row) && row.every((v) => !Array.isArray(v)));
  return flat
    ? m.map((row) => row.map((v) => (v === null ? "null" : String(v))).join(" ")).join("\n")
    : JSON.stringify(m);
}

// ---- counted words ------------------------------------------------------------------------------

/** `one` when `n` is 1, else `many` (`one` + "s" unless given): plural(1, "has", "have"). */
export function plural(n, one, many = `${one}s`) {
  return n === 1 ? one : many;
}

/** `n` and its noun, agreeing: count(1, "decimal") is "1 decimal", count(2, "query", "queries")
 * "2 queries". */
export function count(n, one, many = `${one}s`) {
  return `${n} ${plural(n, one, many)}`;
}
