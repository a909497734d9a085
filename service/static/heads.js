// @ts-check
// Heads side by side (/multihead): every head's weights in a grid with their average, the head
// picker (which heads' maps and tables show below), the difference of two heads (offered only
// when there are two), and a head's tables and masked scores folded away.
import { $ } from "./lib/state.js";
import { heatmap, smallMapsGrid } from "./heatmap.js";

const headChoice = { show: "all", a: 0, b: 1 }; // kept across redraws

// One head's tables (Q, K, V, …) folded into one card, its summary naming them.
export function foldedTables(head, list) {
  const details = document.createElement("details");
  details.className = "head-tables";
  details.dataset.head = String(head);
  const summary = document.createElement("summary");
  summary.textContent = `head ${head}: ${list.map((t) => t.title).join(", ")}`;
  const body = document.createElement("div");
  body.className = "tables";
  body.append(...list.map((t) => t.el));
  details.append(summary, body);
  return details;
}

export function collapsed(title, fig) {
  const details = document.createElement("details");
  details.className = "collapsed-map";
  if (fig.dataset.head !== undefined) details.dataset.head = fig.dataset.head;
  const summary = document.createElement("summary");
  summary.textContent = title;
  details.append(summary, fig);
  return details;
}

function options(select, n, value, all) {
  select.replaceChildren(
    ...(all ? [new Option("all heads", "all")] : []),
    ...Array.from({ length: n }, (_, i) => new Option(`head ${i}`, String(i))),
  );
  select.value = [...select.options].some((o) => o.value === String(value))
    ? String(value)
    : select.options[0].value;
}

// Which heads' detailed maps and tables are shown (the grid always shows every head).
function showHeads() {
  const show = $("head-pick").value;
  headChoice.show = show;
  /** @type {NodeListOf<HTMLElement>} */ (
    document.querySelectorAll(
      '#heatmaps > [data-head], #tables > [data-head], #tables > details[data-name^="heads."], #tables > figure.diff',
    )
  ).forEach((el) => {
    const h = el.dataset.head;
    if (h !== undefined) el.hidden = show !== "all" && h !== show;
  });
}

function diffView(headWeights, rows, cols, allowed) {
  const a = Number($("diff-a").value),
    b = Number($("diff-b").value);
  headChoice.a = a;
  headChoice.b = b;
  const wa = headWeights(a),
    wb = headWeights(b);
  const box = $("heads-diff");
  if (!wa || !wb) {
    box.replaceChildren();
    return;
  }
  const m = wa.map((row, i) =>
    row.map((v, j) => (v === null || wb[i][j] === null ? null : v - wb[i][j])),
  );
  const fig = heatmap(
    "heads_diff",
    `weights: head ${a} − head ${b}`,
    m,
    rows,
    cols,
    "scores",
    allowed,
  );
  fig.classList.add("diff");
  box.replaceChildren(fig);
  smallMapsGrid($("heads-maps"));
}

/** The panel for the heads' weight maps `grid` (and their `average`); `headWeights(i)`: head i's
 * weights, for the difference of two heads. */
export function headsPanel(grid, average, headWeights, rows, cols, allowed) {
  const panel = $("heads");
  panel.hidden = !grid.length;
  if (!grid.length) {
    $("heads-grid").replaceChildren();
    $("heads-diff").replaceChildren();
    return;
  }
  $("heads-grid").replaceChildren(...grid, ...(average ? [average] : []));
  options($("head-pick"), grid.length, headChoice.show, true);
  options($("diff-a"), grid.length, headChoice.a, false);
  options($("diff-b"), grid.length, Math.min(headChoice.b, grid.length - 1), false);
  $("head-pick").onchange = showHeads;
  showHeads();
  // one head has no other to differ from: no difference is offered (head 0 − head 0 is zeros)
  const two = grid.length > 1;
  for (const id of ["diff-a-label", "diff-b-label", "heads-diff-hint"]) $(id).hidden = !two;
  if (!two) {
    $("heads-diff").replaceChildren();
    smallMapsGrid($("heads-maps"));
    return;
  }
  $("diff-a").onchange = $("diff-b").onchange = () => diffView(headWeights, rows, cols, allowed);
  diffView(headWeights, rows, cols, allowed);
}
