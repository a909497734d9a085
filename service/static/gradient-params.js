// @ts-check
// The gradients drawn beside no card (API "The backward pass, every step"): gradients.js draws a
// gradient beside its forward output's card, so a gradient whose forward array has none — grad_x
// and the weights' when x and the weights were given, every parameter's (the biases', the
// sinks', the norms' weights, the layer norm's γ and β, the gate's, T5's table, MLA's), the
// context's and the cache's, /multihead's per key/value head keys and values, a head's share
// of dO and its grad_scores — is drawn here, after the maps, in a section of its own: a signed
// map each (gradients.js's colours), its rows the tokens for x, the context and the cache and
// indices otherwise, a vector or a number one row; per head where it is a head's, per key/value
// head where the answer keeps it so, for the batch item picked. A click or Enter on a cell
// explains it as any gradient cell (explain.js → backward-explain.js). /multihead's top-level
// stacks of the heads' own arrays (grad_weights [h][L][S]) are drawn per head already.
import { $, state } from "./lib/state.js";
import { heatmap } from "./heatmap.js";
import { GRAD_KIND } from "./gradients.js";
import { GRAD_PREFIX, PER_KV } from "./lib/schema.js";
import { slotOf } from "./lib/layers.js";

const SECTION = "param-grads";
const TITLE = "Gradients of the inputs and the parameters";
const HINT =
  "∂loss/∂ each input and parameter that has no map of its own above: which way, and how hard, a training step would push each number. Red is negative, blue positive, each map scaled to its largest |value|. Rows are tokens for x, the context and the cache, indices otherwise; a bias, a norm's weight or the sinks are one row. Click a cell (or focus it and press Enter) to see how it was computed.";

// a parameter's gradient is summed over the batch items: never [B]
const PARAM = /^(w_|b_|ln_|gate_[wb]$|sinks$|relative_bias_table$)|norm_(weight|bias)$/;
// parameters whose columns are the heads (/multihead's sinks [h], T5's table [buckets][h])
const HEAD_COLUMNS = new Set(["sinks", "relative_bias_table"]);
const CACHE = new Set(["past_k", "past_v"]);
const KEY_ROWS = new Set(["context", "k", "v", "c_kv", "k_rope"]);

const indices = (n, say = (i) => String(i)) => Array.from({ length: n }, (_, i) => say(i));
const depth = (a) => (Array.isArray(a) ? 1 + depth(a[0]) : 0);

/** The gradients drawn beside a forward card (render.js's `drawn`): "name" or "heads.h.name". */
function drawnBeside(drawn) {
  const said = new Set();
  for (const item of drawn)
    if (item.grad && item.grad.length && item.view && item.view.grad)
      said.add(item.head === undefined ? item.view.grad : `heads.${item.head}.${item.view.grad}`);
  return said;
}

/** `a` as rows of numbers: a number one cell, a vector one row, a matrix as is. */
function asRows(a) {
  if (typeof a === "number" || a === null) return [[a]];
  return depth(a) === 1 ? [a] : a;
}

/** Row labels of grad_<of> (n rows): the cache's, the keys' or the queries' tokens where the
 * rows are tokens, else indices; a vector's one row is named by its array. */
function rowLabels(of, n, { data, rows }, oneRow) {
  if (oneRow) return [of];
  if (PARAM.test(of)) return indices(n);
  if (CACHE.has(of)) return indices(n, (i) => `cache ${i}`);
  const keys = KEY_ROWS.has(of) && Array.isArray(data.context_tokens) ? data.context_tokens : null;
  const tokens = keys ?? rows;
  return Array.isArray(tokens) && tokens.length === n ? tokens.map(String) : indices(n);
}

/** Column labels of grad_<of> (n columns): the keys' for a map of scores, "head j" where the
 * columns are the heads, else indices. */
function colLabels(of, n, { cols, ep }) {
  const slot = slotOf(of);
  if ((slot === "scores" || slot === "weights") && cols.length === n) return cols.map(String);
  if (HEAD_COLUMNS.has(of) && ep === "multihead") return indices(n, (j) => `head ${j}`);
  return indices(n);
}

/**
 * One card to draw: `m` its rows, `key` its figure's name, `where` the explanation's head and
 * batch (null: none), `kv` the key/value head it belongs to, `click` whether its cells explain.
 * @typedef {{name: string, m: any[][], key: string, title: string, head: number | null,
 *   batch: number | null, kv: number | null, click: boolean, oneRow: boolean}} Card
 */

/** The cards of top-level gradient `name` (its value `a`) for batch item b. */
function topCards(name, a, ctx) {
  const of = name.slice(GRAD_PREFIX.length);
  const batchedHere = ctx.batched && !PARAM.test(of);
  const v = batchedHere ? a[ctx.batch] : a;
  const title = `∂loss/∂${of} (${name})`;
  const base = { name, head: null, batch: batchedHere ? ctx.batch : null, kv: null, click: true };
  if (depth(v) <= 2) return [{ ...base, m: asRows(v), key: name, title, oneRow: depth(v) < 2 }];
  // [h_kv][rows][·]: one card a key/value head (its cells explained with ctx.kv)
  const kvHeads = ctx.ep === "multihead" && PER_KV.has(of);
  return v.map((m, g) => ({
    ...base,
    m,
    key: `kv${g}_${name}`,
    title: `${kvHeads ? "key/value head" : "part"} ${g}: ${title}`,
    kv: g,
    click: kvHeads,
    oneRow: false,
  }));
}

/** /multihead: the stack [h][…] of the heads' own gradient `name` (drawn per head). */
function stacksHeads(name, a, data) {
  const heads = Array.isArray(data.heads) ? data.heads : [];
  if (!heads.length || !heads.every((h) => h && Array.isArray(h[name]))) return false;
  return depth(a) === depth(heads[0][name]) + 1;
}

/** Every gradient of the answer drawn beside no card, as cards, in the answer's order: the
 * top level's, then each head's. */
export function undrawnCards(ctx) {
  const { data, drawn } = ctx;
  const beside = drawnBeside(drawn);
  const cards = [];
  for (const [name, a] of Object.entries(data)) {
    if (!name.startsWith(GRAD_PREFIX) || beside.has(name)) continue;
    if (!Array.isArray(a) && typeof a !== "number") continue; // grad_state_dict: the same, renamed
    if (ctx.ep === "multihead" && stacksHeads(name, a, data)) continue;
    cards.push(...topCards(name, a, ctx));
  }
  (Array.isArray(data.heads) ? data.heads : []).forEach((head, h) => {
    for (const [name, a] of Object.entries(head || {})) {
      if (!name.startsWith(GRAD_PREFIX) || beside.has(`heads.${h}.${name}`)) continue;
      const m = ctx.batched ? a[ctx.batch] : a;
      if (!Array.isArray(m)) continue;
      const of = name.slice(GRAD_PREFIX.length);
      cards.push({
        name,
        m: asRows(m),
        key: `head${h}_${name}`,
        title: `head ${h}: ∂loss/∂${of} (${name})`,
        head: h,
        batch: ctx.batched ? ctx.batch : null,
        kv: null,
        click: true,
        oneRow: depth(m) < 2,
      });
    }
  });
  return cards;
}

/** The card's figure: a signed map, its cells explained through `explain` (render.js's). */
function figureOf(card, ctx, explain) {
  const of = card.name.slice(GRAD_PREFIX.length);
  const rows = rowLabels(of, card.m.length, ctx, card.oneRow);
  const cols = colLabels(of, card.m[0].length, ctx);
  const onCell = card.click
    ? (i, j) => {
        const cell = { ...ctx.explainCtx, name: card.name, head: card.head, batch: card.batch };
        explain({ ...cell, kv: card.kv, i, j }).catch((e) => {
          $("explain-body").textContent = `No explanation: ${e.message}`;
          $("explain").hidden = false;
        });
      }
    : null;
  const axes = [card.oneRow ? "rows" : PARAM.test(of) ? "rows" : "tokens", "columns"];
  const fig = heatmap(card.key, card.title, card.m, rows, cols, GRAD_KIND, null, onCell, axes);
  fig.classList.add("gradient");
  if (card.head !== null) fig.dataset.head = String(card.head);
  if (card.kv !== null) fig.dataset.kv = String(card.kv);
  return fig;
}

/** The head picker (heads.js) shows one head's cards or all: a per-head card follows it, a key/
 * value head's card shows with the query heads it serves. */
function followHeads(box, data) {
  const show = $("head-pick").value;
  const h = Number(data.num_heads) || 1;
  const group = h / (Number(data.num_kv_heads) || h);
  for (const fig of /** @type {NodeListOf<HTMLElement>} */ (box.querySelectorAll("figure"))) {
    const head = fig.dataset.head,
      kv = fig.dataset.kv;
    fig.hidden =
      show !== "all" &&
      show !== "" &&
      ((head !== undefined && head !== show) ||
        (kv !== undefined && Math.floor(Number(show) / group) !== Number(kv)));
  }
}

let following = false;

/** The section after the maps (made once, placed after #heatmaps). */
function section() {
  let box = /** @type {HTMLElement | null} */ (document.getElementById(SECTION));
  if (box) return box;
  box = document.createElement("section");
  box.id = SECTION;
  box.setAttribute("aria-labelledby", `${SECTION}-heading`);
  const h2 = document.createElement("h2");
  h2.id = `${SECTION}-heading`;
  h2.textContent = TITLE;
  const hint = document.createElement("p");
  hint.className = "hint";
  hint.textContent = HINT;
  const maps = document.createElement("div");
  maps.className = "maps";
  maps.id = `${SECTION}-maps`;
  box.append(h2, hint, maps);
  $("heatmaps").after(box);
  return box;
}

/**
 * Draws the answer's gradients that no forward card has beside it (render.js calls this once
 * the outputs are drawn, with its `drawn`, and `explain`: its cell-explanation hook).
 * @param {{ep: string, data: any, body: any, batch: number, batched: boolean, drawn: any[],
 *   rows: any[], cols: any[]}} drawnCtx
 * @param {(ctx: any) => Promise<void>} explain
 */
export function drawUndrawnGradients(drawnCtx, explain) {
  const { ep, data, body, batch, batched } = drawnCtx;
  const ctx = {
    ...drawnCtx,
    explainCtx: { endpoint: ep, data, request: body },
    batch: batched ? batch : 0,
  };
  const box = section();
  const cards = undrawnCards(ctx);
  box.hidden = !cards.length;
  const maps = $(`${SECTION}-maps`);
  maps.replaceChildren(...cards.map((c) => figureOf(c, ctx, explain)));
  followHeads(maps, data);
  if (!following) {
    following = true; // heads.js sets the picker's onchange: this listens beside it
    $("head-pick").addEventListener("change", () => {
      if (state.lastResult) followHeads($(`${SECTION}-maps`), state.lastResult.data);
    });
  }
}
