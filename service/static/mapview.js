// @ts-check
// A large map on a canvas the size of the view, not of the map: the map's colours are made once
// as one pixel per cell (an offscreen canvas); each redraw copies the visible part at the current
// zoom and adds what fits at that zoom (the labels of the visible rows and keys, hatching of
// masked cells, a grid, the values). A redraw costs the same at L = 64 and at L = 4096, and no
// canvas grows with the map: from "fit" (the whole map in the card, a fraction of a pixel a cell)
// up to cells wide enough to print their values.
import { abbreviate, fmt, rgbOf, isMasked, MASKED } from "./lib/format.js";
import { picture, hatch, HATCH_FROM } from "./lib/picture.js";

export const LABEL_W = 64,
  LABEL_H = 52; // room for the axis labels
const MAX_CELL = 64; // px a cell at the closest zoom
const VALUES_FROM = 40; // px a cell from which the values are printed in the cells
const GRID_FROM = 10; // px a cell from which cell borders are drawn

/**
 * A zoomable, pannable view of `m` on `canvas`. `rows`, `cols`: the axis labels; `axes`: the
 * names of the two axes (queries and keys, or e.g. queries and features). The view keeps
 * `cell` (px a cell), `top`/`left` (the first visible row and key, fractional while panning),
 * `cursor` [i, j] (the keyboard's cell) and `marks` (cells outlined, e.g. a first difference).
 * The canvas carries data-cell, data-ox, data-oy, data-top, data-left (the view, in cells) for
 * tests and tools.
 */
export class MapView {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {(number | null)[][]} m
   * @param {(string | number)[]} rows
   * @param {(string | number)[]} cols
   * @param {string} kind
   * @param {boolean[][] | null} allowed
   * @param {number} scale
   * @param {() => void} [onDraw]
   * @param {string[]} [axes]
   */
  constructor(
    canvas,
    m,
    rows,
    cols,
    kind,
    allowed,
    scale,
    onDraw = () => {},
    axes = ["queries", "keys"],
  ) {
    // one assignment each (not Object.assign) so that the type checker knows the fields
    this.canvas = canvas;
    this.m = m;
    this.rows = rows;
    this.cols = cols;
    this.kind = kind;
    this.allowed = allowed;
    this.scale = scale;
    this.onDraw = onDraw;
    this.axes = axes;
    this.nRows = m.length;
    this.nCols = m[0].length;
    this.base = null; // made on the first draw: a map never shown costs nothing
    this.cell = 0;
    this.top = 0;
    this.left = 0;
    this.width = 0;
    this.viewW = 0;
    this.viewH = 0;
    this.dpr = 0;
    this.cursor = null;
    this.marks = [];
    this.fitted = true;
  }

  /** Px a cell at which the whole map fits `width` px and a view of `height` px. */
  fitCell(width, height) {
    const c = Math.min((width - LABEL_W) / this.nCols, (height - LABEL_H) / this.nRows);
    return c >= 1 ? Math.min(MAX_CELL, Math.floor(c)) : Math.max(c, 1 / 64);
  }

  maxHeight() {
    return Math.max(320, Math.round(window.innerHeight * 0.8));
  }

  /** The card's width changed (or was first known): refit unless the user zoomed. */
  resize(width) {
    if (width <= 0 || (width === this.width && this.cell)) return;
    this.width = width;
    if (this.fitted || !this.cell) this.cell = this.fitCell(width, this.maxHeight());
    this.draw();
  }

  visible() {
    const w = this.viewW - LABEL_W,
      h = this.viewH - LABEL_H;
    return { cols: w / this.cell, rows: h / this.cell };
  }

  clamp() {
    const v = this.visible();
    this.left = Math.max(0, Math.min(this.left, this.nCols - v.cols));
    this.top = Math.max(0, Math.min(this.top, this.nRows - v.rows));
  }

  draw() {
    if (!this.width) return;
    if (!this.base) this.base = picture(this.m, this.kind, this.allowed, this.scale);
    const { canvas, cell } = this;
    const w = Math.min(this.width, Math.ceil(LABEL_W + this.nCols * cell));
    const h = Math.min(this.maxHeight(), Math.ceil(LABEL_H + this.nRows * cell));
    // the view in CSS pixels; the canvas holds devicePixelRatio times as many (sharp on HiDPI)
    const dpr = window.devicePixelRatio || 1;
    if (this.viewW !== w || this.viewH !== h || this.dpr !== dpr) {
      Object.assign(this, { viewW: w, viewH: h, dpr });
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
      canvas.style.width = `${w}px`;
      canvas.style.height = `${h}px`;
    }
    this.clamp();
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, h);
    const v = this.visible();
    const i0 = Math.floor(this.top),
      j0 = Math.floor(this.left);
    const i1 = Math.min(this.nRows, Math.ceil(this.top + v.rows)),
      j1 = Math.min(this.nCols, Math.ceil(this.left + v.cols));
    // (x, y) of cell (i, j)'s top-left corner: dx + j * cell, dy + i * cell
    const dx = LABEL_W - this.left * cell,
      dy = LABEL_H - this.top * cell;
    this.labels(ctx, i0, i1, j0, j1, dx, dy);
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABEL_W, LABEL_H, w - LABEL_W, h - LABEL_H);
    ctx.clip();
    ctx.imageSmoothingEnabled = cell < 1;
    ctx.drawImage(
      this.base.off,
      j0,
      i0,
      j1 - j0,
      i1 - i0,
      dx + j0 * cell,
      dy + i0 * cell,
      (j1 - j0) * cell,
      (i1 - i0) * cell,
    );
    if (cell >= HATCH_FROM) hatch(ctx, this.m, this.allowed, i0, i1, j0, j1, cell, dx, dy);
    if (cell >= GRID_FROM) this.grid(ctx, i0, i1, j0, j1, dx, dy);
    if (cell >= VALUES_FROM) this.values(ctx, i0, i1, j0, j1, dx, dy);
    ctx.lineWidth = 2;
    for (const [i, j] of this.marks) {
      ctx.strokeStyle = "#111";
      ctx.strokeRect(dx + j * cell, dy + i * cell, Math.max(cell, 3), Math.max(cell, 3));
    }
    if (this.cursor) {
      ctx.strokeStyle = "#f2b705";
      ctx.strokeRect(
        dx + this.cursor[1] * cell,
        dy + this.cursor[0] * cell,
        Math.max(cell, 3),
        Math.max(cell, 3),
      );
    }
    ctx.restore();
    Object.assign(canvas.dataset, {
      cell: String(cell),
      ox: String(LABEL_W),
      oy: String(LABEL_H),
      top: String(this.top),
      left: String(this.left),
    });
    this.onDraw();
  }

  // The labels of the visible rows and keys (the keys' rotated), thinned to one every `step` so
  // that they never overlap, abbreviated; the axis names in the corner.
  labels(ctx, i0, i1, j0, j1, dx, dy) {
    const { cell } = this;
    ctx.fillStyle = "#3d4753";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    const step = Math.max(1, Math.ceil(13 / cell));
    for (let i = Math.ceil(i0 / step) * step; i < i1; i += step) {
      const y = dy + i * cell + Math.min(cell, 13) / 2;
      if (y >= LABEL_H) ctx.fillText(abbreviate(this.rows[i] ?? i, 9), LABEL_W - 4, y);
    }
    ctx.textAlign = "left";
    for (let j = Math.ceil(j0 / step) * step; j < j1; j += step) {
      const x = dx + j * cell + Math.min(cell, 13) / 2;
      if (x < LABEL_W) continue;
      ctx.save();
      ctx.translate(x, LABEL_H - 4);
      ctx.rotate(-Math.PI / 3);
      ctx.fillText(abbreviate(this.cols[j] ?? j, 8), 0, 0);
      ctx.restore();
    }
    ctx.fillStyle = "#1d232b";
    ctx.fillText(`${this.axes[1]} →`, 2, 10);
    ctx.fillText(`${this.axes[0]} ↓`, 2, LABEL_H - 8);
  }

  grid(ctx, i0, i1, j0, j1, dx, dy) {
    ctx.strokeStyle = "#dde2e8";
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (let i = i0; i <= i1; i++) {
      ctx.moveTo(dx + j0 * this.cell, dy + i * this.cell + 0.5);
      ctx.lineTo(dx + j1 * this.cell, dy + i * this.cell + 0.5);
    }
    for (let j = j0; j <= j1; j++) {
      ctx.moveTo(dx + j * this.cell + 0.5, dy + i0 * this.cell);
      ctx.lineTo(dx + j * this.cell + 0.5, dy + i1 * this.cell);
    }
    ctx.stroke();
  }

  values(ctx, i0, i1, j0, j1, dx, dy) {
    const { cell, m } = this;
    ctx.font = `${cell >= 56 ? 12 : 11}px system-ui, sans-serif`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let i = i0; i < i1; i++)
      for (let j = j0; j < j1; j++) {
        const masked = isMasked(m, this.allowed, i, j);
        const c = masked ? MASKED : rgbOf(m[i][j], this.kind, this.base.scale);
        ctx.fillStyle = c[0] * 0.299 + c[1] * 0.587 + c[2] * 0.114 < 140 ? "#fff" : "#1d232b";
        ctx.fillText(fmt(m[i][j]), dx + (j + 0.5) * cell, dy + (i + 0.5) * cell);
      }
  }

  /** The cell under a pointer event, or null. */
  at(e) {
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left - LABEL_W,
      y = e.clientY - r.top - LABEL_H;
    if (x < 0 || y < 0) return null;
    const i = Math.floor(this.top + y / this.cell),
      j = Math.floor(this.left + x / this.cell);
    return i < this.nRows && j < this.nCols ? [i, j] : null;
  }

  /** Zoom to `next` px a cell, keeping the cell at view point (vx, vy) (default: the middle) in place. */
  zoom(next, vx = null, vy = null) {
    const fit = this.fitCell(this.width, this.maxHeight());
    if (next >= 1) next = next > this.cell ? Math.round(next) : Math.floor(next); // whole pixels from 1 up
    next = Math.max(Math.min(fit, 1), Math.min(MAX_CELL, next));
    if (next === this.cell) return;
    const v = this.visible();
    const px = vx ?? (v.cols * this.cell) / 2,
      py = vy ?? (v.rows * this.cell) / 2;
    const ci = this.top + py / this.cell,
      cj = this.left + px / this.cell;
    this.cell = next;
    this.fitted = next === fit;
    this.top = ci - py / next;
    this.left = cj - px / next;
    this.draw();
  }

  fit() {
    this.fitted = true;
    this.cell = this.fitCell(this.width, this.maxHeight());
    this.top = 0;
    this.left = 0;
    this.draw();
  }

  /** Pan by (dx, dy) px. */
  pan(dx, dy) {
    this.left += dx / this.cell;
    this.top += dy / this.cell;
    this.draw();
  }

  /** Bring cell (i, j) into view (the middle of it when it is out of view). */
  show(i, j) {
    const v = this.visible();
    if (i < this.top || i + 1 > this.top + v.rows) this.top = i + 0.5 - v.rows / 2;
    if (j < this.left || j + 1 > this.left + v.cols) this.left = j + 0.5 - v.cols / 2;
    this.draw();
  }

  setCursor(c) {
    this.cursor = c;
    this.show(c[0], c[1]);
  }

  mark(i, j) {
    this.marks.push([i, j]);
    this.show(i, j);
  }
}

/** How a view's zoom reads: "12 px a cell", or "4 cells a px" below one. */
export function zoomText(cell) {
  return cell >= 1
    ? `${cell} px a cell`
    : `${(1 / cell).toFixed(1).replace(/\.0$/, "")} cells a px`;
}
