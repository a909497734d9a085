// @ts-check
// The results: what to draw (the x-view entries of the response schema), maps, tables, summary
// and steps, and the batch picker.
import { $, state } from "./request.js";
import { heatmap, button } from "./heatmap.js";
import { fmt } from "./cells.js";
import { download, csvBlob } from "./export.js";

/**
 * What the schema's x-view says of one output (see below): a map's colours or a table's rows, or
 * (`each`) the views of every item of a per-head list.
 * @typedef {{name?: string, title?: string, map?: string | null, rows?: string, each_head?: boolean,
 *   each?: View[]}} View
 */
/**
 * One output to draw: `m` its matrix, `head` the /multihead head it belongs to.
 * @typedef {{key: string, label?: string, title: string, view: View, m: any, head?: number}} DrawItem
 */

/** @typedef {HTMLButtonElement | HTMLSelectElement | HTMLInputElement | HTMLTextAreaElement} FormControl */

export const TABLE_ROWS = 64;
// The service describes each drawable output in its OpenAPI document: the property of the
// endpoint's response schema carries `x-view` {title, map, rows, each_head}, and property order is
// drawing order. `map` names a heatmap's colours (scores, weights, mask); without one the output is
// a table whose rows are the query tokens, the key tokens or plain indices. A property holding a
// list of objects whose own properties carry x-view (the per-head traces of /multihead) is drawn
// once per item, for the entries marked each_head. No output name is listed for drawing (only
// SCALED_BY_SCALE below, which adds the scale to one title).

export function resolveRef(ref) {
  return ref
    .replace(/^#\//, "")
    .split("/")
    .reduce((o, k) => (o ? o[k] : undefined), state.spec);
}

export function viewsOf(schema) {
  const views = [];
  for (const [name, prop] of Object.entries((schema && schema.properties) || {})) {
    const view = prop["x-view"];
    if (view) {
      views.push({ ...view, name, map: view.map || null });
      continue;
    }
    for (const alt of prop.anyOf || prop.oneOf || [prop]) {
      // a nullable property is anyOf [..., null]
      const item =
        alt.type === "array" && alt.items && alt.items.$ref ? resolveRef(alt.items.$ref) : null;
      const each = viewsOf(item).filter((v) => v.each_head && !v.each);
      if (each.length) {
        views.push({ name, each });
        break;
      }
    }
  }
  return views;
}

export const viewCache = new Map();
export function responseViews(ep) {
  if (!viewCache.has(ep)) {
    const schema =
      state.spec.paths[`/${ep}`].post.responses["200"].content["application/json"].schema;
    viewCache.set(ep, viewsOf(schema.$ref ? resolveRef(schema.$ref) : schema));
  }
  return viewCache.get(ep);
}

export const isMatrix = (m) => Array.isArray(m) && Array.isArray(m[0]) && !Array.isArray(m[0][0]);
export const isStack = (m) => Array.isArray(m) && Array.isArray(m[0]) && Array.isArray(m[0][0]);

// The first heatmap in the answer (top level first, then the first item of a per-head list), as
// returned: [L][S], or [B][L][S] when the request was batched.
export function firstMap(ep, data) {
  const views = responseViews(ep);
  for (const v of views) if (v.map && data[v.name]) return data[v.name];
  for (const v of views)
    if (v.each && Array.isArray(data[v.name]) && data[v.name][0]) {
      for (const e of v.each) if (e.map && data[v.name][0][e.name]) return data[v.name][0][e.name];
    }
  return null;
}

export function isBatched(ep, data) {
  return isStack(firstMap(ep, data));
}

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

// ---- drawing ------------------------------------------------------------------------------

// A matrix as a table (the first TABLE_ROWS rows) in a card (compare.js adds its box and its
// difference map to the card). `onCell(i, j)`: as for heatmap().
export function table(key, title, m, rows, onCell = null) {
  const card = document.createElement("div");
  card.className = "table-card";
  card.dataset.name = key;
  const wrap = document.createElement("div");
  wrap.className = "table-scroll";
  const t = document.createElement("table");
  t.className = "matrix";
  t.dataset.name = key;
  const caption = t.createCaption();
  caption.textContent = `${title} [${m.length} × ${m[0].length}]${m.length > TABLE_ROWS ? ` — first ${TABLE_ROWS} rows` : ""} `;
  const csv = button("CSV", () => download(`${key}.csv`, csvBlob(m, rows, null)));
  csv.className = "secondary small";
  csv.setAttribute("aria-label", `Download ${title} as CSV`);
  caption.append(csv);
  const head = t.createTHead().insertRow();
  head.append(document.createElement("th"));
  m[0].forEach((_, j) => {
    const th = document.createElement("th");
    th.textContent = String(j);
    head.append(th);
  });
  const tbody = t.createTBody();
  m.slice(0, TABLE_ROWS).forEach((row, i) => {
    const tr = tbody.insertRow();
    const th = document.createElement("th");
    th.textContent = rows[i] ?? String(i);
    tr.append(th);
    row.forEach((v, j) => {
      const td = tr.insertCell();
      td.textContent = fmt(v);
      td.title = String(v);
      if (onCell) {
        td.tabIndex = 0;
        td.dataset.row = i;
        td.dataset.col = j;
        td.setAttribute("role", "button");
      }
    });
  });
  if (onCell) {
    t.classList.add("explainable");
    const fire = (td) => onCell(+td.dataset.row, +td.dataset.col);
    tbody.addEventListener("click", (e) => {
      const td = /** @type {Element} */ (e.target).closest("td[data-row]");
      if (td) fire(td);
    });
    tbody.addEventListener("keydown", (e) => {
      const target = /** @type {Element} */ (e.target);
      const td = target.closest && target.closest("td[data-row]");
      if (td && (e.key === "Enter" || e.key === " ")) {
        e.preventDefault();
        fire(td);
      }
    });
  }
  wrap.append(t);
  card.append(wrap);
  return card;
}

// The names of an output's axes, rows then columns, from its x-view: a map is queries × keys; a
// table's rows are the queries, the keys or plain indices, and its columns features.
const ROW_NAMES = { queries: "queries", keys: "keys", index: "rows" };
export function axesOf(view) {
  return view.map ? ["queries", "keys"] : [ROW_NAMES[view.rows] || "rows", "features"];
}

// ---- the cell-explanation hook (explain.js) ---------------------------------------------------

// The outputs whose cells explain themselves: a click or Enter on a cell calls explainCell(ctx).
const EXPLAINED_MAPS = new Set([
  "scores",
  "scaled_scores",
  "capped_scores",
  "position_bias",
  "biased_scores",
  "masked_scores",
  "weights",
]);
const EXPLAINED_TABLES = new Set(["output"]);

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

// The map whose values are Q Kᵀ times `scale`: its title at the top level shows the factor.
export const SCALED_BY_SCALE = "scaled_scores";
// A vector without x-view: the weight each query row gives the sink, drawn as a one-column table.
export const SINK_WEIGHTS = "sink_weights";
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
  const wanted = item.view.map ? EXPLAINED_MAPS.has(name) : EXPLAINED_TABLES.has(name);
  if (!wanted) return null;
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

// ---- heads side by side (/multihead) -----------------------------------------------------------

const headChoice = { show: "all", a: 0, b: 1 }; // kept across redraws

// One head's tables (Q, K, V, …) folded into one card, its summary naming them.
function foldedTables(head, list) {
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

// Small maps (SVG, a value in every cell) side by side in a grid whose columns are a little
// narrower than the widest map (each map scales to its column); large maps (canvas) keep their
// row. `--map-min`: the columns' least width.
const GRID_UP_TO = 480; // px: the widest SVG map drawn in a grid
function smallMapsGrid(container) {
  const figures = [...container.querySelectorAll("figure.heatmap")];
  const widths = figures.map((f) => {
    const svg = f.querySelector(".map-scroll > svg");
    return svg ? Number(svg.getAttribute("width")) : Infinity;
  });
  const widest = Math.max(0, ...widths);
  const small = figures.length > 0 && widest <= GRID_UP_TO;
  container.classList.toggle("small-maps", small);
  if (small)
    container.style.setProperty("--map-min", `${Math.max(190, Math.round(widest * 0.7))}px`);
  else container.style.removeProperty("--map-min");
}

function collapsed(title, fig) {
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

function headsPanel(grid, average, headWeights, rows, cols, allowed) {
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
  $("diff-a").onchange = $("diff-b").onchange = () => diffView(headWeights, rows, cols, allowed);
  showHeads();
  diffView(headWeights, rows, cols, allowed);
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
  const cols =
    data.context_tokens ||
    (S === rows.length ? rows : Array.from({ length: S }, (_, i) => String(i)));
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
        view.name === SCALED_BY_SCALE && data.scale !== undefined
          ? `${view.title}  · ${fmt(data.scale)}`
          : view.title;
      items.push({ key: view.name, label: view.name, title, view, m: matrix(data[view.name]) });
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
      if (head !== null && view.name === "weights")
        grid.push(el); // heads side by side
      else if (head !== null && view.name === "masked_scores")
        folded.push(collapsed(title, el)); // the same numbers as the scores, with −∞: folded
      else if (key === "average_weights") average = el;
      else maps.push(el);
    } else {
      el = table(key, title, m, labels[view.rows] || [], onCell);
      if (head === null) tables.push(el);
      else {
        if (!headTables.has(head)) headTables.set(head, []);
        headTables.get(head).push({ title: title.replace(/^head \d+: /, ""), el });
      }
    }
    if (head !== null) el.dataset.head = String(head);
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

  $("steps").replaceChildren(
    ...(data.steps || []).map((s) => {
      const li = document.createElement("li");
      const code = document.createElement("code");
      code.textContent = s.formula;
      li.append(`${s.name}: `, code, `  [${s.shape.join(" × ")}]`);
      return li;
    }),
  );
}
