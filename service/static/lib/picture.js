// @ts-check
// A map's pixels, a leaf: its colours made once as one pixel per cell (an offscreen canvas, for
// the canvas view in mapview.js), the whole map drawn at a given size, masked cells hatched, and
// the PNG export. Imports only other leaves.
import { rgbOf, isMasked, maxAbs, MASKED } from "./format.js";
import { download } from "./files.js";

export const HATCH_FROM = 4; // px a cell from which masked cells are hatched

// The colours of a kind as 32-bit RGBA words (little-endian, as ImageData's bytes), LEVELS a side
// of white: a lookup per cell instead of a colour computed (and an array made) per cell.
const LEVELS = 255;
/** @type {(rgb: number[]) => number} */
const word = ([r, g, b]) =>
  ((255 << 24) | (Math.round(b) << 16) | (Math.round(g) << 8) | Math.round(r)) >>> 0;
function palette(kind, scale) {
  if (kind === "mask")
    return {
      lut: Uint32Array.of(word(rgbOf(false, kind, scale)), word(rgbOf(true, kind, scale))),
      index: (v) => (v ? 1 : 0),
    };
  const signed = kind !== "weights",
    s = scale || 1;
  const lut = new Uint32Array(signed ? 2 * LEVELS + 1 : LEVELS + 1);
  for (let k = 0; k < lut.length; k++)
    lut[k] = word(rgbOf(((signed ? k - LEVELS : k) / LEVELS) * s, kind, s));
  const index = signed
    ? (v) => LEVELS + Math.round(Math.max(-1, Math.min(1, v / s)) * LEVELS)
    : (v) => Math.round(Math.max(0, Math.min(1, v / s)) * LEVELS);
  return { lut, index };
}

/** The map's colours, one pixel a cell, made once per matrix; `scale`: its largest |value|. */
export function picture(m, kind, allowed, scale = maxAbs(m)) {
  const rows = m.length,
    cols = m[0].length;
  const img = new ImageData(cols, rows);
  const px = new Uint32Array(img.data.buffer); // one word a pixel
  const { lut, index } = palette(kind, scale);
  const masked = word(MASKED);
  for (let i = 0; i < rows; i++) {
    const row = m[i],
      ok = allowed && allowed[i],
      at = i * cols;
    for (let j = 0; j < cols; j++) {
      const v = row[j];
      px[at + j] = v === null || (ok && ok[j] === false) ? masked : lut[index(v)];
    }
  }
  const off = document.createElement("canvas");
  off.width = cols;
  off.height = rows;
  off.getContext("2d").putImageData(img, 0, 0);
  return { off, scale };
}

/** The whole map at `cell` px a cell, without labels (the PNG export). */
export function drawWhole(canvas, m, kind, cell, allowed) {
  const { off } = picture(m, kind, allowed);
  canvas.width = Math.max(1, Math.round(m[0].length * cell));
  canvas.height = Math.max(1, Math.round(m.length * cell));
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = cell < 1; // below a pixel a cell, neighbours are averaged
  ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  if (cell >= HATCH_FROM) hatch(ctx, m, allowed, 0, m.length, 0, m[0].length, cell, 0, 0);
}

export function hatch(ctx, m, allowed, i0, i1, j0, j1, cell, dx, dy) {
  ctx.strokeStyle = "#7d8794";
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (let i = i0; i < i1; i++)
    for (let j = j0; j < j1; j++) {
      if (!isMasked(m, allowed, i, j)) continue;
      ctx.moveTo(dx + j * cell, dy + (i + 1) * cell);
      ctx.lineTo(dx + (j + 1) * cell, dy + i * cell);
    }
  ctx.stroke();
}

// The whole map, at most PNG_SIDE px a side (a cell is then less than a pixel: neighbours averaged).
const PNG_SIDE = 2048;
export function exportPng(name, m, rows, cols, kind, allowed) {
  const fit = PNG_SIDE / Math.max(cols.length, rows.length);
  const cell = Math.min(40, fit >= 1 ? Math.floor(fit) : fit); // whole pixels a cell from 1 up
  const canvas = document.createElement("canvas");
  drawWhole(canvas, m, kind, cell, allowed);
  canvas.toBlob((blob) => download(`${name}.png`, blob), "image/png");
}
