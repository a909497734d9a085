// @ts-check
// The head view, as BertViz draws it: one head's queries in a column on the left, the keys in a
// column on the right, and a line from query i to key j whose opacity is the weight w[i][j].
// Hovering or focusing a query shows only its lines and says where it looks most; a key, the
// lines into it; a click (or Enter) keeps that choice until clicked again. The arrow keys walk
// the tokens (one tab stop a column).
import { abbreviate, escapeXml, fmt, count } from "../lib/format.js";

/** Weights below this draw no line (under 0.1 % opacity a line cannot be seen). */
export const FAINTEST = 0.001;

/**
 * The head view of weights `m` [L][L] between `tokens`, as a card. Its <svg> holds a
 * <g class="q-lines" data-i> per query, a <line data-i data-j data-weight stroke-opacity> per
 * weight from FAINTEST up, and a <g class="tok q|k" data-i> per token.
 * @param {(number | null)[][]} m
 * @param {string[]} tokens
 * @param {string} title
 */
export function headLines(m, tokens, title) {
  const L = m.length;
  const row = L <= 40 ? 18 : 12,
    font = L <= 40 ? 12 : 10;
  const width = 400,
    xq = 150, // the queries' right edge
    xk = 250, // the keys' left edge
    top = 26;
  const height = top + L * row + 6;
  const y = (i) => top + i * row + row / 2;
  const parts = [
    `<svg class="head-lines" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="${font}" role="group" aria-label="${escapeXml(title)}">`,
    `<text class="axis-name" x="${xq}" y="14" text-anchor="end">queries</text><text class="axis-name" x="${xk}" y="14">keys</text>`,
  ];
  let drawn = 0;
  for (let i = 0; i < L; i++) {
    parts.push(`<g class="q-lines" data-i="${i}">`);
    for (let j = 0; j < L; j++) {
      const w = m[i][j];
      if (typeof w !== "number" || w < FAINTEST) continue;
      drawn++;
      parts.push(
        `<line data-i="${i}" data-j="${j}" data-weight="${w}" x1="${xq + 6}" y1="${y(i)}" x2="${xk - 6}" y2="${y(j)}" stroke-opacity="${w}"/>`,
      );
    }
    parts.push("</g>");
  }
  const token = (side, i) => {
    const t = String(tokens[i] ?? i);
    const q = side === "q";
    const what = q
      ? `query ${i} “${t}”: show only its lines`
      : `key ${i} “${t}”: show only the lines into it`;
    return (
      `<g class="tok ${side}" data-i="${i}" tabindex="${i === 0 ? 0 : -1}" role="button" aria-pressed="false" aria-label="${escapeXml(what)}">` +
      `<rect x="${q ? 0 : xk - 2}" y="${y(i) - row / 2}" width="${xq + 2}" height="${row}" fill="transparent"/>` +
      `<text x="${q ? xq : xk}" y="${y(i) + font / 3}" text-anchor="${q ? "end" : "start"}">${escapeXml(abbreviate(t, 18))}</text></g>`
    );
  };
  for (let i = 0; i < L; i++) parts.push(token("q", i), token("k", i));
  parts.push("</svg>");

  const fig = document.createElement("figure");
  fig.className = "heatmap head-view";
  fig.dataset.name = "head_lines";
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  const scroll = document.createElement("div");
  scroll.className = "lines-scroll";
  scroll.innerHTML = parts.join("");
  const readout = document.createElement("p");
  readout.className = "cell-readout";
  readout.setAttribute("aria-live", "polite");
  const hint = document.createElement("p");
  hint.className = "hint";
  hint.textContent = `A line's opacity is the weight (${count(drawn, "line")}; weights under ${FAINTEST} draw none). Hover or focus a token to see only its lines; click it to keep them.`;
  fig.append(caption, scroll, readout, hint);
  const svg = /** @type {SVGSVGElement} */ (scroll.querySelector("svg"));
  wire(svg, m, tokens, readout);
  return fig;
}

// Hover, focus, click and the arrow keys on the tokens.
function wire(svg, m, tokens, readout) {
  let pinned = null; // [side, i]: the token clicked
  const name = (i) => `“${tokens[i] ?? i}”`;
  const show = (side, i) => {
    svg.classList.toggle("one-query", side === "q");
    svg.classList.toggle("one-key", side === "k");
    svg.querySelectorAll(".on").forEach((e) => e.classList.remove("on"));
    if (side === null) {
      readout.textContent = "";
      return;
    }
    svg.querySelector(`g.tok.${side}[data-i="${i}"]`).classList.add("on");
    if (side === "q") {
      svg.querySelector(`g.q-lines[data-i="${i}"]`).classList.add("on");
      const top = m[i]
        .map((w, j) => [w, j])
        .filter(([w]) => typeof w === "number")
        .sort((a, b) => b[0] - a[0])
        .slice(0, 5);
      readout.textContent = `query ${i} ${name(i)} attends most to ${top.map(([w, j]) => `${name(j)} ${fmt(w)}`).join(", ")}`;
    } else {
      svg.querySelectorAll(`line[data-j="${i}"]`).forEach((e) => e.classList.add("on"));
      let total = 0;
      for (const r of m) total += typeof r[i] === "number" ? r[i] : 0;
      readout.textContent = `key ${i} ${name(i)}: the weights into it add up to ${fmt(total)} over ${count(m.length, "query", "queries")}`;
    }
  };
  const at = (e) => {
    const g = /** @type {Element} */ (e.target).closest && e.target.closest("g.tok");
    return g ? [g.classList.contains("q") ? "q" : "k", Number(g.dataset.i), g] : null;
  };
  const rest = () => (pinned ? show(pinned[0], pinned[1]) : show(null, 0));
  svg.addEventListener("mouseover", (e) => {
    const t = at(e);
    if (t && !pinned) show(t[0], t[1]);
  });
  svg.addEventListener("mouseleave", rest);
  svg.addEventListener("focusin", (e) => {
    const t = at(e);
    if (t && !pinned) show(t[0], t[1]);
  });
  svg.addEventListener("focusout", (e) => {
    if (!svg.contains(/** @type {Node} */ (e.relatedTarget))) rest();
  });
  const toggle = (t) => {
    const same = pinned && pinned[0] === t[0] && pinned[1] === t[1];
    svg.querySelectorAll('g.tok[aria-pressed="true"]').forEach((g) => {
      g.setAttribute("aria-pressed", "false");
    });
    pinned = same ? null : [t[0], t[1]];
    if (pinned) t[2].setAttribute("aria-pressed", "true");
    show(t[0], t[1]);
  };
  svg.addEventListener("click", (e) => {
    const t = at(e);
    if (t) toggle(t);
  });
  svg.addEventListener("keydown", (e) => {
    const t = at(e);
    if (!t) return;
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      toggle(t);
      return;
    }
    const L = m.length;
    const moves = { ArrowUp: [t[0], t[1] - 1], ArrowDown: [t[0], t[1] + 1] };
    moves.ArrowLeft = ["q", t[1]];
    moves.ArrowRight = ["k", t[1]];
    const next = moves[e.key];
    if (!next) return;
    e.preventDefault();
    const g = /** @type {SVGGElement} */ (
      svg.querySelector(`g.tok.${next[0]}[data-i="${Math.max(0, Math.min(L - 1, next[1]))}"]`)
    );
    svg.querySelectorAll(`g.tok.${next[0]}`).forEach((o) => o.setAttribute("tabindex", "-1"));
    g.setAttribute("tabindex", "0");
    g.focus();
  });
}
