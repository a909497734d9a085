// @ts-check
// The model view (as BertViz calls it): every layer × head of a trained model as a small map, a
// canvas each at device resolution (its colours normalised by row or by head, NORMS), labelled
// with the head's role when POST /model names one (head_roles[l][h].role). Each map is a button:
// a click or Enter opens its layer with that head chosen (`onPick`); the arrow keys move between
// heads (one tab stop for the whole grid). headSummary says which heads matter in a few lines.
import { fmt, count, rgbOf } from "../lib/format.js";

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

/** How a small map is coloured: each cell divided by its row's largest weight (every query's
 * strongest key full colour, so a 128 × 128 map is never white) or by its head's largest. */
export const NORMS = {
  row: {
    label: "each row",
    says: "each query row divided by its own largest weight: the darkest cell of a row is the key that query attends to most, whatever that weight is (white 0, darkest 1 × the row's largest)",
  },
  head: {
    label: "each head",
    says: "each head divided by its own largest weight: colours compare cells within a head (white 0, darkest its largest weight); a head that spreads its weight thinly looks pale",
  },
};

// The weights palette (lib/format.js's rgbOf, white to the page's blue) as 256 RGBA words.
const LUT = Uint32Array.from({ length: 256 }, (_, k) => {
  const [r, g, b] = rgbOf(k / 255, "weights", 1).map(Math.round);
  return ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
});

/** Each row's (or the whole head's) largest weight: the divisor of `norm`. */
function divisors(m, norm) {
  const rowMax = m.map((row) => row.reduce((a, v) => (typeof v === "number" && v > a ? v : a), 0));
  if (norm === "row") return rowMax;
  const top = Math.max(0, ...rowMax);
  return rowMax.map(() => top);
}

/**
 * One head's weights drawn on `canvas` at device resolution: its backing store is its CSS size ×
 * devicePixelRatio, each device pixel the largest normalised weight of the cells it covers (a
 * thin diagonal stays visible below a pixel a cell; above, a cell is a block of whole pixels).
 */
export function drawThumb(canvas, m, norm) {
  const css = canvas.getBoundingClientRect().width;
  if (!css) return;
  const side = Math.max(1, Math.round(css * (window.devicePixelRatio || 1)));
  if (canvas.width !== side) canvas.width = canvas.height = side;
  const L = m.length;
  const div = divisors(m, norm);
  const img = new ImageData(side, side);
  const px = new Uint32Array(img.data.buffer);
  const span = (p) => {
    const a = Math.floor((p * L) / side);
    return [a, Math.max(a + 1, Math.ceil(((p + 1) * L) / side))];
  };
  const cols = Array.from({ length: side }, (_, x) => span(x));
  for (let y = 0; y < side; y++) {
    const [i0, i1] = span(y);
    for (let x = 0; x < side; x++) {
      const [j0, j1] = cols[x];
      let most = 0;
      for (let i = i0; i < i1; i++) {
        const row = m[i],
          d = div[i] || 1;
        for (let j = j0; j < j1; j++) {
          const v = row[j];
          if (typeof v === "number" && v / d > most) most = v / d;
        }
      }
      px[y * side + x] = LUT[Math.round(Math.min(1, most) * 255)];
    }
  }
  canvas.getContext("2d").putImageData(img, 0, 0);
  canvas.dataset.norm = norm;
}

/**
 * The grid: a row per layer, a column per head. `attention` [layers][heads][L][L], `roles`
 * [layers][heads] (POST /model's head_roles), `onPick(layer, head)`: a map was chosen (its layer
 * opens), `norm`: a key of NORMS. Returns the element, `select(layer, head)`, which marks the
 * chosen map (aria-pressed), and `normalise(norm)`, which redraws every map. The maps are drawn
 * once the grid is in the page, and again when their size changes.
 * @returns {{el: HTMLElement, select: (layer: number, head: number) => void, normalise: (norm: string) => void}}
 */
export function modelGrid(attention, roles, onPick, norm = "row") {
  const layers = attention.length,
    heads = attention[0].length;
  const grid = document.createElement("div");
  grid.className = "model-grid";
  grid.setAttribute("role", "group");
  grid.setAttribute(
    "aria-label",
    `${count(layers, "layer")} × ${count(heads, "head")}; arrow keys move between heads, Enter opens one's layer`,
  );
  grid.style.setProperty("--heads", String(heads));
  grid.append(corner("layer ↓ head →"));
  for (let h = 0; h < heads; h++) grid.append(corner(String(h), "head-label"));
  /** @type {HTMLButtonElement[][]} */
  const cells = [];
  /** @type {HTMLCanvasElement[][]} */
  const canvases = [];
  for (let l = 0; l < layers; l++) {
    const open = document.createElement("button");
    open.type = "button";
    open.className = "layer-label";
    open.textContent = `layer ${l}`;
    open.dataset.layer = String(l);
    open.setAttribute("aria-label", `open layer ${l}: its head view and its trace`);
    open.addEventListener("click", () => onPick(l, -1));
    grid.append(open);
    cells.push([]);
    canvases.push([]);
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
        `layer ${l}, head ${h}${r && r.role ? `, ${(ROLES[r.role] || { name: r.role }).name}` : ""}: open its layer`,
      );
      const label = document.createElement("span");
      label.className = `role${r && r.role ? ` role-${r.role}` : ""}`;
      label.textContent = r && r.role ? (ROLES[r.role] || { word: r.role }).word : "";
      const canvas = document.createElement("canvas");
      canvas.width = canvas.height = 1;
      b.append(canvas, label);
      b.addEventListener("click", () => onPick(l, h));
      cells[l].push(b);
      canvases[l].push(canvas);
      grid.append(b);
    }
  }
  const drawAll = () =>
    canvases.forEach((row, l) => row.forEach((c, h) => drawThumb(c, attention[l][h], norm)));
  let width = 0;
  new ResizeObserver(() => {
    const w = canvases[0][0].getBoundingClientRect().width;
    if (w && Math.round(w * (window.devicePixelRatio || 1)) !== width) {
      width = Math.round(w * (window.devicePixelRatio || 1));
      drawAll();
    }
  }).observe(grid);
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
        if (head >= 0) b.tabIndex = on ? 0 : -1; // the grid's one tab stop: the head opened
      }),
    );
  };
  const normalise = (next) => {
    norm = next;
    drawAll();
  };
  return { el: grid, select, normalise };
}

/**
 * The heads that matter in at most 20 lines: for each role found, the heads that have it
 * (strongest score first) and, for the heads without a positional role, the strongest links
 * between two different ordinary tokens (not the first or last token, which many heads use as a
 * resting place), each with the head that makes it.
 * @returns {string[]}
 */
export function headSummary(attention, roles, tokens, most = 20) {
  const lines = [];
  const layers = attention.length,
    heads = attention[0].length,
    L = tokens.length;
  for (const [key, role] of Object.entries(ROLES)) {
    const found = [];
    roles.forEach((row, l) =>
      row.forEach((r, h) => {
        if (r && r.role === key) found.push([r[key], l, h]);
      }),
    );
    if (!found.length) continue;
    found.sort((a, b) => b[0] - a[0]);
    const shown = found.slice(0, 8).map(([s, l, h]) => `L${l} H${h} (${fmt(s)})`);
    const more = found.length > 8 ? ` and ${found.length - 8} more` : "";
    lines.push(
      `${role.name}s, which ${role.does.replace(/^attends/, "attend")}: ${shown.join(", ")}${more}`,
    );
  }
  const named = roles.flat().filter((r) => r && r.role).length;
  lines.push(
    named
      ? `${count(layers * heads - named, "head")} of ${layers * heads} ${named === layers * heads - 1 ? "has" : "have"} no role: their scores are all under 0.5 (open a layer to see where they look).`
      : `No head has a role: every score is under 0.5.`,
  );
  const links = [];
  const positional = new Set(["previous_token", "next_token", "self", "first_token", "last_token"]);
  for (let l = 0; l < layers; l++)
    for (let h = 0; h < heads; h++) {
      const r = roles[l] && roles[l][h];
      if (r && positional.has(r.role)) continue;
      const m = attention[l][h];
      for (let i = 1; i < L - 1; i++) {
        let best = -1,
          at = -1; // each query's strongest far link in this head
        for (let j = 1; j < L - 1; j++) {
          const w = m[i][j];
          if (Math.abs(i - j) > 1 && typeof w === "number" && w > best) [best, at] = [w, j];
        }
        if (at >= 0) links.push([best, i, at, l, h]);
      }
    }
  links.sort((a, b) => b[0] - a[0]);
  const seen = new Set();
  const strongest = [];
  for (const [w, i, j, l, h] of links) {
    if (strongest.length >= Math.min(8, most - lines.length - 1)) break;
    if (seen.has(`${i},${j}`)) continue;
    seen.add(`${i},${j}`);
    strongest.push(`“${tokens[i]}” (${i}) → “${tokens[j]}” (${j}): ${fmt(w)} in L${l} H${h}`);
  }
  if (strongest.length) {
    lines.push(
      "The strongest links between two tokens further apart than neighbours, the first and last tokens left out, in the heads without a positional role:",
    );
    lines.push(...strongest);
  }
  return lines.slice(0, most);
}

function corner(text, cls = "grid-corner") {
  const d = document.createElement("div");
  d.className = cls;
  d.textContent = text;
  return d;
}
