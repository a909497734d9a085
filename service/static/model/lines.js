// @ts-check
// The head view, as BertViz draws it: a layer's tokens as queries in a column on the left and
// keys in a column on the right, and for each head shown a line from query i to key j whose
// opacity is that head's weight w[i][j], one colour a head. Heads are toggled on and off (a
// head's lines are laid out the first time it is shown); hovering or focusing a query shows only
// its lines and says where each head shown looks most; a key, the lines into it; a click (or
// Enter) keeps that choice until clicked again. The arrow keys walk the tokens (one tab stop a
// column).
import { abbreviate, escapeXml, fmt, count } from "../lib/format.js";

/** Weights below this draw no line (under 0.1 % opacity a line cannot be seen). */
export const FAINTEST = 0.001;
/** Above 40 tokens the faintest line drawn is 0.01 (an even spread over 128 keys is 0.008): a
 * head's lines stay a few thousand, not 16 000. */
export const FAINTEST_LONG = 0.01;
export const faintest = (L) => (L <= 40 ? FAINTEST : FAINTEST_LONG);

/** One colour a head (Tableau's twelve, then round again). */
export const HEAD_COLOURS = [
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#7f7f7f", "#17becf", "#bcbd22",
]; // prettier-ignore
export const headColour = (h) => HEAD_COLOURS[h % HEAD_COLOURS.length];

const GEOMETRY = { width: 520, xq: 180, xk: 340, top: 26 };

/**
 * The head view of a layer's weights `layer` [heads][L][L] between `tokens`, as a card: the
 * heads in `shown` drawn at first, a toggle a head above. Its <svg> holds a <g class="head"
 * data-head> per head drawn, in it a <g class="q-lines" data-i> per query and a <line data-i
 * data-j data-weight stroke-opacity> per weight from faintest(L) up, and a <g class="tok q|k"
 * data-i> per token.
 * @param {(number | null)[][][]} layer
 * @param {string[]} tokens
 * @param {string} title
 * @param {number[]} shown
 */
export function headLines(layer, tokens, title, shown) {
  const L = tokens.length;
  const row = L <= 40 ? 18 : 13,
    font = L <= 40 ? 12 : 11;
  const { width, xq, xk, top } = GEOMETRY;
  const height = top + L * row + 6;
  const y = (i) => top + i * row + row / 2;
  const parts = [
    `<svg class="head-lines" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="${font}" role="group" aria-label="${escapeXml(title)}">`,
    `<text class="axis-name" x="${xq}" y="14" text-anchor="end">queries</text><text class="axis-name" x="${xk}" y="14">keys</text>`,
    `<g class="heads"></g>`,
  ];
  const token = (side, i) => {
    const t = String(tokens[i] ?? i);
    const q = side === "q";
    const what = q
      ? `query ${i} “${t}”: show only its lines`
      : `key ${i} “${t}”: show only the lines into it`;
    return (
      `<g class="tok ${side}" data-i="${i}" tabindex="${i === 0 ? 0 : -1}" role="button" aria-pressed="false" aria-label="${escapeXml(what)}">` +
      `<rect x="${q ? 0 : xk - 2}" y="${y(i) - row / 2}" width="${xq + 2}" height="${row}" fill="transparent"/>` +
      `<text x="${q ? xq : xk}" y="${y(i) + font / 3}" text-anchor="${q ? "end" : "start"}">${escapeXml(abbreviate(t, 22))}</text></g>`
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
  const svg = /** @type {SVGSVGElement} */ (scroll.querySelector("svg"));
  const groups = /** @type {SVGGElement} */ (svg.querySelector("g.heads"));
  const least = faintest(L);
  const drawn = new Map(); // head -> its <g class="head">
  const lay = (h) => {
    const m = layer[h];
    const out = [`<g class="head" data-head="${h}" stroke="${headColour(h)}">`];
    for (let i = 0; i < L; i++) {
      out.push(`<g class="q-lines" data-i="${i}">`);
      for (let j = 0; j < L; j++) {
        const w = m[i][j];
        if (typeof w !== "number" || w < least) continue;
        out.push(
          `<line data-i="${i}" data-j="${j}" data-weight="${w}" x1="${xq + 6}" y1="${y(i)}" x2="${xk - 6}" y2="${y(j)}" stroke-opacity="${w}"/>`,
        );
      }
      out.push("</g>");
    }
    out.push("</g>");
    groups.insertAdjacentHTML("beforeend", out.join(""));
    drawn.set(h, groups.lastElementChild);
  };
  const on = new Set();
  const hint = document.createElement("p");
  hint.className = "hint";
  const sayHint = () => {
    const lines = [...on].reduce((n, h) => n + drawn.get(h).querySelectorAll("line").length, 0);
    hint.textContent = `A line's opacity is the weight, its colour the head (${count(on.size, "head")} shown, ${count(lines, "line")}; weights under ${least} draw none). Hover or focus a token to see only its lines; click it to keep them.`;
  };
  const toggles = document.createElement("div");
  toggles.className = "head-toggles";
  toggles.setAttribute("role", "group");
  toggles.setAttribute("aria-label", "heads whose lines are shown");
  toggles.append("heads: ");
  const buttons = layer.map((_, h) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "head-toggle";
    b.dataset.head = String(h);
    b.style.setProperty("--head", headColour(h));
    b.textContent = String(h);
    b.setAttribute("aria-label", `head ${h}'s lines`);
    b.setAttribute("aria-pressed", "false");
    b.addEventListener("click", () => set(h, !on.has(h)));
    return b;
  });
  const set = (h, show) => {
    if (show && !drawn.has(h)) lay(h);
    if (show) on.add(h);
    else on.delete(h);
    if (drawn.has(h)) drawn.get(h).style.display = show ? "" : "none";
    buttons[h].setAttribute("aria-pressed", String(show));
    sayHint();
    wiring.refresh();
  };
  const all = document.createElement("button");
  all.type = "button";
  all.className = "secondary head-all";
  all.textContent = "all";
  all.addEventListener("click", () => layer.forEach((_, h) => set(h, true)));
  const none = document.createElement("button");
  none.type = "button";
  none.className = "secondary head-none";
  none.textContent = "none";
  none.addEventListener("click", () => layer.forEach((_, h) => set(h, false)));
  toggles.append(...buttons, all, none);
  const readout = document.createElement("p");
  readout.className = "cell-readout";
  readout.setAttribute("aria-live", "polite");
  fig.append(caption, toggles, scroll, readout, hint);
  const wiring = wire(svg, layer, on, tokens, readout);
  for (const h of shown) set(h, true);
  sayHint();
  return fig;
}

// Hover, focus, click and the arrow keys on the tokens; `on`: the heads shown. Returns
// `refresh()`, which redraws the choice after a head is toggled.
function wire(svg, layer, on, tokens, readout) {
  let pinned = null; // [side, i]: the token clicked
  let current = null; // [side, i]: the token shown
  const name = (i) => `“${tokens[i] ?? i}”`;
  const heads = () => [...on].sort((a, b) => a - b);
  const show = (side, i) => {
    current = side === null ? null : [side, i];
    svg.classList.toggle("one-query", side === "q");
    svg.classList.toggle("one-key", side === "k");
    svg.querySelectorAll(".on").forEach((e) => e.classList.remove("on"));
    if (side === null) {
      readout.textContent = "";
      return;
    }
    svg.querySelector(`g.tok.${side}[data-i="${i}"]`).classList.add("on");
    const shown = heads();
    if (side === "q") {
      svg.querySelectorAll(`g.q-lines[data-i="${i}"]`).forEach((e) => e.classList.add("on"));
      const top = (h, n) =>
        layer[h][i]
          .map((w, j) => [w, j])
          .filter(([w]) => typeof w === "number")
          .sort((a, b) => b[0] - a[0])
          .slice(0, n);
      readout.textContent =
        shown.length === 1
          ? `query ${i} ${name(i)} attends most to ${top(shown[0], 5)
              .map(([w, j]) => `${name(j)} ${fmt(w)}`)
              .join(", ")}`
          : `query ${i} ${name(i)} attends most to: ${shown
              .map((h) => {
                const [[w, j]] = top(h, 1);
                return `head ${h} ${name(j)} ${fmt(w)}`;
              })
              .join("; ")}`;
    } else {
      svg.querySelectorAll(`line[data-j="${i}"]`).forEach((e) => e.classList.add("on"));
      const into = (h) => layer[h].reduce((t, r) => t + (typeof r[i] === "number" ? r[i] : 0), 0);
      readout.textContent = `key ${i} ${name(i)}: the weights into it add up to ${shown
        .map((h) => `${fmt(into(h))}${shown.length > 1 ? ` (head ${h})` : ""}`)
        .join(", ")} over ${count(tokens.length, "query", "queries")}`;
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
    const L = tokens.length;
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
  return { refresh: () => (current ? show(current[0], current[1]) : undefined) };
}
