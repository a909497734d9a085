// @ts-check
// A POST /model answer drawn: the tokens, the model view (every layer × head, grid.js, its maps
// normalised by row or by head), a summary of the heads that matter, the attention rollout, and,
// once a layer is opened (a head or a layer's name clicked), that layer large: a head's weights
// (a heatmap.js card, the page's own), the layer's head view (lines.js) and the layer's `trace`,
// fetched then (mode.js) and handed to render.js as the /multihead answer it is, so that its
// maps, tables, steps and cell explanations are the page's usual ones.
import { $, state, button } from "../lib/state.js";
import { fmt, count, plural } from "../lib/format.js";
import { download } from "../lib/files.js";
import { heatmap } from "../heatmap.js";
import { render, setupBatch, markStale, explain, whenDrawn } from "../render.js";
import { modelGrid, roleScores, roleText, headSummary, NORMS } from "./grid.js";
import { headLines } from "./lines.js";
import { layerResult, layerNote } from "./compare.js";

/** The layer and head opened: kept across answers of the same model. */
const chosen = { model: "", layer: -1, head: -1 };
/** How the small maps are coloured (a key of NORMS): each row at first, so that a 128 × 128 map
 * is never white. */
let norm = "row";

/** The answer drawn: {body, data, layer} (data is POST /model's answer; `layer` the layer whose
 * trace data.trace is, or null); `open(l, h)` opens a layer (mode.js: draws it, fetches its
 * trace). */
let shown = null;
let open = (_layer, _head) => {};

/**
 * Draws `answer` in #model-results; the layer opened before is drawn again when its trace is in
 * the answer (else nothing is open).
 * @param {{body: any, data: any, layer: number | null}} answer
 * @param {(layer: number, head: number) => void} openLayer
 */
export function drawModel(answer, openLayer) {
  shown = answer;
  open = openLayer;
  const { data } = answer;
  const layers = data.attention.length,
    heads = data.attention[0].length;
  tokenStrip(data.tokens);
  $("model-heading").textContent =
    `${data.model.name}: ${count(layers, "layer")} × ${count(heads, "head")} on ${count(data.tokens.length, "token")}`;
  const named = data.head_roles.flat().filter((r) => r && r.role).length;
  $("model-roles-count").textContent =
    `${named} of ${count(layers * heads, "head")} ${plural(named, "has", "have")} a role (a score of 0.5 or more).`;
  const grid = modelGrid(data.attention, data.head_roles, (l, h) => open(l, h), norm);
  $("model-grid").replaceChildren(grid.el);
  $("model-grid").dataset.layers = String(layers);
  $("model-grid").dataset.heads = String(heads);
  gridSelect = grid.select;
  gridNormalise = grid.normalise;
  sayNorm();
  const lines = headSummary(data.attention, data.head_roles, data.tokens);
  $("model-summary").replaceChildren(
    ...lines.map((t) => {
      const li = document.createElement("li");
      li.textContent = t;
      return li;
    }),
  );
  if (chosen.model !== data.model.name || chosen.layer >= layers || chosen.head >= heads)
    Object.assign(chosen, { model: data.model.name, layer: -1, head: -1 });
  $("model-rollout").replaceChildren(
    heatmap(
      "model_rollout",
      "attention rollout: the last layer's R",
      data.rollout,
      data.tokens,
      data.tokens,
      "weights",
      null,
    ),
  );
  const save = button("JSON", () =>
    download(
      `model-${data.model.name}.json`,
      new Blob([JSON.stringify(data, null, 1)], { type: "application/json" }),
    ),
  );
  save.className = "secondary";
  save.setAttribute("aria-label", "Download this POST /model answer as JSON");
  $("model-export").replaceChildren(
    "This answer (the tokens, every head's weights, the roles, the rollout, and the trace of the layer opened): ",
    save,
  );
  if (answer.layer !== null && answer.layer === chosen.layer) {
    showLayer(chosen.layer, chosen.head, false);
    drawTrace();
  } else closeLayer();
}

let gridSelect = (_l, _h) => {};
let gridNormalise = (_norm) => {};

// The normalisation control (index.html's #model-norm radios) and what the colours then mean.
function sayNorm() {
  $("model-norm-says").textContent = `Colours: ${NORMS[norm].says}.`;
}
document.addEventListener("change", (e) => {
  const t = /** @type {HTMLInputElement} */ (e.target);
  if (t.name !== "model-norm" || !(t.value in NORMS)) return;
  norm = t.value;
  sayNorm();
  gridNormalise(norm);
});

/** Nothing open: the layer's box and its trace hidden, the hint to open one shown. */
function closeLayer() {
  gridSelect(-1, -1);
  $("model-head").hidden = true;
  $("model-trace-heading").textContent = "The layer, step by step";
  $("model-trace-note").textContent =
    "Open a layer (click a head, or a layer's name, above) to see its head view here and the layer step by step below; its trace is fetched then.";
  state.lastResult = null;
  $("results").hidden = true;
}

function tokenStrip(tokens) {
  $("model-tokens").replaceChildren(
    ...tokens.map((t, i) => {
      const s = document.createElement("span");
      s.className = "token";
      s.dataset.i = String(i);
      s.title = `token ${i}`;
      s.textContent = t;
      return s;
    }),
  );
}

/** The first head of layer `l` with a role (else its head 0). */
export function firstHead(l) {
  const roles = (shown && shown.data.head_roles[l]) || [];
  return Math.max(
    0,
    roles.findIndex((r) => r && r.role),
  );
}

/**
 * Layer `l` open, head `h` chosen: the head's weights large (explained when the trace is of its
 * layer), its scores, and the layer's head view with head h's lines shown (the heads shown
 * before kept when the same layer is drawn again). `scroll`: bring it into view.
 * @param {number} l
 * @param {number} h
 * @param {boolean} scroll
 */
export function showLayer(l, h, scroll) {
  const { body, data } = shown;
  const box = $("model-head");
  const again = !box.hidden && box.dataset.layer === String(l);
  const before = again
    ? [...box.querySelectorAll('.head-toggle[aria-pressed="true"]')].map((b) =>
        Number(/** @type {HTMLElement} */ (b).dataset.head),
      )
    : [];
  Object.assign(chosen, { layer: l, head: h });
  gridSelect(l, h);
  const m = data.attention[l][h];
  const r = data.head_roles[l][h];
  box.hidden = false;
  box.dataset.layer = String(l);
  box.dataset.head = String(h);
  const title = document.createElement("h3");
  title.id = "model-head-title";
  title.textContent = `Layer ${l}, head ${h}: ${roleText(r)}`;
  const scores = document.createElement("p");
  scores.className = "role-scores";
  scores.textContent = roleScores(r);
  const traced = data.trace && shown.layer === l; // the trace holds this head's q, k and scores
  const onCell = traced
    ? (i, j) =>
        explain({
          endpoint: "multihead",
          data: data.trace,
          request: { ...body, layer: l },
          name: "weights",
          head: h,
          batch: null,
          i,
          j,
        }).catch((e) => {
          $("explain-body").textContent = `No explanation: ${e.message}`;
          $("explain").hidden = false;
        })
    : null;
  const map = heatmap(
    "model_head",
    `layer ${l}, head ${h}: weights`,
    m,
    data.tokens,
    data.tokens,
    "weights",
    null,
    onCell,
  );
  map.dataset.layer = String(l);
  map.dataset.head = String(h);
  const note = document.createElement("p");
  note.className = "hint model-head-note";
  note.id = "model-head-note";
  note.textContent = traced
    ? `Layer ${l} is drawn step by step below: click a cell (or focus it and press Enter) to see how its weight was computed from the scores, and the scores from q and k.`
    : `Fetching layer ${l}'s trace (its q, k, scores and the steps after the heads)…`;
  const views = document.createElement("div");
  views.className = "model-head-views";
  const heads = before.includes(h) ? before : [...before, h];
  views.append(headLines(data.attention[l], data.tokens, `layer ${l}: head view`, heads), map);
  box.replaceChildren(title, scores, note, views);
  if (scroll) box.scrollIntoView({ block: "nearest" });
}

/** The opened layer's trace, drawn by render.js as the /multihead answer it is. */
export function drawTrace() {
  const { data, layer } = shown;
  const t = data.trace;
  $("model-trace-heading").textContent = `Layer ${layer}, step by step`;
  const x = Array.isArray(t.x_in) ? `${t.x_in.length} × ${t.x_in[0].length}` : "L × d_model";
  $("model-trace-note").textContent =
    `Below is layer ${layer} of ${data.model.name} as POST /multihead computes it: x = the hidden states entering the layer (x_in, ${x}), the layer's ${t.num_heads} heads of d_k = ${t.d_k}, scale ${fmt(t.scale)}, W_o, the residual and the layer norm. ` +
    layerNote(data);
  state.lastResult = layerResult(shown);
  markStale(false);
  setupBatch("multihead", t);
  render();
}

// The layer's tables after its heads (concat, projected, residual, layer_norm, output) are
// d_model wide: in model mode they are folded together as each head's are (laying out five
// tables of 64 × 384 cells costs seconds), under a summary naming them.
whenDrawn(({ data }) => {
  if (!shown || data !== shown.data.trace) return;
  const cards = [.../** @type {HTMLCollectionOf<HTMLElement>} */ ($("tables").children)].filter(
    (el) => el.classList.contains("table-card"),
  );
  if (!cards.length) return;
  const details = document.createElement("details");
  details.className = "head-tables layer-tables";
  const summary = document.createElement("summary");
  const shape = Array.isArray(data.output)
    ? ` [${data.output.length} × ${data.output[0].length}]`
    : "";
  summary.textContent = `the layer after its heads: ${cards.map((c) => c.dataset.name).join(", ")}${shape}`;
  const body = document.createElement("div");
  body.className = "tables";
  cards[0].before(details);
  body.append(...cards);
  details.append(summary, body);
});

/** Marks the model's drawn answer stale (a Run failed) or fresh. */
export function markModelStale(stale) {
  const box = $("model-results");
  if (stale && box.hidden) return;
  box.classList.toggle("stale", stale);
  box.inert = stale;
  if (state.lastResult) markStale(stale);
  else $("stale-note").hidden = !stale; // no layer open: the note is the model view's alone
}
