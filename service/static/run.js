// @ts-check
// Run: build the body from the form, send it, and draw the answer (render.js); an answer that
// failed leaves the one drawn before marked as stale (render.js: markStale).
import { $, state, loadSpec } from "./lib/state.js";
import { readSafetensors } from "./lib/safetensors.js";
import { formBody } from "./request.js";
import { showErrors } from "./errors.js";
import { render, setupBatch, markStale } from "./render.js";
import { patternFor, patternPending, rememberShape } from "./backward-form.js";

// The status line: beside the second Run button and at the top of the results.
// `hint` (optional): a second sentence at the top only.
export function say(text, hint = "") {
  $("status").textContent = text;
  $("outcome-status").textContent = text;
  $("outcome-hint").textContent = hint;
}

// From this many tokens on, the answer is asked for as safetensors (the same numbers, read as
// typed arrays instead of parsing megabytes of JSON).
const LARGE = 512;
function sequenceLength(body) {
  const rows = (m) =>
    Array.isArray(m) ? (Array.isArray(m[0]) && Array.isArray(m[0][0]) ? m[0].length : m.length) : 0;
  return Math.max(
    Number(body.seq_len) || 0,
    Array.isArray(body.tokens) ? body.tokens.length : 0,
    typeof body.sentence === "string" ? body.sentence.split(/\s+/).length : 0,
    rows(body.x),
    rows(body.q),
    rows(body.k),
  );
}

let runs = 0; // a newer Run makes an older answer stale: it is dropped
// Run: build the body from the form, send it, draw the answer. `scroll`: bring the results into
// view when they are off screen (not on arrival). body[data-busy] is set while a Run is under way.
export async function run(event, { scroll = true } = {}) {
  if (event && event.preventDefault) event.preventDefault();
  const body = formBody();
  if (body === undefined) {
    markStale(true);
    return;
  }
  state.lastBody = body;
  const ep = $("endpoint").value;
  const seq = ++runs;
  document.body.dataset.busy = "true";
  try {
    say("Computing…");
    const started = performance.now();
    let response;
    try {
      // the backward's default pattern, shaped as the last array: asked for first when unknown
      if (patternPending(body)) {
        const dO = await patternFor(ep, body);
        if (dO !== undefined) body.grad_output = dO;
        if (seq !== runs) return;
      }
      const headers = { "Content-Type": "application/json" };
      if (sequenceLength(body) >= LARGE) headers.Accept = "application/x-safetensors"; // read far faster than JSON
      response = await fetch(ep, { method: "POST", headers, body: JSON.stringify(body) });
    } catch (e) {
      if (seq === runs) {
        say("");
        showErrors(`The service did not answer: ${e.message}`, []);
        markStale(true);
      }
      return;
    }
    const received = performance.now();
    const binary = (response.headers.get("content-type") || "").includes("safetensors");
    const data = binary ? readSafetensors(await response.arrayBuffer()) : await response.json();
    const parsed = performance.now();
    if (seq !== runs) return;
    if (!response.ok) {
      say(`Error ${response.status}`);
      showErrors(data.message || `HTTP ${response.status}`, data.errors || []);
      markStale(true);
      return;
    }
    try {
      await loadSpec();
    } catch (e) {
      say("");
      showErrors(`Could not read openapi.json: ${e.message}`, []);
      markStale(true);
      return;
    }
    state.lastResult = { ep, body, data };
    rememberShape(body, data);
    markStale(false);
    const ms = performance.now() - started;
    setupBatch(ep, data);
    render();
    const drawn = performance.now();
    say(
      `Done in ${Math.round(ms)} ms.`,
      "Click any cell of a map, or of the output, to see how it was computed.",
    );
    // how long each part took, for the large-input test: answer, JSON.parse, drawing, first paint
    const timing = {
      format: binary ? "safetensors" : "json",
      request_ms: received - started,
      parse_ms: parsed - received,
      render_ms: drawn - parsed,
    };
    requestAnimationFrame(() =>
      setTimeout(() => {
        timing.first_paint_ms = performance.now() - started;
        /** @type {any} */ (window).explorerTiming = timing;
      }, 0),
    );
    const top = $("results").getBoundingClientRect().top;
    if (scroll && (top < 0 || top > window.innerHeight))
      $("results").scrollIntoView({ block: "start" });
  } finally {
    if (seq === runs) delete document.body.dataset.busy;
  }
}
