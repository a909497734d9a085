// @ts-check
// "Compare with my numbers" for the attention explorer: a box under each drawn output where a
// learner pastes the array their notebook computed (JSON, NumPy's or torch's print, or plain
// rows, read by lib/paste.js); and a Compare action that re-sends the last request with
// `expected` filled from the boxes and draws the answer again (its comparison: verdict.js).
//
// render.js calls afterRender once the outputs are drawn (main.js registers it: whenDrawn);
// main.js calls startCompare.
import { $, state, button } from "./lib/state.js";
import { parse, toWire, ParseError, NUMBER } from "./lib/paste.js";
import { showErrors } from "./errors.js";
import { SINK_WEIGHTS } from "./lib/layers.js";
import { render, setupBatch } from "./render.js";
import {
  apiName,
  reveal,
  diffFigure,
  warningsPanel,
  comparisonPanel,
  comparedAtWords,
} from "./verdict.js";

// drawn outputs that are inputs (generated, or a model layer's x_in) or not compared
const NOT_COMPARED = new Set(["x", "x_in", "w_q", "w_k", "w_v", SINK_WEIGHTS]);

// ---- the boxes ----------------------------------------------------------------------------

const texts = new Map(); // `${endpoint} ${label}` -> what the user pasted (kept across redraws)
let current = null; // the last afterRender's context
let boxes = new Map(); // label -> {details, textarea, error}
let dropped; // the `decimals` the last Compare left out of the request
let compared = null; // the body the last Compare sent
let typed = new Set(); // the tolerance inputs ("atol", "rtol") typed in for it
let quiet = null; // the answer whose "used:" note an edit of the inputs cleared

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

// ---- drawn -------------------------------------------------------------------------------

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
    item.el.append(box.details); // a map's card, or a table's (lib/table.js: table)
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
  const own = ctx.body !== compared; // not the page's Compare: its tolerance fills the inputs
  if (own && tol && typeof tol === "object")
    for (const id of ["atol", "rtol"])
      if (typeof tol[id] === "number") $(id).value = String(tol[id]);
  const yours = own && tol && typeof tol === "object" ? new Set(Object.keys(tol)) : typed;
  showUsed(rows.length && ctx.data !== quiet ? used(rows, tol, yours) : null);
  warningsPanel(ctx.data);
  comparisonPanel(ctx.data, cards, dropped);
  // the tolerance and Compare show once a box is opened (or a comparison was asked for)
  const asked = rows.length > 0 || [...boxes.values()].some((box) => box.details.open);
  $("compare-bar").hidden = !boxes.size || !asked;
}

// ---- the tolerance used ------------------------------------------------------------------

const DEFAULT = 1e-6; // the service's atol and rtol when none is given
const PLACEHOLDER = "1e-6, or as printed";
const tolText = (v) => (v !== 0 && Math.abs(v) < 0.01 ? v.toExponential() : String(v)); // 1e-6

/** What each compared array was compared at, in words, with what the empty inputs' placeholders
 * show: the tolerance sent (`yours`: the ids typed, the rest the default), or, when none was
 * sent, each array's printed precision or the default, grouped ("the 4 decimals you printed
 * (weights, output); the default 1e-6 (scores)"). */
function used(rows, tol, yours) {
  if (tol && typeof tol === "object") {
    const parts = ["atol", "rtol"].map((id) => ({
      id,
      v: typeof tol[id] === "number" ? tol[id] : DEFAULT,
      mine: yours.has(id),
    }));
    const text = parts.every((p) => p.mine)
      ? `used: ${parts.map((p) => `${p.id} ${tolText(p.v)}`).join(", ")} (yours)`
      : `used: ${parts.map((p) => `${p.id} ${tolText(p.v)} (${p.mine ? "yours" : "the default"})`).join(", ")}`;
    return { text, placeholder: `${tolText(DEFAULT)} (default)` };
  }
  const groups = new Map(); // "the 4 decimals you printed" -> names; "" -> the default's
  for (const r of rows) {
    const words = comparedAtWords(r) || "";
    groups.set(words, [...(groups.get(words) || []), r.name]);
  }
  const atDefault = groups.get("");
  groups.delete("");
  const list = [...groups].map(([words, names]) => `${words} (${names.join(", ")})`);
  if (!list.length)
    return {
      text: `used: atol ${tolText(DEFAULT)}, rtol ${tolText(DEFAULT)} (the default)`,
      placeholder: `${tolText(DEFAULT)} (default)`,
    };
  if (atDefault) list.push(`the default ${tolText(DEFAULT)} (${atDefault.join(", ")})`);
  return {
    text: `used: ${list.join("; ")}`,
    placeholder: atDefault ? `printed / ${tolText(DEFAULT)}` : "as printed", // fits the input
  };
}

// The note under the inputs (tied to them by aria-describedby) and the empty inputs'
// placeholders; null clears them.
function showUsed(shown) {
  const note = $("tol-used");
  note.textContent = shown ? shown.text : "";
  note.hidden = !shown;
  for (const id of ["atol", "rtol"])
    $(id).placeholder = shown && !$(id).value.trim() ? shown.placeholder : PLACEHOLDER;
}

// ---- Compare ------------------------------------------------------------------------------

// The tolerance typed in, or {} when both boxes are empty: then none is sent, and the service
// compares printed numbers at the precision they were printed with (else at 1e-6).
function tolerance() {
  const out = {};
  let ok = true;
  const ids = ["atol", "rtol"];
  if (ids.every((id) => $(id).value.trim() === "")) {
    for (const id of ids) {
      $(id).classList.remove("bad");
      $(`${id}-error`).hidden = true;
    }
    return out;
  }
  for (const id of ids) {
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
  const body = Object.keys(tol).length
    ? { ...base, expected, tolerance: tol }
    : { ...base, expected };
  const mine = new Set(["atol", "rtol"].filter((id) => $(id).value.trim() !== ""));
  // a result drawn from another endpoint's answer says where its Compare goes (model/compare.js)
  const via = state.lastResult.via;
  const sent = via ? via.request(body) : { ep, body };
  say("Comparing…");
  let response;
  try {
    response = await fetch(sent.ep, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(sent.body),
    });
  } catch (e) {
    say(`The service did not answer: ${e.message}`);
    return;
  }
  const answer = await response.json();
  const data = via && response.ok ? via.answer(answer) : answer;
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
  compared = body;
  typed = mine;
  state.lastResult = { ep, body, data, via };
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
  for (const id of ["atol", "rtol"])
    $(id).addEventListener("input", () => {
      // what was used no longer says what the inputs hold: cleared until the next comparison
      quiet = state.lastResult && state.lastResult.data;
      showUsed(null);
    });
  /** @type {any} */ (window).parseNumbers = parse; // for the page's tests and the console
}
