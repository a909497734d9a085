// @ts-check
// The results: the summary, every output the schema's x-view marks (maps, tables, the heads side
// by side), the steps, the batch picker, a stale answer marked as such, and the cell-explanation
// panel (explain.js, loaded on the first click). What else draws from the answer (compare.js,
// selection.js) registers a hook (whenDrawn): this module imports none of its callers.
import { $, state } from "./lib/state.js";
import { fmt, isMatrix, isStack } from "./lib/format.js";
import { responseViews, firstMap, isBatched, axesOf } from "./lib/schema.js";
import { table } from "./lib/table.js";
import { heatmap, smallMapsGrid } from "./heatmap.js";
import { headsPanel, foldedTables, collapsed } from "./heads.js";
import { SINK_WEIGHTS, explains, kindOf } from "./lib/layers.js";
import { GRAD_PREFIX } from "./lib/schema.js";
import { gradientCard, besideGradient, stepItems } from "./gradients.js";
import { drawUndrawnGradients } from "./gradient-params.js";

/** @typedef {import("./lib/schema.js").View} View */
/**
 * One output to draw: `m` its matrix, `head` the /multihead head it belongs to, `grad` its
 * gradient's matrix when the answer holds one (drawn beside it: gradients.js).
 * @typedef {{key: string, label?: string, title: string, view: View, m: any, head?: number,
 *   grad?: any}} DrawItem
 */

/** @typedef {HTMLButtonElement | HTMLSelectElement | HTMLInputElement | HTMLTextAreaElement} FormControl */

// The service describes each drawable output in its OpenAPI document (lib/schema.js: the x-view
// of each property of the endpoint's response schema; property order is drawing order). No output
// name is listed for drawing: the map of the step of kind "scale" (x-chain) shows the factor in
// its title, a head's map of kind "mask" is folded.

export function setupBatch(ep, data) {
  const pick = $("batch");
  pick.replaceChildren();
  const batched = isBatched(ep, data);
  $("batch-pick").hidden = !batched;
  if (batched) {
    const n = firstMap(ep, data).length;
    for (let b = 0; b < n; b++) pick.add(new Option(String(b), String(b)));
  }
}

// ---- the cell-explanation hook (explain.js) ---------------------------------------------------

// The outputs whose cells explain themselves (lib/layers.js: explains): a click or Enter on a
// cell calls explainCell(ctx).

let explainer = null; // the module, loaded on the first click (a page without it still works)
export async function explain(ctx) {
  if (!explainer) explainer = await import("./explain.js");
  const el = explainer.explainCell(ctx);
  const panel = $("explain");
  const body = $("explain-body");
  if (!el) {
    closeExplain();
    return;
  }
  body.replaceChildren(el);
  const back = el.querySelector("button.explain-back");
  if (back) {
    back.addEventListener("click", async () => {
      await explain({ ...ctx, name: back.dataset.step, i: +back.dataset.i, j: +back.dataset.j });
      /** @type {HTMLElement} */ (
        $("explain-body").querySelector("button.explain-back") || $("explain-close")
      ).focus(); // the keyboard walks on
    });
  }
  panel.hidden = false;
  panel.dataset.name = ctx.name;
  panel.dataset.cell = `${ctx.i},${ctx.j}`;
  panel.dataset.head = ctx.head === null ? "" : String(ctx.head);
  const top = panel.getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight - 40) panel.scrollIntoView({ block: "nearest" });
}

export function closeExplain() {
  $("explain").hidden = true;
  $("explain-body").replaceChildren();
}

// A vector without x-view: the weight each query row gives the sink, drawn as a one-column table.
export function sinkColumn(obj) {
  const v = obj && obj[SINK_WEIGHTS];
  if (!Array.isArray(v) || !v.length) return null;
  const b = Number($("batch").value || 0);
  const row = Array.isArray(v[0]) ? v[b] : v; // [L], or [B][L] when batched
  return Array.isArray(row) && row.every((x) => typeof x === "number") ? row.map((x) => [x]) : null;
}

// The explanation hook of one drawn output, or null when its cells explain nothing.
function cellHook(item, ep, b, batched) {
  if (!item.label || !item.view) return null;
  const parts = item.label.split(".");
  const name = parts.at(-1);
  const head = parts[0] === "heads" ? Number(parts[1]) : null;
  if (!explains(name) && !name.startsWith(GRAD_PREFIX)) return null; // every gradient's cell
  return (i, j) => {
    const r = state.lastResult;
    explain({
      endpoint: r.ep,
      data: r.data,
      request: r.body,
      name,
      head,
      batch: batched ? b : null,
      i,
      j,
    }).catch((e) => {
      $("explain-body").textContent = `No explanation: ${e.message}`;
      $("explain").hidden = false;
    });
  };
}

// What else draws from the answer (compare.js's boxes, selection.js's section): each hook is
// called once the outputs are drawn, with {ep, data, body, batch, batched, drawn, pick, rows,
// cols}; main.js registers them (so that this module imports none of them).
const drawnHooks = [];
export function whenDrawn(hook) {
  drawnHooks.push(hook);
}

/** Marks the answer drawn as stale (`stale`: the last Run failed, so it answers an earlier
 * request) or fresh again. A stale answer stays readable but says so above it, and every
 * control in it (exports, compare, batch and head pickers, cells) is off until the next answer. */
export function markStale(stale) {
  const results = $("results");
  if (stale && (results.hidden || !state.lastResult)) return; // nothing drawn yet
  results.classList.toggle("stale", stale);
  results.inert = stale;
  $("stale-note").hidden = !stale;
  if (stale) results.setAttribute("aria-describedby", "stale-note");
  else results.removeAttribute("aria-describedby");
  if (stale) {
    closeExplain();
    // a curl command shown for the answered request is of that request too
    if (!$("curl").hidden && $("curl").dataset.body === JSON.stringify(state.lastResult.body))
      $("curl").hidden = true;
  }
  /** @type {NodeListOf<FormControl>} */ (
    results.querySelectorAll("button, select, input, textarea")
  ).forEach((el) => {
    if (stale && !el.disabled) {
      el.disabled = true;
      el.dataset.staleOff = "";
    } else if (!stale && el.dataset.staleOff !== undefined) {
      el.disabled = false;
      delete el.dataset.staleOff;
    }
  });
}

/** Each head's outputs (/attention's: the answer's) in the order their steps were made: the
 * schema's, but qk_norm after RoPE (Llama 4's after_rope) normalises the rotated queries, and
 * its tables follow. Items with a step trade places among themselves; the others keep theirs. */
function inStepOrder(items, steps) {
  const at = new Map((steps || []).map((s, n) => [s.name, n]));
  const heads = new Set(items.map((it) => it.head).filter((h) => h !== undefined));
  for (const h of heads.size ? heads : [undefined]) {
    const places = items.flatMap((it, n) => (it.head === h && at.has(it.view.name) ? [n] : []));
    const sorted = places
      .map((n) => items[n])
      .sort((a, b) => at.get(a.view.name) - at.get(b.view.name));
    places.forEach((n, k) => (items[n] = sorted[k]));
  }
}

/** The keys' labels when the answer names none: the queries' when there are as many; with
 * `past` (a decode step) the cache's keys "cache 0" … then the new tokens' as their rows are
 * named (the service's own labels when the request has tokens); else their indices. */
function keyLabels(S, rows, body) {
  const cached = body && body.past ? S - rows.length : 0;
  if (cached > 0) return [...Array.from({ length: cached }, (_, i) => `cache ${i}`), ...rows];
  return S === rows.length ? rows : Array.from({ length: S }, (_, i) => String(i));
}

export function render() {
  if (!state.lastResult) return;
  const { ep, data } = state.lastResult;
  closeExplain(); // it spoke of the answer drawn before
  const views = responseViews(ep);
  const b = Number($("batch").value || 0);
  const batched = isBatched(ep, data);
  const pick = (v) => (v === undefined || v === null ? v : batched ? v[b] : v);
  // a drawn value is [·][·], or [B][·][·] when batched (generated arrays never gain the B)
  const matrix = (v) => (isStack(v) ? v[b] : isMatrix(v) ? v : undefined);
  const first = matrix(firstMap(ep, data));
  const n = first ? first.length : 0;
  const rows = data.tokens || Array.from({ length: n }, (_, i) => String(i));
  const S = first && first.length ? first[0].length : 0;
  const cols = data.context_tokens || keyLabels(S, rows, state.lastResult.body);
  $("results").hidden = false;

  const summary = pick(data.summary) || [];
  $("summary").replaceChildren(
    ...summary.map((r, i) => {
      const li = document.createElement("li");
      const who = r.token ?? `query ${i}`;
      li.textContent =
        r.top_key_index === null
          ? `${who} attends to no key (every key is masked)`
          : `${who} attends most to ${r.top_key ?? `key ${r.top_key_index}`}, ${fmt(r.top_weight)} (entropy ${fmt(r.entropy_bits)} bits)`;
      return li;
    }),
  );

  // what to draw, in schema order: {key, title, view, m}; a per-head list expands in place
  /** @type {DrawItem[]} */
  const items = [];
  for (const view of views) {
    if (!view.each) {
      const title =
        kindOf(view.name) === "scale" && data.scale !== undefined
          ? `${view.title}  · ${fmt(data.scale)}`
          : view.title;
      const grad = view.grad ? matrix(data[view.grad]) : undefined;
      items.push({
        key: view.name,
        label: view.name,
        title,
        view,
        m: matrix(data[view.name]),
        grad,
      });
      continue;
    }
    (Array.isArray(data[view.name]) ? data[view.name] : []).forEach((head, i) => {
      // every map of the head (its masked scores are folded below; the head picker shows one head)
      for (const v of view.each) {
        const item = {
          key: `head${i}_${v.name}`,
          label: `heads.${i}.${v.name}`,
          title: `head ${i}: ${v.title}`,
          view: v,
          m: matrix(head[v.name]),
          head: i,
          grad: v.grad ? matrix(head[v.grad]) : undefined,
        };
        if (item.m) items.push(item);
      }
      const sinks = sinkColumn(head);
      if (sinks)
        items.push({
          key: `head${i}_${SINK_WEIGHTS}`,
          title: `head ${i}: sink weights`,
          view: { rows: "queries" },
          m: sinks,
          head: i,
        });
    });
  }

  inStepOrder(items, data.steps);

  const topSinks = sinkColumn(data);
  if (topSinks)
    items.push({
      key: SINK_WEIGHTS,
      title: "sink weights",
      view: { rows: "queries" },
      m: topSinks,
    });

  const maskView = views.find((v) => v.map === "mask");
  const allowed = maskView ? matrix(data[maskView.name]) : undefined; // hatches masked cells of weights maps
  const labels = { queries: rows, keys: cols, index: [] };
  const maps = [];
  const folded = []; // maps folded away, after the others (a folded card is one line high)
  const tables = [];
  const headTables = new Map(); // /multihead: each head's tables, folded together
  const drawn = []; // for "compare with my numbers" (compare.js): each output and its element
  const grid = []; // /multihead: each head's weights, side by side
  let average = null;
  for (const item of items) {
    const { key, title, view, m } = item;
    if (!m || !m.length) continue;
    const onCell = cellHook(item, ep, b, batched);
    const head = item.head ?? null;
    const axes = axesOf(view);
    // the card and, when the answer holds its gradient, the gradient's beside it (gradients.js)
    const withGradient = (card) => {
      if (!item.grad || !item.grad.length) return card;
      const label = item.head === undefined ? view.grad : `heads.${item.head}.${view.grad}`;
      const onGrad = cellHook({ ...item, label }, ep, b, batched);
      const where = { head: item.head, rows, cols, labels, allowed, onCell: onGrad };
      return besideGradient(card, gradientCard(view, item.grad, where));
    };
    let el;
    if (view.map) {
      el = heatmap(
        key,
        title,
        m,
        rows,
        cols,
        view.map,
        view.map === "weights" ? allowed : null,
        onCell,
        axes,
      );
      if (head !== null) el.dataset.head = String(head);
      const placed = withGradient(el);
      if (head !== null && view.name === "weights")
        grid.push(placed); // heads side by side
      else if (head !== null && kindOf(view.name) === "mask" && placed === el)
        folded.push(collapsed(title, el)); // the same numbers as the scores, with −∞: folded
      else if (key === "average_weights") average = el;
      else maps.push(placed); // a head's masked scores beside their gradient dS: not folded
    } else {
      el = table(key, title, m, labels[view.rows] || [], onCell);
      if (head !== null) el.dataset.head = String(head);
      const placed = withGradient(el);
      if (head === null) tables.push(placed);
      else {
        if (!headTables.has(head)) headTables.set(head, []);
        const said = title.replace(/^head \d+: /, "");
        headTables.get(head).push({ title: placed === el ? said : `${said} and ∂`, el: placed });
      }
    }
    drawn.push({
      ...item,
      el,
      axes,
      rows: view.map ? rows : labels[view.rows] || [],
      cols: view.map ? cols : null,
    });
  }
  if (average && !grid.length) maps.unshift(average);
  $("heatmaps").replaceChildren(...maps, ...folded);
  smallMapsGrid($("heatmaps"));
  $("tables").replaceChildren(
    ...[...headTables].map(([h, list]) => foldedTables(h, list)),
    ...tables,
  );
  headsPanel(
    grid,
    average,
    (i) => matrix(data.heads && data.heads[i] ? data.heads[i].weights : undefined),
    rows,
    cols,
    allowed,
  );
  const ctx = { ep, data, body: state.lastResult.body, batch: b, batched, drawn, pick, rows, cols };
  for (const hook of drawnHooks) hook(ctx);
  drawUndrawnGradients(ctx, explain); // the gradients beside no card, in a section of their own

  $("steps").replaceChildren(...stepItems(data.steps || [])); // the backward's marked
}
