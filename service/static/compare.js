// @ts-check
// "Compare with my numbers" for the attention explorer: a box under each drawn output where a
// learner pastes the array their notebook computed (JSON, NumPy's or torch's print, or plain
// rows); a Compare action that re-sends the last request with `expected` filled from the boxes;
// and the answer drawn: warnings, the comparison in step order with the diagnosis of the first
// difference, and a difference heatmap (yours − ours) next to each compared output.
//
// render.js calls afterRender once the outputs are drawn (main.js registers it: whenDrawn);
// main.js calls startCompare.
import { $, state, showErrors, formFieldFor } from "./request.js";
import { heatmap, button } from "./heatmap.js";
import { fmt } from "./cells.js";
import { render, setupBatch } from "./render.js";

// null in `expected` is −∞ in these arrays and NaN elsewhere (API: "Compare with your numbers")
const NEG_INF_NAMES = new Set(["masked_scores", "additive_mask"]);
const MASKED_FLOOR = -1e9; // a score at or below this counts as masked (masked_fill(-1e9))
// drawn outputs that are inputs (generated) or not compared
const NOT_COMPARED = new Set(["x", "w_q", "w_k", "w_v", "sink_weights"]);

// ---- the parser ---------------------------------------------------------------------------

class ParseError extends Error {}

const NUMBER = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$/i;

function token(tok, where) {
  if (NUMBER.test(tok)) return Number(tok);
  if (/^[+-]?nan$/i.test(tok)) return NaN;
  const inf = /^([+-]?)inf(?:inity)?$/i.exec(tok);
  if (inf) return inf[1] === "-" ? -Infinity : Infinity;
  if (tok === "null" || tok === "None") return null;
  if (/^true$/i.test(tok)) return true;
  if (/^false$/i.test(tok)) return false;
  const shown = tok.length > 20 ? `${tok.slice(0, 20)}…` : tok;
  throw new ParseError(`${where ? `${where}: ` : ""}“${shown}” is not a number`);
}

// The name of a node of an array of `rank` dimensions at index path `path`.
function nodeName(path, rank) {
  if (!path.length) return "the array";
  if (path.length === rank - 1) {
    const row = `row ${path[path.length - 1]}`;
    return path.length > 1 ? `${row} of block ${path.slice(0, -1).join(",")}` : row;
  }
  return `block ${path.join(",")}`;
}

// Every row as long as the first, every block as deep: the shape NumPy would give it.
export function checkShape(value) {
  if (!Array.isArray(value) || !value.length) throw new ParseError("the array is empty");
  const shape = [];
  for (let node = value; Array.isArray(node); node = node[0]) {
    if (!node.length)
      throw new ParseError(shape.length ? "an empty [] holds no numbers" : "the array is empty");
    shape.push(node.length);
  }
  const rank = shape.length;
  const walk = (node, path) => {
    const d = path.length;
    const first = path.map(() => 0);
    if (node.length !== shape[d]) {
      const unit = d === rank - 1 ? "numbers" : d === rank - 2 ? "rows" : "blocks";
      throw new ParseError(
        `${nodeName(path, rank)} has ${node.length} ${unit} but ${nodeName(first, rank)} has ${shape[d]}`,
      );
    }
    node.forEach((child, i) => {
      const deeper = d + 1 < rank;
      if (Array.isArray(child) !== deeper) {
        const here = nodeName([...path, i], rank);
        throw new ParseError(
          deeper
            ? `${here} is a single number where a list was expected (a missing [ ?)`
            : `${nodeName(path, rank)} holds a list where numbers were expected (one [ too many?)`,
        );
      }
      if (deeper) walk(child, [...path, i]);
    });
  };
  walk(value, []);
  return shape;
}

// [[...]] with or without commas (JSON, NumPy, torch), inside array(...) or tensor(...).
function parseBracketed(src, open) {
  const prefix = src.slice(0, open).trim();
  if (prefix && !/^(?:[A-Za-z_]\w*\s*=\s*)?(?:[A-Za-z_][\w.]*\s*\(\s*)?$/.test(prefix)) {
    throw new ParseError(`unexpected text before the first [: “${prefix.slice(0, 30)}”`);
  }
  const root = [];
  const stack = [root];
  let i = open;
  let end = -1;
  const where = () => {
    const path = stack.slice(1).map((_, d) => stack[d].length - 1);
    return path.length > 1
      ? `row ${path[path.length - 1]}${path.length > 2 ? ` of block ${path.slice(0, -1).join(",")}` : ""}`
      : "";
  };
  while (i < src.length) {
    const c = src[i];
    if (c === "[") {
      const child = [];
      stack[stack.length - 1].push(child);
      stack.push(child);
      i++;
    } else if (c === "]") {
      stack.pop();
      i++;
      if (stack.length === 1) {
        end = i;
        break;
      }
    } else if (c === "," || /\s/.test(c)) {
      i++;
    } else {
      const m = /^[^\s,[\]()]+/.exec(src.slice(i));
      if (!m) throw new ParseError(`unexpected “${c}” inside the brackets`);
      stack[stack.length - 1].push(token(m[0], where()));
      i += m[0].length;
    }
  }
  if (end < 0)
    throw new ParseError(`a [ is never closed (${stack.length - 1} ] missing at the end)`);
  const rest = src.slice(end).trim();
  if (rest && !/^(?:,[^[\]]*)?\)?$/.test(rest)) {
    throw new ParseError(`unexpected text after the closing ]: “${rest.slice(0, 30)}”`);
  }
  return root[0];
}

// One row per line (or per ;), numbers separated by spaces or commas.
function parseRows(src) {
  return src
    .split(/\r?\n|;/)
    .map((r) => r.trim())
    .filter(Boolean)
    .map((row, i) =>
      row
        .split(/[\s,]+/)
        .filter(Boolean)
        .map((tok) => token(tok, `row ${i}`)),
    );
}

/** Parse a pasted array: JSON rows, a NumPy or torch print, or plain rows. Returns nested
 * arrays (numbers, NaN, ±Infinity, null, booleans), or undefined for an empty text; throws
 * an Error whose message says what is wrong in words. */
export function parse(text) {
  const src = String(text ?? "").trim();
  if (!src) return undefined;
  if (/\.\.\.|…/.test(src)) {
    throw new ParseError(
      'the array was printed shortened (“...”): print it in full (np.set_printoptions(threshold=sys.maxsize), torch.set_printoptions(profile="full")) or paste .tolist()',
    );
  }
  const open = src.indexOf("[");
  const value = open < 0 ? parseRows(src) : parseBracketed(src, open);
  checkShape(value);
  return value;
}

function shapeOf(value) {
  const s = [];
  for (let n = value; Array.isArray(n); n = n[0]) s.push(n.length);
  return s;
}

// The numbers as `expected` carries them: NaN as null, −∞ as null where null means −∞.
export function toWire(name, value) {
  const negInfIsNull = NEG_INF_NAMES.has(name);
  const conv = (v) => {
    if (Array.isArray(v)) return v.map(conv);
    if (typeof v !== "number") return v;
    if (Number.isNaN(v)) return null;
    if (v === -Infinity) return negInfIsNull ? null : -Number.MAX_VALUE;
    if (v === Infinity) return Number.MAX_VALUE;
    return v;
  };
  return conv(value);
}

// ---- the boxes ----------------------------------------------------------------------------

const texts = new Map(); // `${endpoint} ${label}` -> what the user pasted (kept across redraws)
let current = null; // the last afterRender's context
let boxes = new Map(); // label -> {details, textarea, error}
let dropped; // the `decimals` the last Compare left out of the request

const apiName = (label) => label.split(".").pop();
const keyOf = (ep, label) => `${ep} ${label}`;

// An array as the text in a box: rows of numbers for a matrix, JSON otherwise.
function asText(value) {
  const plain = (v) => (v === null ? "null" : String(v));
  const flat =
    Array.isArray(value) &&
    value.every((row) => Array.isArray(row) && row.every((v) => !Array.isArray(v)));
  return flat ? value.map((row) => row.map(plain).join(" ")).join("\n") : JSON.stringify(value);
}

function makeBox(ep, item, batched) {
  const details = document.createElement("details");
  details.className = "my-numbers";
  details.dataset.name = item.label;
  const summary = document.createElement("summary");
  summary.textContent = "Compare with my numbers";
  const id = `mine-${item.key}`;
  const label = document.createElement("label");
  label.htmlFor = id;
  label.textContent = `Your ${item.label}${batched ? " (every batch item: [B][rows][cols])" : ""}: JSON rows, a NumPy/torch print, or rows of numbers`;
  const area = document.createElement("textarea");
  area.id = id;
  area.rows = 4;
  area.spellcheck = false;
  area.dataset.name = item.label;
  area.placeholder = "[[0.1 0.2]\n [0.3 0.4]]";
  area.value = texts.get(keyOf(ep, item.label)) || "";
  if (area.value) details.open = true;
  const error = document.createElement("p");
  error.className = "box-error";
  error.id = `${id}-error`;
  error.hidden = true;
  error.setAttribute("role", "alert");
  area.setAttribute("aria-describedby", error.id);
  area.addEventListener("input", () => {
    texts.set(keyOf(ep, item.label), area.value);
    showBoxError(item.label, null);
  });
  const go = button("Compare", compareNow);
  go.className = "secondary compare-here";
  go.setAttribute("aria-label", "Compare all boxes with the service's numbers");
  details.addEventListener("toggle", () => {
    if (details.open) $("compare-bar").hidden = false;
  });
  details.append(summary, label, area, error, go);
  return { details, area, error };
}

function showBoxError(label, message) {
  const box = boxes.get(label);
  if (!box) return false;
  box.error.textContent = message || "";
  box.error.hidden = !message;
  box.area.classList.toggle("bad", !!message);
  if (message) {
    box.details.open = true;
    reveal(box.details);
  }
  return true;
}

// Opens the folds (a head's tables, a folded map) that hold `el`, so that it can be seen.
function reveal(el) {
  for (
    let d = el.parentElement && el.parentElement.closest("details");
    d;
    d = d.parentElement && d.parentElement.closest("details")
  )
    d.open = true;
}

// ---- the answer ---------------------------------------------------------------------------

const number = (v) => (v === null || v === undefined ? "—" : fmt(v));

// yours − ours, cell by cell; null where the difference is not a number (hatched)
export function differenceMap(name, yours, ours) {
  const nullYours = NEG_INF_NAMES.has(name) ? -Infinity : NaN;
  const real = (v, nullIs) =>
    v === null || v === undefined ? nullIs : typeof v === "boolean" ? Number(v) : v;
  return ours.map((row, i) =>
    row.map((o, j) => {
      const y = real(yours[i] && yours[i][j], nullYours);
      const x = real(o, -Infinity); // the response's null is a masked (−∞) score
      if ((Number.isNaN(x) && Number.isNaN(y)) || (x === y && !Number.isFinite(x))) return 0;
      if (x === -Infinity && y <= MASKED_FLOOR) return 0;
      if (!Number.isFinite(x) || !Number.isFinite(y)) return null;
      return y - x;
    }),
  );
}

// The caller's array for a label, from the request that was answered.
function yoursFor(body, label) {
  const exp = body && body.expected;
  if (!exp) return undefined;
  const parts = label.split(".");
  if (parts[0] === "heads")
    return exp.heads && exp.heads[Number(parts[1])]
      ? exp.heads[Number(parts[1])][parts[2]]
      : undefined;
  return exp[label];
}

function outline(fig, cell) {
  const [i, j] = cell;
  fig.dataset.where = `${i},${j}`;
  const rect = fig.querySelector(`rect.cell[data-row="${i}"][data-col="${j}"]`);
  if (rect) {
    rect.classList.add("where");
    const ring = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    for (const a of ["x", "y", "width", "height"]) ring.setAttribute(a, rect.getAttribute(a));
    ring.setAttribute("class", "where-outline");
    ring.setAttribute("fill", "none");
    ring.setAttribute("stroke", "#111");
    ring.setAttribute("stroke-width", "3");
    ring.setAttribute("pointer-events", "none");
    rect.ownerSVGElement.append(ring);
    return;
  }
  if (fig.markCell) fig.markCell(i, j); // a canvas map: outlined and brought into view
}

// The index within the drawn matrix of `where`, or null when it is in another batch item.
function cellOf(where, batched, b) {
  if (!Array.isArray(where) || where.length < 2) return null;
  if (where.length === 2) return where;
  if (batched && where.length === 3 && where[0] === b) return where.slice(1);
  return null;
}

function diffFigure(item, entry, yours, ours, ctx) {
  const shown = ctx.batched && shapeOf(yours).length === 3 ? yours[ctx.batch] : yours;
  if (!Array.isArray(shown) || shapeOf(shown).join() !== shapeOf(ours).join()) return null;
  const m = differenceMap(apiName(item.label), shown, ours);
  const cols = item.cols || Array.from({ length: ours[0].length }, (_, j) => String(j));
  const rows =
    item.rows && item.rows.length === ours.length
      ? item.rows
      : Array.from({ length: ours.length }, (_, i) => String(i));
  const title = `${item.label}: yours − ours`;
  const fig = heatmap(`diff_${item.key}`, title, m, rows, cols, "scores", null, null, item.axes); // the compared array's own axes
  fig.classList.add("diff", entry.match ? "ok" : "bad");
  fig.dataset.compared = item.label;
  const note = document.createElement("p");
  note.className = "hint";
  note.textContent = `${entry.match ? "✓ matches" : "✗ differs"}: largest |yours − ours| ${entry.max_abs_diff === null ? "∞ (one side not finite)" : fmt(entry.max_abs_diff)} at [${entry.where.join(", ")}] (outlined). Red: yours is lower; blue: higher; hatched: not comparable (one side −∞ or NaN).`;
  fig.querySelector("figcaption").after(note);
  const cell = cellOf(entry.where, ctx.batched, ctx.batch);
  if (cell) outline(fig, cell);
  return fig;
}

function warningsPanel(data) {
  const box = $("warnings");
  document.querySelectorAll(".field-warning").forEach((el) => el.remove());
  const list = Array.isArray(data.warnings) ? data.warnings : [];
  box.hidden = !list.length;
  box.replaceChildren();
  if (!list.length) return;
  const h = document.createElement("h2");
  h.textContent = list.length === 1 ? "Warning" : `Warnings (${list.length})`;
  const ul = document.createElement("ul");
  for (const w of list) {
    const li = document.createElement("li");
    li.dataset.code = w.code;
    const code = document.createElement("code");
    code.textContent = w.code;
    li.append("⚠ ", code, ` (${w.field}): ${w.message}`);
    ul.append(li);
    const field = formFieldFor(w.field);
    if (field) {
      const p = document.createElement("p");
      p.className = "field-warning";
      p.textContent = `⚠ ${w.message}`;
      field.append(p);
    }
  }
  box.append(h, ul);
}

function comparisonPanel(data, cards) {
  const panel = $("comparison");
  const rows = Array.isArray(data.comparison) ? data.comparison : null;
  panel.hidden = !rows;
  panel.replaceChildren();
  if (!rows) return;
  const h = document.createElement("h2");
  h.textContent = "Your numbers against the service's";
  panel.append(h);
  const first = rows.find((r) => r.name === data.first_mismatch);
  const verdict = document.createElement("div");
  verdict.className = "verdict";
  if (!first) {
    verdict.classList.add("ok");
    verdict.textContent = `✓ All ${rows.length} compared array${rows.length === 1 ? "" : "s"} match within the tolerance.`;
  } else if (first.diagnosis) {
    verdict.classList.add("diagnosis");
    const lead = document.createElement("p");
    lead.append(`Diagnosis for ${first.name}: `);
    first.diagnosis.mistakes.forEach((code, i) => {
      if (i) lead.append(" + ");
      const c = document.createElement("code");
      c.className = "mistake";
      c.textContent = code;
      lead.append(c);
    });
    const why = document.createElement("p");
    why.className = "explanation";
    why.textContent = first.diagnosis.explanation;
    verdict.append(lead, why);
  } else {
    verdict.classList.add("none");
    const lead = document.createElement("p");
    lead.textContent = `No listed mistake (alone or in pairs) reproduces your numbers in ${first.name}.`;
    const why = document.createElement("p");
    why.className = "explanation";
    why.textContent = first.message;
    verdict.append(lead, why);
  }
  panel.append(verdict);
  if (dropped !== undefined) {
    const note = document.createElement("p");
    note.className = "hint";
    note.textContent = `Compared at full precision: "decimals": ${JSON.stringify(dropped)} was left out of this request, so every number below is unrounded.`;
    panel.append(note);
  }
  const ol = document.createElement("ol");
  ol.className = "compared";
  for (const r of rows) {
    const li = document.createElement("li");
    li.dataset.name = r.name;
    li.className = r.match ? "ok" : "bad";
    if (r.name === data.first_mismatch) li.classList.add("first-mismatch");
    const mark = document.createElement("span");
    mark.className = "mark";
    mark.textContent = r.match ? "✓" : "✗";
    mark.setAttribute("aria-label", r.match ? "matches" : "differs");
    const name = document.createElement("code");
    name.textContent = r.name;
    const diff = r.max_abs_diff === null ? "∞" : fmt(r.max_abs_diff);
    li.append(
      mark,
      " ",
      name,
      ` max |diff| ${diff} at [${r.where.join(", ")}] (yours ${number(r.yours)}, ours ${number(r.ours)})`,
    );
    if (r.name === data.first_mismatch) li.append(" — first difference");
    const card = cards.get(r.name);
    if (card) {
      const show = button("show", () => {
        reveal(card);
        card.scrollIntoView({ block: "center" });
        card.classList.add("flash");
        setTimeout(() => card.classList.remove("flash"), 1200);
      });
      show.className = "secondary";
      show.setAttribute("aria-label", `Show ${r.name}`);
      li.append(" ", show);
    }
    li.title = r.message;
    ol.append(li);
  }
  panel.append(ol);
}

/** Called by render.js's render() once the outputs are drawn (main.js: whenDrawn): adds a box under each
 * comparable output, a difference map next to each compared one, and the panels on top. */
export function afterRender(ctx) {
  current = ctx;
  boxes = new Map();
  const cards = new Map();
  const rows = Array.isArray(ctx.data.comparison) ? ctx.data.comparison : [];
  const byName = new Map(rows.map((r) => [r.name, r]));
  for (const item of ctx.drawn) {
    if (!item.label || NOT_COMPARED.has(item.label) || NOT_COMPARED.has(apiName(item.label)))
      continue;
    const isFigure = item.el.tagName === "FIGURE";
    const sent = yoursFor(ctx.body, item.label); // e.g. `expected` in "more fields"
    if (Array.isArray(sent) && !texts.get(keyOf(ctx.ep, item.label)))
      texts.set(keyOf(ctx.ep, item.label), asText(sent));
    const box = makeBox(ctx.ep, item, ctx.batched);
    boxes.set(item.label, box);
    item.el.append(box.details); // a map's card, or a table's (render.js: table)
    if (box.details.open) reveal(box.details);
    const card = isFigure ? item.el : item.el.querySelector("table") || item.el;
    cards.set(item.label, card);
    const entry = byName.get(item.label);
    if (!entry) continue;
    card.classList.add("compared", entry.match ? "ok" : "bad");
    if (item.label === ctx.data.first_mismatch) card.classList.add("first-mismatch");
    const yours = yoursFor(ctx.body, item.label);
    const fig = Array.isArray(yours) && item.m ? diffFigure(item, entry, yours, item.m, ctx) : null;
    if (fig) {
      if (item.label === ctx.data.first_mismatch) fig.classList.add("first-mismatch");
      if (isFigure) item.el.after(fig);
      else item.el.append(fig); // beside a map; in a table's card
      reveal(fig);
    }
  }
  const tol = ctx.body && ctx.body.tolerance; // a request's own tolerance (e.g. from "more fields")
  if (tol && typeof tol === "object")
    for (const id of ["atol", "rtol"])
      if (typeof tol[id] === "number") $(id).value = String(tol[id]);
  warningsPanel(ctx.data);
  comparisonPanel(ctx.data, cards);
  // the tolerance and Compare show once a box is opened (or a comparison was asked for)
  const asked = rows.length > 0 || [...boxes.values()].some((box) => box.details.open);
  $("compare-bar").hidden = !boxes.size || !asked;
}

// ---- Compare ------------------------------------------------------------------------------

function tolerance() {
  const out = {};
  let ok = true;
  for (const id of ["atol", "rtol"]) {
    const el = $(id);
    const text = el.value.trim();
    const v = text === "" ? 1e-6 : Number(text);
    const bad = !Number.isFinite(v) || v < 0 || !NUMBER.test(text || "0");
    el.classList.toggle("bad", bad);
    const msg = $(`${id}-error`);
    msg.hidden = !bad;
    msg.textContent = bad ? `${id}: “${text}” is not a number ≥ 0 (e.g. 1e-6)` : "";
    if (bad) ok = false;
    else out[id] = v;
  }
  return ok ? out : null;
}

function say(text) {
  $("compare-status").textContent = text;
}

export async function compareNow() {
  if (!current || !state.lastResult || $("results").classList.contains("stale")) return; // an old answer is not compared
  const ep = current.ep;
  const expected = {};
  let count = 0;
  let failed = false;
  for (const [label, box] of boxes) {
    showBoxError(label, null);
    let value;
    try {
      value = parse(box.area.value);
    } catch (e) {
      if (!(e instanceof ParseError)) throw e;
      showBoxError(label, `Can't read your ${label}: ${e.message}`);
      failed = true;
      continue;
    }
    if (value === undefined) continue;
    const wire = toWire(apiName(label), value);
    const parts = label.split(".");
    if (parts[0] === "heads") {
      expected.heads = expected.heads || [];
      const h = Number(parts[1]);
      while (expected.heads.length <= h) expected.heads.push(null);
      expected.heads[h] = { ...(expected.heads[h] || {}), [parts[2]]: wire };
    } else expected[label] = wire;
    count++;
  }
  const tol = tolerance();
  if (failed || !tol) {
    say("Fix the marked box first");
    return;
  }
  if (!count) {
    say("Paste your numbers into at least one “Compare with my numbers” box");
    return;
  }
  // compared at full precision: the arrays drawn beside the differences are unrounded too
  const { expected: _e, tolerance: _t, decimals, ...base } = state.lastResult.body;
  dropped = decimals;
  const body = { ...base, expected, tolerance: tol };
  say("Comparing…");
  let response;
  try {
    response = await fetch(ep, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (e) {
    say(`The service did not answer: ${e.message}`);
    return;
  }
  const data = await response.json();
  if (!response.ok) {
    say(`Error ${response.status}`);
    const rest = [];
    for (const err of data.errors || []) {
      const m = /^expected\.(heads\[(\d+)\]\.)?(\w+)/.exec(err.field || "");
      const label = m ? (m[1] ? `heads.${m[2]}.${m[3]}` : m[3]) : null;
      if (!label || !showBoxError(label, err.message)) rest.push(err);
    }
    if (rest.length || !(data.errors || []).length)
      showErrors(data.message || `HTTP ${response.status}`, rest);
    return;
  }
  const batch = $("batch").value;
  state.lastResult = { ep, body, data };
  setupBatch(ep, data);
  if ([...$("batch").options].some((o) => o.value === batch)) $("batch").value = batch;
  // batched: show the batch item holding the first difference
  const first = (data.comparison || []).find((r) => r.name === data.first_mismatch);
  if (first && !$("batch-pick").hidden && first.where.length === 3)
    $("batch").value = String(first.where[0]);
  render();
  const bad = (data.comparison || []).filter((r) => !r.match).length;
  say(
    data.first_mismatch
      ? `Compared: ${bad} of ${data.comparison.length} differ; the first is ${data.first_mismatch}`
      : `Compared: all ${(data.comparison || []).length} match`,
  );
  $("checks").scrollIntoView({ block: "start" });
}

export function startCompare() {
  $("compare").addEventListener("click", compareNow);
  /** @type {any} */ (window).parseNumbers = parse; // for the page's tests and the console
}
