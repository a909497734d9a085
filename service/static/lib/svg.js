// @ts-check
// A map as SVG text, a leaf: the picture (every cell a shape, with its value when small) and the
// colour legend, for the page's small maps and the SVG export. Imports only format.js.
import { escapeXml, abbreviate, colour, dark, fmt, maxAbs, isMasked } from "./format.js";

/** The names of a map's axes, rows then columns: a score or weight map's (L × S) by default. */
export const MAP_AXES = ["queries", "keys"];

// The colour legend of a map: a sequential bar (0 … the largest weight) for weights, a diverging
// one (−m … 0 … m) for signed values, two swatches for a mask; the numbers at its ends.
export function legendSvg(kind, scale, hasMasked) {
  const w = 270,
    bar = 160,
    x0 = 30;
  const parts = [
    `<svg class="legend" xmlns="http://www.w3.org/2000/svg" width="${w}" height="34" viewBox="0 0 ${w} 34" font-family="system-ui, sans-serif" font-size="10" role="img" aria-label="${kind === "mask" ? "colour legend: blue may attend, white masked" : `colour legend from ${kind === "weights" ? "0" : fmt(-scale)} to ${fmt(scale)}`}">`,
  ];
  if (kind === "mask") {
    parts.push(
      '<rect x="2" y="4" width="14" height="12" fill="#2458a6"/><text x="20" y="14">may attend</text>',
      '<rect x="90" y="4" width="14" height="12" fill="#fff" stroke="#c9ced6"/><text x="108" y="14">masked</text>',
    );
  } else {
    const id = `lg-${kind}-${Math.random().toString(36).slice(2, 8)}`;
    const stops =
      kind === "weights"
        ? [
            [0, "#ffffff"],
            [1, "#2458a6"],
          ]
        : [
            [0, "#b3261e"],
            [0.5, "#ffffff"],
            [1, "#2458a6"],
          ];
    parts.push(
      `<defs><linearGradient id="${id}">${stops.map(([o, c]) => `<stop offset="${o}" stop-color="${c}"/>`).join("")}</linearGradient></defs>`,
      `<rect x="${x0}" y="3" width="${bar}" height="10" fill="url(#${id})" stroke="#c9ced6"/>`,
      `<text x="${x0}" y="26" text-anchor="middle">${escapeXml(kind === "weights" ? "0" : fmt(-scale))}</text>`,
      `<text x="${x0 + bar}" y="26" text-anchor="middle">${escapeXml(fmt(scale))}</text>`,
    );
    if (kind !== "weights")
      parts.push(`<text x="${x0 + bar / 2}" y="26" text-anchor="middle">0</text>`);
    if (hasMasked)
      parts.push(
        `<rect x="${x0 + bar + 26}" y="3" width="10" height="10" fill="#c9ced6" stroke="#7d8794"/><text x="${x0 + bar + 40}" y="12">masked</text>`,
      );
  }
  parts.push("</svg>");
  return parts.join("");
}

/** Whether any cell of the map is masked (null, or false in `allowed`). */
export function anyMasked(m, allowed) {
  for (let i = 0; i < m.length; i++) {
    const row = m[i],
      ok = allowed && allowed[i];
    for (let j = 0; j < row.length; j++)
      if (row[j] === null || (ok && ok[j] === false)) return true;
  }
  return false;
}

// Column labels cut short must still tell their columns apart: a decode step's "cache 0",
// "cache 1" … all cut to "cache…" would not. The width (px) of a column whose labels keep the
// fewest characters, from `fits`, that cut no two different labels to one, at most LABEL_MOST.
const LABEL_MOST = 12;
export function labelWidth(cols, fits) {
  const kinds = new Set(cols.map(String)).size;
  let n = Math.max(1, fits);
  while (n < LABEL_MOST && new Set(cols.map((c) => abbreviate(c, n))).size < kinds) n++;
  return Math.ceil(n * 6.5 + 4);
}

// `titled`: the title at the top (exported files); on the page the card's caption says it, and
// the picture names its axes (`axes`: rows, then columns) instead.
export function svgString(
  title,
  m,
  rows,
  cols,
  kind,
  withValues,
  allowed,
  titled = true,
  clickable = false,
  axes = MAP_AXES,
) {
  const cell = withValues
    ? 44
    : Math.max(3, Math.min(14, Math.floor(900 / Math.max(1, cols.length))));
  const scale = maxAbs(m);
  // with values, a cell is as wide as its longest printed value (about 6.5 px a character)
  let longest = 0;
  if (withValues)
    for (const row of m) for (const v of row) longest = Math.max(longest, fmt(v).length);
  let cw = withValues ? Math.max(cell, Math.ceil(longest * 6.8 + 8)) : cell;
  if (withValues) cw = Math.max(cw, labelWidth(cols, Math.floor((cw - 4) / 6.5)));
  const labelW = withValues ? 70 : 0;
  const top = withValues ? 44 : 24;
  const w = labelW + cw * cols.length + 10;
  const h = top + cell * rows.length + 10;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" font-family="system-ui, sans-serif" font-size="11" role="${clickable ? "group" : "img"}" aria-label="${escapeXml(title)}">`,
    '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#c9ced6"/><line x1="0" y1="0" x2="0" y2="6" stroke="#7d8794" stroke-width="2"/></pattern></defs>',
    `<rect width="${w}" height="${h}" fill="#fff"/>${titled ? `<text x="4" y="14" font-weight="600">${escapeXml(title)}</text>` : `<text class="axis-name" x="4" y="14" fill="#5b6775">${escapeXml(`${axes[0]} ↓  ${axes[1]} →`)}</text>`}`,
  ];
  if (withValues) {
    // long tokens abbreviated to fit (the whole token in the label's tooltip)
    const label = (text, n) => {
      const s = String(text),
        short = abbreviate(s, n);
      return short === s ? escapeXml(s) : `${escapeXml(short)}<title>${escapeXml(s)}</title>`;
    };
    cols.forEach((c, j) =>
      parts.push(
        `<text class="col-label" x="${labelW + j * cw + cw / 2}" y="${top - 6}" text-anchor="middle">${label(c, Math.floor((cw - 4) / 6.5))}</text>`,
      ),
    );
    rows.forEach((r, i) =>
      parts.push(
        `<text class="row-label" x="${labelW - 6}" y="${top + i * cell + cell / 2 + 4}" text-anchor="end">${label(r, 10)}</text>`,
      ),
    );
  }
  m.forEach((row, i) =>
    row.forEach((v, j) => {
      const masked = isMasked(m, allowed, i, j);
      const fill = masked ? "url(#hatch)" : colour(v, kind, scale);
      const value = v === null ? "null" : String(v);
      parts.push(
        `<rect class="cell${masked ? " masked" : ""}"${clickable ? ' tabindex="0" role="button"' : ""} data-row="${i}" data-col="${j}" data-value="${value}" x="${labelW + j * cw}" y="${top + i * cell}" width="${cw}" height="${cell}" fill="${fill}" stroke="#dde2e8" stroke-width="${withValues ? 1 : 0}"><title>${escapeXml(rows[i])} → ${escapeXml(cols[j])}: ${escapeXml(fmt(v))}${masked ? " (masked)" : ""}</title></rect>`,
      );
      if (withValues)
        parts.push(
          `<text x="${labelW + j * cw + cw / 2}" y="${top + i * cell + cell / 2 + 4}" text-anchor="middle" pointer-events="none" fill="${!masked && dark(v, kind, scale) ? "#fff" : "#1d232b"}">${escapeXml(fmt(v))}</text>`,
        );
    }),
  );
  parts.push("</svg>");
  return parts.join("");
}
