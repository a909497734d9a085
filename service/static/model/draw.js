// @ts-check
// A POST /model answer drawn: the tokens, the model view (every layer × head, grid.js), the head
// chosen there large (a heatmap.js card, the page's own, and the head view's lines, lines.js),
// the attention rollout, and the chosen layer's `trace` handed to render.js as the /multihead
// answer it is, so that its maps, tables, steps and cell explanations are the page's usual ones.
import { $, state, button } from "../lib/state.js";
import { fmt, count, plural } from "../lib/format.js";
import { download } from "../lib/files.js";
import { heatmap } from "../heatmap.js";
import { render, setupBatch, markStale, explain, whenDrawn } from "../render.js";
import { modelGrid, roleScores, roleText } from "./grid.js";
import { headLines } from "./lines.js";
import { layerResult, layerNote } from "./compare.js";

/** The head shown large: kept across answers of the same model (the grid's first choice else). */
const chosen = { model: "", layer: -1, head: -1 };

/** The answer drawn: {body, data} (data is POST /model's JSON); `traceLayer(l)` asks for layer
 * l's trace alone (mode.js). */
let shown = null;
let askTrace = (_layer) => {};

/**
 * Draws `answer` ({body, data}) in #model-results and its trace in #results.
 * @param {{body: any, data: any}} answer
 * @param {(layer: number) => void} traceLayer
 */
export function drawModel(answer, traceLayer) {
  shown = answer;
  askTrace = traceLayer;
  const { body, data } = answer;
  const layers = data.attention.length,
    heads = data.attention[0].length;
  tokenStrip(data.tokens);
  $("model-heading").textContent =
    `${data.model.name}: ${count(layers, "layer")} × ${count(heads, "head")} on ${count(data.tokens.length, "token")}`;
  const named = data.head_roles.flat().filter((r) => r && r.role).length;
  $("model-roles-count").textContent =
    `${named} of ${count(layers * heads, "head")} ${plural(named, "has", "have")} a role (a score of 0.5 or more).`;
  const grid = modelGrid(data.attention, data.head_roles, (l, h) => showHead(l, h, true));
  $("model-grid").replaceChildren(grid.el);
  $("model-grid").dataset.layers = String(layers);
  $("model-grid").dataset.heads = String(heads);
  gridSelect = grid.select;
  if (chosen.model !== data.model.name || chosen.layer >= layers || chosen.head >= heads) {
    // at first: the chosen layer's first head with a role (else its head 0)
    const roles = data.head_roles[body.layer] || [];
    const first = roles.findIndex((r) => r && r.role);
    Object.assign(chosen, { model: data.model.name, layer: body.layer, head: Math.max(0, first) });
  }
  showHead(chosen.layer, chosen.head, false);
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
  save.setAttribute("aria-label", "Download the whole POST /model answer as JSON");
  $("model-export").replaceChildren("The whole POST /model answer: ", save);
  drawTrace();
}

let gridSelect = (_l, _h) => {};

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

/** Layer `l`, head `h` large: its weights (explained when the trace is of its layer), its
 * scores, and its head view. `scroll`: bring it into view (a click in the grid). */
function showHead(l, h, scroll) {
  const { body, data } = shown;
  Object.assign(chosen, { layer: l, head: h });
  gridSelect(l, h);
  const m = data.attention[l][h];
  const r = data.head_roles[l][h];
  const box = $("model-head");
  box.hidden = false;
  box.dataset.layer = String(l);
  box.dataset.head = String(h);
  const title = document.createElement("h3");
  title.id = "model-head-title";
  title.textContent = `Layer ${l}, head ${h}: ${roleText(r)}`;
  const scores = document.createElement("p");
  scores.className = "role-scores";
  scores.textContent = roleScores(r);
  const traced = data.trace && body.layer === l; // the trace holds this head's q, k and scores
  const onCell = traced
    ? (i, j) =>
        explain({
          endpoint: "multihead",
          data: data.trace,
          request: body,
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
  if (traced)
    note.textContent = `Layer ${l} is the layer shown step by step below: click a cell (or focus it and press Enter) to see how its weight was computed from the scores, and the scores from q and k.`;
  else {
    note.append(
      `How a cell was computed needs this layer's q, k and scores, which come with the layer shown step by step (now layer ${body.layer}). `,
    );
    const go = button(`Show layer ${l} step by step`, () => askTrace(l));
    go.className = "secondary";
    go.id = "model-trace-this";
    note.append(go);
  }
  const views = document.createElement("div");
  views.className = "model-head-views";
  views.append(map, headLines(m, data.tokens, `layer ${l}, head ${h}: head view`));
  box.replaceChildren(title, scores, note, views);
  if (scroll) box.scrollIntoView({ block: "nearest" });
}

/** The chosen layer's trace, drawn by render.js as the /multihead answer it is. */
function drawTrace() {
  const { body, data } = shown;
  const t = data.trace;
  $("model-trace-heading").textContent = `Layer ${body.layer}, step by step`;
  const x = Array.isArray(t.x_in) ? `${t.x_in.length} × ${t.x_in[0].length}` : "L × d_model";
  $("model-trace-note").textContent =
    `Below is layer ${body.layer} of ${data.model.name} as POST /multihead computes it: x = the hidden states entering the layer (x_in, ${x}), the layer's ${t.num_heads} heads of d_k = ${t.d_k}, scale ${fmt(t.scale)}, W_o, the residual and the layer norm. ` +
    layerNote(shown.data);
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
}
