// @ts-check
// The backward beside the forward (API "The backward pass, every step"): an output's gradient
// (grad_ + its name: lib/schema.js reads which outputs have one) drawn as a map beside the
// output's own card, a map or a table, in a colour scale that shows sign (red below 0, white at
// 0, blue above, each map scaled to its largest |value|; masked cells hatched); a click on a cell
// explains it (explain.js → backward-explain.js). render.js places the pair where the output's
// card would go. And the steps: the backward's, listed after the forward's, are marked.
import { heatmap } from "./heatmap.js";
import { axesOf, GRAD_PREFIX } from "./lib/schema.js";

/** The colours of a gradient: signed (lib/format.js rgbOf, diverging for every kind but
 * weights and mask). */
export const GRAD_KIND = "gradient";

const indices = (n) => Array.from({ length: n }, (_, i) => String(i));

/**
 * The card of the gradient `m` of drawn output `view` (its `grad` the gradient's name), for head
 * `head` (or none): rows and columns labelled as the output's (a map's queries and keys, a
 * table's rows and its features by index).
 * @param {import("./lib/schema.js").View} view
 * @param {any[][]} m
 * @param {{head?: number, rows: any[], cols: any[], labels: Record<string, any[]>,
 *   allowed: any, onCell: ((i: number, j: number) => void) | null}} where
 */
export function gradientCard(view, m, { head, rows, cols, labels, allowed, onCell }) {
  const name = view.grad;
  const key = head === undefined ? name : `head${head}_${name}`;
  const title = `${head === undefined ? "" : `head ${head}: `}∂loss/∂${view.name} (${name})`;
  const map = !!view.map;
  const own = labels[view.rows] || [];
  const r = map ? rows : own.length === m.length ? own : indices(m.length);
  const c = map ? cols : indices(m[0].length);
  const fig = heatmap(key, title, m, r, c, GRAD_KIND, map ? allowed : null, onCell, axesOf(view));
  fig.classList.add("gradient");
  if (head !== undefined) fig.dataset.head = String(head);
  return fig;
}

/** The output's card and its gradient's side by side, in one box placed as the card was. */
export function besideGradient(card, gradient) {
  const pair = document.createElement("div");
  pair.className = "grad-pair";
  pair.dataset.name = card.dataset.name ?? "";
  if (card.dataset.head !== undefined) pair.dataset.head = card.dataset.head;
  pair.append(card, gradient);
  return pair;
}

/** The steps as list items: the backward's (from the first gradient's on; the service lists
 * them after the forward's, API 2.13) marked, the first with the backward's heading. */
export function stepItems(steps) {
  const first = steps.findIndex((s) => String(s.name).startsWith(GRAD_PREFIX));
  return steps.map((s, n) => {
    const li = document.createElement("li");
    const code = document.createElement("code");
    code.textContent = s.formula;
    li.append(`${s.name}: `, code, `  [${s.shape.join(" × ")}]`);
    if (first >= 0 && n >= first) li.classList.add("backward");
    if (n === first) li.classList.add("backward-first");
    return li;
  });
}
