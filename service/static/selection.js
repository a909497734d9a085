// @ts-check
// Selected queries: pick several query tokens and see how much attention they give each key,
// summed and averaged over the picked rows of the weights (one head's, or the average of the
// heads on /multihead; the batch item drawn). Sums are the page's own: a browser test checks
// them against the service's weights.
// render.js calls drawSelection once the outputs are drawn (main.js registers it: whenDrawn).
import { $ } from "./lib/state.js";
import { fmt, isMatrix, count } from "./lib/format.js";
import { download, csvBlob } from "./lib/files.js";
import { SINK_WEIGHTS } from "./lib/layers.js";

const CHIPS_UP_TO = 64; // a button a query up to this many; above, only the index box
const KEYS_LISTED = 32; // keys listed above this many: the largest sums (the CSV has every key)

const choice = { picked: null, length: -1, source: "average" }; // kept across redraws

/** The rows named by `text`: indices and ranges such as "0 2-4", each below `n`. */
export function parseRows(text, n) {
  const out = new Set();
  for (const part of text.split(/[\s,]+/).filter(Boolean)) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!m) throw new Error(`"${part}" is not a query index or a range such as 2-5`);
    const a = Number(m[1]),
      b = m[2] === undefined ? a : Number(m[2]);
    if (a > b || b >= n) throw new Error(`${part}: the queries are 0 to ${n - 1}`);
    for (let i = a; i <= b; i++) out.add(i);
  }
  return out;
}

/** The shortest text for a set of rows: "0 2-4 7". */
export function rowsText(set) {
  const sorted = [...set].sort((a, b) => a - b);
  const parts = [];
  for (let k = 0; k < sorted.length; k++) {
    let e = k;
    while (e + 1 < sorted.length && sorted[e + 1] === sorted[e] + 1) e++;
    parts.push(e > k ? `${sorted[k]}-${sorted[e]}` : String(sorted[k]));
    k = e;
  }
  return parts.join(" ");
}

/** Column sums and means of `w`'s rows in `picked` (a masked −∞ or null weight counts as 0). */
export function columnTotals(w, picked) {
  const sum = new Array(w[0].length).fill(0);
  for (const i of picked)
    w[i].forEach((v, j) => {
      sum[j] += typeof v === "number" ? v : 0;
    });
  return { sum, mean: sum.map((s) => s / picked.size) };
}

// The weights the selection reads: `source` "average" (all heads, or the weights of /attention
// and /mask) or a head's index. `w` is undefined where the answer does not hold them.
function weightsOf(data, source, pick) {
  if (!multihead(data))
    return { w: pick(data.weights), sink: pick(data[SINK_WEIGHTS]), what: "the weights" };
  if (source === "average")
    return {
      w: pick(data.average_weights),
      sink: undefined,
      what: "the weights averaged over the heads",
    };
  const head = Array.isArray(data.heads) ? data.heads[Number(source)] : undefined;
  const stacked = pick(data.weights); // /multihead's weights of every head at once: [h][L][S]
  const w = head
    ? pick(head.weights)
    : Array.isArray(stacked)
      ? stacked[Number(source)]
      : undefined;
  return { w, sink: head && pick(head[SINK_WEIGHTS]), what: `head ${source}'s weights` };
}

// /multihead's answers say num_heads; /attention's and /mask's do not.
const multihead = (data) => data.num_heads !== undefined;

// The sources the answer holds (an `include` may leave out the average or the heads' weights).
function sources(data, pick) {
  const heads = multihead(data) ? Array.from({ length: data.num_heads }, (_, h) => String(h)) : [];
  const all = [
    ["average", heads.length ? "the average of the heads" : "the weights"],
    ...heads.map((h) => [h, `head ${h}`]),
  ];
  return all.filter(([value]) => isMatrix(weightsOf(data, value, pick).w));
}

/** Draws the section for the answer drawn: `pick(v)` takes the batch item, `rows`/`cols` label the axes. */
export function drawSelection({ data, pick, rows, cols }) {
  const section = $("pick");
  const held = sources(data, pick);
  section.hidden = !held.length;
  if (!held.length) return;
  const select = $("pick-source");
  select.replaceChildren(...held.map(([value, text]) => new Option(text, value)));
  select.value = held.some(([value]) => value === choice.source) ? choice.source : held[0][0];
  $("pick-source-label").hidden = !multihead(data);
  const L = weightsOf(data, select.value, pick).w.length;
  const everyQuery = () => new Set(Array.from({ length: L }, (_, i) => i));
  if (choice.length !== L || !choice.picked) {
    choice.picked = everyQuery();
    choice.length = L;
  } // all, at first
  const chips = $("pick-chips");
  chips.replaceChildren();
  if (L <= CHIPS_UP_TO) {
    for (let i = 0; i < L; i++) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "chip";
      b.dataset.row = String(i);
      b.textContent = rows[i] ?? String(i);
      b.title = `query ${i}`;
      b.addEventListener("click", () => {
        toggle(i);
        update();
      });
      chips.append(b);
    }
  }
  const update = () => show(data, pick, rows, cols);
  $("pick-source").onchange = () => {
    choice.source = $("pick-source").value;
    update();
  };
  $("pick-all").onclick = () => {
    choice.picked = everyQuery();
    update();
  };
  $("pick-none").onclick = () => {
    choice.picked = new Set();
    update();
  };
  $("pick-queries").onchange = () => {
    const box = $("pick-queries");
    try {
      choice.picked = parseRows(box.value, L);
      $("pick-error").hidden = true;
      box.classList.remove("bad");
    } catch (e) {
      $("pick-error").textContent = e.message;
      $("pick-error").hidden = false;
      box.classList.add("bad");
      return;
    }
    update();
  };
  update();
}

function toggle(i) {
  if (choice.picked.has(i)) choice.picked.delete(i);
  else choice.picked.add(i);
}

function show(data, pick, rows, cols) {
  const { w, sink, what } = weightsOf(data, $("pick-source").value, pick);
  const picked = choice.picked;
  $("pick-queries").value = rowsText(picked);
  $("pick-error").hidden = true;
  $("pick-queries").classList.remove("bad");
  for (const b of /** @type {HTMLCollectionOf<HTMLElement>} */ ($("pick-chips").children))
    b.setAttribute("aria-pressed", String(picked.has(Number(b.dataset.row))));
  const out = $("pick-result");
  if (!picked.size) {
    out.replaceChildren(
      Object.assign(document.createElement("p"), {
        className: "hint",
        textContent: "No query picked: pick one or more above.",
      }),
    );
    return;
  }
  const { sum, mean } = columnTotals(w, picked);
  const keys = cols.length === sum.length ? cols : sum.map((_, j) => String(j));
  const names = [...picked].sort((a, b) => a - b).map((i) => rows[i] ?? `query ${i}`);
  let top = 0;
  sum.forEach((s, j) => {
    if (s > sum[top]) top = j;
  });
  const sinkSum = Array.isArray(sink)
    ? [...picked].reduce((s, i) => s + (typeof sink[i] === "number" ? sink[i] : 0), 0)
    : null;
  const say = document.createElement("p");
  say.className = "pick-summary";
  say.textContent = `${picked.size === 1 ? "The query" : `The ${picked.size} queries`} ${names.length > 6 ? `${names.slice(0, 6).join(", ")}, …` : names.join(", ")} give most attention to ${keys[top]}: ${fmt(sum[top])} in all, ${fmt(mean[top])} on average (from ${what}).`;
  // the keys listed: every key up to KEYS_LISTED, else the largest sums, in key order
  let listed = sum.map((_, j) => j);
  if (listed.length > KEYS_LISTED)
    listed = listed
      .sort((a, b) => sum[b] - sum[a])
      .slice(0, KEYS_LISTED)
      .sort((a, b) => a - b);
  const t = document.createElement("table");
  t.className = "matrix pick-table";
  t.dataset.name = "selected_queries";
  const caption = t.createCaption();
  caption.textContent = `Attention over keys of ${count(picked.size, "query", "queries")}${listed.length < sum.length ? ` — the ${count(listed.length, "key")} with the largest sums of ${sum.length}` : ""} `;
  const csv = document.createElement("button");
  csv.type = "button";
  csv.className = "secondary small";
  csv.textContent = "CSV";
  csv.setAttribute("aria-label", "Download the selected queries' sums as CSV");
  csv.addEventListener("click", () =>
    download("selected_queries.csv", csvOf(keys, sum, mean, sinkSum, picked.size)),
  );
  caption.append(csv);
  const head = t.createTHead().insertRow();
  for (const h of ["key", "sum", "average", ""]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const body = t.createTBody();
  const most = Math.max(...mean, sinkSum === null ? 0 : sinkSum / picked.size) || 1;
  const line = (label, j, s, a) => {
    const tr = body.insertRow();
    if (j !== null) tr.dataset.col = String(j);
    const th = document.createElement("th");
    th.textContent = label;
    tr.append(th);
    for (const v of [s, a]) {
      const td = tr.insertCell();
      td.textContent = fmt(v);
      td.dataset.value = String(v);
      td.title = String(v);
    }
    const bar = tr.insertCell();
    bar.className = "bar-cell";
    const fill = document.createElement("span");
    fill.className = "bar";
    fill.style.width = `${Math.max(0, (a / most) * 100)}%`;
    bar.append(fill);
  };
  for (const j of listed) line(keys[j], j, sum[j], mean[j]);
  if (sinkSum !== null) line("(sink)", null, sinkSum, sinkSum / picked.size);
  const wrap = document.createElement("div");
  wrap.className = "table-scroll";
  wrap.append(t);
  out.replaceChildren(say, wrap);
}

function csvOf(keys, sum, mean, sinkSum, n) {
  const labels = [...keys, ...(sinkSum === null ? [] : ["(sink)"])];
  const m = [
    ...sum.map((s, j) => [s, mean[j]]),
    ...(sinkSum === null ? [] : [[sinkSum, sinkSum / n]]),
  ];
  return csvBlob(m, labels, ["sum", "average"]);
}
