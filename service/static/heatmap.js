// Drawing: colours, number formatting, SVG and canvas heatmaps, legends.
import { download, exportPng, csvBlob } from "./export.js";

export const SMALL_MAP = 24 * 24; // up to this many cells: SVG with the value in every cell
export function escapeXml(s) { return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c])); }

export function colour(v, kind, scale) {
  if (v === null) return null;
  if (kind === "mask") return v ? "#2458a6" : "#ffffff";
  if (kind === "weights") { const t = Math.max(0, Math.min(1, v / (scale || 1))); return mix([255, 255, 255], [36, 88, 166], t); } // relative to the map's largest weight
  const t = scale ? Math.max(-1, Math.min(1, v / scale)) : 0; // diverging: red below 0, blue above
  return t < 0 ? mix([255, 255, 255], [179, 38, 30], -t) : mix([255, 255, 255], [36, 88, 166], t);
}
export function mix(a, b, t) { return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * t)).join(",")})`; }
export function dark(v, kind, scale) { if (v === null) return false; const t = kind === "mask" ? (v ? 1 : 0) : Math.abs(v / (scale || 1)); return t > 0.55; }
// Numbers: DIGITS significant digits, plain decimals (no exponent) from 1e-4 up.
export const DIGITS = 3;
export function fmt(v) {
  if (v === null) return "−∞";
  if (typeof v === "boolean") return v ? "1" : "0";
  if (typeof v !== "number") return String(v);
  if (!Number.isFinite(v)) return Number.isNaN(v) ? "NaN" : v > 0 ? "∞" : "−∞";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a < 1e-4) return v.toExponential(DIGITS - 1);
  const decimals = Math.max(0, DIGITS - 1 - Math.floor(Math.log10(a)));
  let s = v.toFixed(Math.min(decimals, 20));
  if (s.includes(".")) s = s.replace(/\.?0+$/, "");
  return s === "-0" ? "0" : s;
}

// The colour legend of a map: a sequential bar (0 … the largest weight) for weights, a diverging
// one (−m … 0 … m) for signed values, two swatches for a mask; the numbers at its ends.
export function legendSvg(kind, scale, hasMasked) {
  const w = 270, bar = 160, x0 = 30;
  const parts = [`<svg class="legend" xmlns="http://www.w3.org/2000/svg" width="${w}" height="34" viewBox="0 0 ${w} 34" font-family="system-ui, sans-serif" font-size="10" role="img" aria-label="${kind === "mask" ? "colour legend: blue may attend, white masked" : `colour legend from ${kind === "weights" ? "0" : fmt(-scale)} to ${fmt(scale)}`}">`];
  if (kind === "mask") {
    parts.push('<rect x="2" y="4" width="14" height="12" fill="#2458a6"/><text x="20" y="14">may attend</text>',
      '<rect x="90" y="4" width="14" height="12" fill="#fff" stroke="#c9ced6"/><text x="108" y="14">masked</text>');
  } else {
    const id = `lg-${kind}-${Math.random().toString(36).slice(2, 8)}`;
    const stops = kind === "weights" ? [[0, "#ffffff"], [1, "#2458a6"]] : [[0, "#b3261e"], [0.5, "#ffffff"], [1, "#2458a6"]];
    parts.push(`<defs><linearGradient id="${id}">${stops.map(([o, c]) => `<stop offset="${o}" stop-color="${c}"/>`).join("")}</linearGradient></defs>`,
      `<rect x="${x0}" y="3" width="${bar}" height="10" fill="url(#${id})" stroke="#c9ced6"/>`,
      `<text x="${x0}" y="26" text-anchor="middle">${escapeXml(kind === "weights" ? "0" : fmt(-scale))}</text>`,
      `<text x="${x0 + bar}" y="26" text-anchor="middle">${escapeXml(fmt(scale))}</text>`);
    if (kind !== "weights") parts.push(`<text x="${x0 + bar / 2}" y="26" text-anchor="middle">0</text>`);
    if (hasMasked) parts.push(`<rect x="${x0 + bar + 26}" y="3" width="10" height="10" fill="#c9ced6" stroke="#7d8794"/><text x="${x0 + bar + 40}" y="12">masked</text>`);
  }
  parts.push("</svg>");
  return parts.join("");
}
export function maxAbs(m) { let s = 0; for (const row of m) for (const v of row) if (typeof v === "number") s = Math.max(s, Math.abs(v)); return s; }

// `allowed` (optional, the response's mask) hatches masked cells whose value is a plain 0 (weights).
export const isMasked = (m, allowed, i, j) => m[i][j] === null || (allowed && allowed[i] && allowed[i][j] === false);

// `titled`: the title at the top (exported files); on the page the card's caption says it, and
// the picture names its axes instead.
export function svgString(title, m, rows, cols, kind, withValues, allowed, titled = true, clickable = false) {
  const cell = withValues ? 44 : Math.max(3, Math.min(14, Math.floor(900 / Math.max(1, cols.length))));
  const labelW = withValues ? 70 : 0;
  const top = withValues ? 44 : 24;
  const w = labelW + cell * cols.length + 10;
  const h = top + cell * rows.length + 10;
  const scale = maxAbs(m);
  const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" font-family="system-ui, sans-serif" font-size="11" role="${clickable ? "group" : "img"}" aria-label="${escapeXml(title)}">`,
    '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#c9ced6"/><line x1="0" y1="0" x2="0" y2="6" stroke="#7d8794" stroke-width="2"/></pattern></defs>',
    `<rect width="${w}" height="${h}" fill="#fff"/>${titled ? `<text x="4" y="14" font-weight="600">${escapeXml(title)}</text>` : `<text class="axis-name" x="4" y="14" fill="#5b6775">queries ↓  keys →</text>`}`];
  if (withValues) {
    cols.forEach((c, j) => parts.push(`<text class="col-label" x="${labelW + j * cell + cell / 2}" y="${top - 6}" text-anchor="middle">${escapeXml(c)}</text>`));
    rows.forEach((r, i) => parts.push(`<text class="row-label" x="${labelW - 6}" y="${top + i * cell + cell / 2 + 4}" text-anchor="end">${escapeXml(r)}</text>`));
  }
  m.forEach((row, i) => row.forEach((v, j) => {
    const masked = isMasked(m, allowed, i, j);
    const fill = masked ? "url(#hatch)" : colour(v, kind, scale);
    const value = v === null ? "null" : String(v);
    parts.push(`<rect class="cell${masked ? " masked" : ""}"${clickable ? ' tabindex="0" role="button"' : ""} data-row="${i}" data-col="${j}" data-value="${value}" x="${labelW + j * cell}" y="${top + i * cell}" width="${cell}" height="${cell}" fill="${fill}" stroke="#dde2e8" stroke-width="${withValues ? 1 : 0}"><title>${escapeXml(rows[i])} → ${escapeXml(cols[j])}: ${escapeXml(fmt(v))}${masked ? " (masked)" : ""}</title></rect>`);
    if (withValues) parts.push(`<text x="${labelW + j * cell + cell / 2}" y="${top + i * cell + cell / 2 + 4}" text-anchor="middle" pointer-events="none" fill="${!masked && dark(v, kind, scale) ? "#fff" : "#1d232b"}">${escapeXml(fmt(v))}</text>`);
  }));
  parts.push("</svg>");
  return parts.join("");
}

// Axis labels of a canvas map at any size: abbreviated, the keys' rotated, thinned to one every
// `step` so that they never overlap; the axis names in the corner.
function abbreviate(s, n) { s = String(s); return s.length > n ? `${s.slice(0, n - 1)}…` : s; }
function drawLabels(ctx, { rows, cols }, cell, ox, oy) {
  ctx.fillStyle = "#5b6775"; ctx.font = "10px system-ui, sans-serif";
  ctx.textBaseline = "middle"; ctx.textAlign = "right";
  const step = Math.max(1, Math.ceil(12 / cell));
  for (let i = 0; i < rows.length; i += step) ctx.fillText(abbreviate(rows[i], 10), ox - 4, oy + i * cell + cell / 2);
  for (let j = 0; j < cols.length; j += step) {
    ctx.save(); ctx.translate(ox + j * cell + cell / 2, oy - 4); ctx.rotate(-Math.PI / 3);
    ctx.textAlign = "left"; ctx.fillText(abbreviate(cols[j], 8), 0, 0); ctx.restore();
  }
  ctx.textAlign = "left"; ctx.fillStyle = "#1d232b";
  ctx.fillText("keys →", 2, 10); ctx.fillText("queries ↓", 2, oy - 8);
}

// The colour of a value as [r, g, b] (colour() gives the same as a CSS string).
const WHITE = [255, 255, 255], BLUE = [36, 88, 166], RED = [179, 38, 30], MASKED = [201, 206, 214];
function rgbOf(v, kind, scale) {
  if (kind === "mask") return v ? BLUE : WHITE;
  let t, to = BLUE;
  if (kind === "weights") t = Math.max(0, Math.min(1, v / (scale || 1)));
  else { t = scale ? Math.max(-1, Math.min(1, v / scale)) : 0; if (t < 0) { t = -t; to = RED; } }
  return [255 + (to[0] - 255) * t, 255 + (to[1] - 255) * t, 255 + (to[2] - 255) * t];
}

// One pixel per cell into an ImageData, scaled up without smoothing: a 2048 × 2048 map draws in
// tens of milliseconds where a fillRect per cell takes seconds. The picture is kept per canvas so
// that moving the keyboard cursor redraws only the cursor.
const drawnBase = new WeakMap();
export const LABEL_W = 64, LABEL_H = 52; // room for the axis labels of a canvas map
export function drawCanvas(canvas, m, kind, cell, cursor, allowed, labels = null) {
  const rows = m.length, cols = m[0].length;
  const ox = labels ? LABEL_W : 0, oy = labels ? LABEL_H : 0;
  canvas.dataset.ox = ox; canvas.dataset.oy = oy; canvas.dataset.cell = cell;
  let base = drawnBase.get(canvas);
  if (!base || base.m !== m || base.kind !== kind) {
    const scale = maxAbs(m);
    const img = new ImageData(cols, rows);
    const px = img.data;
    const masked = [];
    for (let i = 0; i < rows; i++) {
      const row = m[i], ok = allowed && allowed[i];
      for (let j = 0; j < cols; j++) {
        const v = row[j];
        const isM = v === null || (ok && ok[j] === false);
        const c = isM ? MASKED : rgbOf(v, kind, scale);
        const p = (i * cols + j) * 4;
        px[p] = c[0]; px[p + 1] = c[1]; px[p + 2] = c[2]; px[p + 3] = 255;
        if (isM) masked.push(i, j);
      }
    }
    const off = document.createElement("canvas");
    off.width = cols; off.height = rows;
    off.getContext("2d").putImageData(img, 0, 0);
    base = { m, kind, off, masked };
    drawnBase.set(canvas, base);
  }
  if (canvas.width !== ox + cols * cell) canvas.width = ox + cols * cell;
  if (canvas.height !== oy + rows * cell) canvas.height = oy + rows * cell;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  if (labels) { ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height); drawLabels(ctx, labels, cell, ox, oy); }
  ctx.translate(ox, oy);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(base.off, 0, 0, cols * cell, rows * cell);
  if (cell >= 4 && base.masked.length) { // hatch the masked cells
    ctx.strokeStyle = "#7d8794"; ctx.lineWidth = 1; ctx.beginPath();
    for (let k = 0; k < base.masked.length; k += 2) {
      const i = base.masked[k], j = base.masked[k + 1];
      ctx.moveTo(j * cell, (i + 1) * cell); ctx.lineTo((j + 1) * cell, i * cell);
    }
    ctx.stroke();
  }
  if (cursor) { ctx.strokeStyle = "#f2b705"; ctx.lineWidth = 2; ctx.strokeRect(cursor[1] * cell, cursor[0] * cell, cell, cell); }
}

// A card with a map: SVG with every value for a small one, a canvas with a keyboard cursor for a
// large one. `onCell(i, j)` (optional): a click or Enter on a cell (the explanation hook).
export function heatmap(key, title, m, rows, cols, kind, allowed, onCell = null) {
  const fig = document.createElement("figure");
  fig.className = "heatmap"; fig.dataset.name = key;
  const caption = document.createElement("figcaption");
  caption.append(title);
  const svgButton = button("SVG", () => download(`${key}.svg`, new Blob([svgString(title, m, rows, cols, kind, rows.length * cols.length <= SMALL_MAP, allowed)], { type: "image/svg+xml" })));
  const pngButton = button("PNG", () => exportPng(key, m, rows, cols, kind, allowed));
  const csvButton = button("CSV", () => download(`${key}.csv`, csvBlob(m, rows, cols)));
  svgButton.setAttribute("aria-label", `Download ${title} as SVG`); pngButton.setAttribute("aria-label", `Download ${title} as PNG`);
  csvButton.setAttribute("aria-label", `Download ${title} as CSV`);
  caption.append(svgButton, pngButton, csvButton);
  fig.append(caption);
  const scroll = document.createElement("div"); scroll.className = "map-scroll";
  const readout = document.createElement("div"); readout.className = "cell-readout"; readout.setAttribute("aria-live", "polite");
  const say = (i, j) => { readout.textContent = `${rows[i]} → ${cols[j]}: ${fmt(m[i][j])}${isMasked(m, allowed, i, j) ? " (masked)" : ""}`; };
  if (onCell) fig.classList.add("explainable");
  if (rows.length * cols.length <= SMALL_MAP) {
    scroll.innerHTML = svgString(title, m, rows, cols, kind, true, allowed, false, !!onCell);
    scroll.addEventListener("mouseover", (e) => { const c = e.target.closest("rect.cell"); if (c) say(+c.dataset.row, +c.dataset.col); });
    scroll.addEventListener("focusin", (e) => { const c = e.target.closest("rect.cell"); if (c) say(+c.dataset.row, +c.dataset.col); });
    if (onCell) {
      scroll.addEventListener("click", (e) => { const c = e.target.closest("rect.cell"); if (c) onCell(+c.dataset.row, +c.dataset.col); });
      scroll.addEventListener("keydown", (e) => {
        const c = e.target.closest && e.target.closest("rect.cell");
        if (c && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); onCell(+c.dataset.row, +c.dataset.col); }
      });
    }
  } else {
    const canvas = document.createElement("canvas");
    const labels = { rows, cols };
    // zoom: from "fit" (the card's width) up to what a canvas can hold; pan: scroll or drag
    const maxCell = Math.max(1, Math.min(24, Math.floor(Math.min(16000 / cols.length, 16000 / rows.length, Math.sqrt(6e7 / (rows.length * cols.length))))));
    const fitCell = () => {
      const room = (document.getElementById("heatmaps") || {}).clientWidth || 900;
      return Math.max(1, Math.min(12, maxCell, Math.floor((Math.min(room, 1200) - 40 - LABEL_W) / cols.length)));
    };
    let cell = fitCell();
    canvas.tabIndex = 0; canvas.dataset.rows = rows.length; canvas.dataset.cols = cols.length;
    canvas.setAttribute("role", "img"); canvas.setAttribute("aria-label", `${title}: ${rows.length} × ${cols.length}; arrow keys read cells${onCell ? ", Enter explains one" : ""}`);
    let cursor = null;
    const redraw = () => drawCanvas(canvas, m, kind, cell, cursor, allowed, labels);
    redraw();
    const at = (e) => {
      const r = canvas.getBoundingClientRect();
      const k = canvas.width / r.width;
      const x = (e.clientX - r.left) * k - Number(canvas.dataset.ox), y = (e.clientY - r.top) * k - Number(canvas.dataset.oy);
      const i = Math.floor(y / cell), j = Math.floor(x / cell);
      return i >= 0 && j >= 0 && i < rows.length && j < cols.length ? [i, j] : null;
    };
    let drag = null; // pointer panning; a drag is not a click
    canvas.addEventListener("pointerdown", (e) => { drag = { x: e.clientX, y: e.clientY, left: scroll.scrollLeft, top: scroll.scrollTop, moved: false }; });
    canvas.addEventListener("pointermove", (e) => {
      const c = at(e); if (c) say(c[0], c[1]);
      if (drag && e.buttons) {
        const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 4) drag.moved = true;
        if (drag.moved) { scroll.scrollLeft = drag.left - dx; scroll.scrollTop = drag.top - dy; }
      }
    });
    canvas.addEventListener("click", (e) => {
      const moved = drag && drag.moved; drag = null;
      if (moved) return;
      const c = at(e);
      if (!c) return;
      cursor = c; redraw(); say(c[0], c[1]);
      if (onCell) onCell(c[0], c[1]);
    });
    canvas.addEventListener("keydown", (e) => {
      if (onCell && e.key === "Enter") { e.preventDefault(); onCell(...(cursor || [0, 0])); return; }
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      if (!moves[e.key]) return;
      e.preventDefault();
      const c = cursor || [0, 0];
      cursor = [Math.max(0, Math.min(rows.length - 1, c[0] + moves[e.key][0])), Math.max(0, Math.min(cols.length - 1, c[1] + moves[e.key][1]))];
      redraw(); say(cursor[0], cursor[1]);
    });
    canvas.addEventListener("focus", () => { if (!cursor) { cursor = [0, 0]; redraw(); } say(cursor[0], cursor[1]); });
    const zoomBar = document.createElement("div"); zoomBar.className = "zoom";
    const size = document.createElement("span"); size.className = "zoom-size";
    const zoom = (next) => {
      next = Math.max(1, Math.min(maxCell, next));
      if (next === cell) return;
      // keep the middle of the view where it was
      const cx = (scroll.scrollLeft + scroll.clientWidth / 2) / cell, cy = (scroll.scrollTop + scroll.clientHeight / 2) / cell;
      cell = next; redraw();
      scroll.scrollLeft = cx * cell - scroll.clientWidth / 2; scroll.scrollTop = cy * cell - scroll.clientHeight / 2;
      size.textContent = `${cell} px a cell`;
    };
    const zin = button("+", () => zoom(cell * 2)), zout = button("−", () => zoom(Math.floor(cell / 2))), zfit = button("fit", () => zoom(fitCell()));
    zin.setAttribute("aria-label", `Zoom in on ${title}`); zout.setAttribute("aria-label", `Zoom out of ${title}`); zfit.setAttribute("aria-label", `Fit ${title} to the card`);
    size.textContent = `${cell} px a cell`;
    zoomBar.append("Zoom ", zout, zin, zfit, size);
    fig.append(zoomBar);
    scroll.append(canvas);
  }
  const legend = document.createElement("div"); legend.className = "legend-box";
  let anyMasked = false;
  for (let i = 0; i < m.length && !anyMasked; i++) for (let j = 0; j < m[i].length; j++) if (isMasked(m, allowed, i, j)) { anyMasked = true; break; }
  legend.innerHTML = legendSvg(kind, maxAbs(m), anyMasked);
  fig.append(scroll, legend, readout);
  return fig;
}

export function button(text, onClick) { const b = document.createElement("button"); b.type = "button"; b.textContent = text; b.addEventListener("click", onClick); return b; }
