// @ts-check
// The model view (as BertViz calls it): every layer × head of a trained model as a small map, a
// canvas each (the map's colours from lib/picture.js, one pixel a cell, scaled to the canvas),
// labelled with the head's role when POST /model names one (head_roles[l][h].role). Each map is
// a button: a click or Enter opens that head large (`onPick`); the arrow keys move between heads
// (one tab stop for the whole grid).
import { picture } from "../lib/picture.js";
import { fmt, count } from "../lib/format.js";

/** Each role POST /model names: the short word on a map, what the head is called, what it does. */
export const ROLES = {
  previous_token: {
    word: "prev",
    name: "previous-token head",
    does: "attends to the token just before",
  },
  next_token: { word: "next", name: "next-token head", does: "attends to the token just after" },
  self: { word: "self", name: "self head", does: "attends to its own token" },
  first_token: {
    word: "first",
    name: "first-token head",
    does: "attends to the first token (e.g. [CLS])",
  },
  last_token: {
    word: "last",
    name: "last-token head",
    does: "attends to the last token (e.g. [SEP])",
  },
  induction: {
    word: "induction",
    name: "induction head",
    does: "attends to the token after an earlier occurrence of its own token",
  },
};

// The six scores of head_roles, in the order they are listed.
const SCORES = [
  ["previous_token", "previous token"],
  ["next_token", "next token"],
  ["self", "self"],
  ["first_token", "first token"],
  ["last_token", "last token"],
  ["induction", "induction"],
];

/** A head's scores in words: "previous token 0.999 · next token 0 · … · entropy 0.00182 bits". */
export function roleScores(r) {
  const parts = SCORES.map(
    ([key, name]) => `${name} ${r[key] === null ? "— (no token repeats)" : fmt(r[key])}`,
  );
  return `${parts.join(" · ")} · entropy ${fmt(r.entropy_bits)} bits`;
}

/** A head's role in words: "previous-token head: attends to …", or why it has none. */
export function roleText(r) {
  const role = r && r.role ? ROLES[r.role] : null;
  if (role) return `${role.name}: ${role.does}`;
  if (r && r.role) return `${r.role} head`; // a role this page does not know yet
  return "no role: none of its six scores reaches 0.5";
}

const SIDE = 96; // px a small map's canvas holds at most (its CSS size is its grid column's)

/** One head's weights drawn on a canvas: whole pixels a cell up to SIDE, averaged above. */
function smallMap(m) {
  const L = m.length;
  const side = L <= SIDE ? L * Math.floor(SIDE / L) : SIDE;
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = side;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = L > side; // below a pixel a cell, neighbours are averaged
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(picture(m, "weights", null).off, 0, 0, side, side);
  return canvas;
}

/**
 * The grid: a row per layer, a column per head. `attention` [layers][heads][L][L], `roles`
 * [layers][heads] (POST /model's head_roles), `onPick(layer, head)`: a map was chosen. Returns
 * the element and `select(layer, head)`, which marks the chosen map (aria-pressed).
 * @returns {{el: HTMLElement, select: (layer: number, head: number) => void}}
 */
export function modelGrid(attention, roles, onPick) {
  const layers = attention.length,
    heads = attention[0].length;
  const grid = document.createElement("div");
  grid.className = "model-grid";
  grid.setAttribute("role", "group");
  grid.setAttribute(
    "aria-label",
    `${count(layers, "layer")} × ${count(heads, "head")}; arrow keys move between heads, Enter opens one`,
  );
  grid.style.setProperty("--heads", String(heads));
  grid.append(corner("layer ↓ head →"));
  for (let h = 0; h < heads; h++) grid.append(corner(String(h), "head-label"));
  /** @type {HTMLButtonElement[][]} */
  const cells = [];
  for (let l = 0; l < layers; l++) {
    grid.append(corner(`layer ${l}`, "layer-label"));
    cells.push([]);
    for (let h = 0; h < heads; h++) {
      const r = roles && roles[l] ? roles[l][h] : null;
      const b = document.createElement("button");
      b.type = "button";
      b.className = "head-cell";
      b.tabIndex = -1;
      Object.assign(b.dataset, { layer: String(l), head: String(h), role: (r && r.role) || "" });
      b.setAttribute("aria-pressed", "false");
      const says = r ? `${roleText(r)}. ${roleScores(r)}` : "";
      b.title = `layer ${l}, head ${h}${says ? `: ${says}` : ""}`;
      b.setAttribute(
        "aria-label",
        `layer ${l}, head ${h}${r && r.role ? `, ${(ROLES[r.role] || { name: r.role }).name}` : ""}: open it large`,
      );
      const label = document.createElement("span");
      label.className = `role${r && r.role ? ` role-${r.role}` : ""}`;
      label.textContent = r && r.role ? (ROLES[r.role] || { word: r.role }).word : "";
      b.append(smallMap(attention[l][h]), label);
      b.addEventListener("click", () => onPick(l, h));
      cells[l].push(b);
      grid.append(b);
    }
  }
  cells[0][0].tabIndex = 0;
  grid.addEventListener("keydown", (e) => {
    const at = /** @type {HTMLElement} */ (e.target).closest("button.head-cell");
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (!(at instanceof HTMLElement) || !moves[e.key]) return;
    e.preventDefault();
    const l = Math.max(0, Math.min(layers - 1, Number(at.dataset.layer) + moves[e.key][0]));
    const h = Math.max(0, Math.min(heads - 1, Number(at.dataset.head) + moves[e.key][1]));
    at.tabIndex = -1;
    cells[l][h].tabIndex = 0;
    cells[l][h].focus();
  });
  const select = (layer, head) => {
    cells.forEach((row, l) =>
      row.forEach((b, h) => {
        const on = l === layer && h === head;
        b.setAttribute("aria-pressed", String(on));
        b.tabIndex = on ? 0 : -1; // the grid's one tab stop: the head shown large
      }),
    );
  };
  return { el: grid, select };
}

function corner(text, cls = "grid-corner") {
  const d = document.createElement("div");
  d.className = cls;
  d.textContent = text;
  return d;
}
