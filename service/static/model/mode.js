// @ts-check
// The trained-model mode: the tabs between it and the matrices (each mode keeps the answer it
// drew, put back when its tab is chosen again), the model form (GET /models: each model, one
// not installed here disabled with its install command), Run (POST /model) and its errors, shown
// in words next to the form and under the field they name (errors.js). Every answer is asked for
// as safetensors: Run asks only for what the model view draws (FIRST), opening a layer for that
// layer's trace (LAYER, fetchLayer). The answer is drawn by draw.js. main.js calls
// startModelMode once the page is ready.
import { $, state, loadSpec } from "../lib/state.js";
import { count } from "../lib/format.js";
import { clearErrors, showErrors } from "../errors.js";
import { render, setupBatch, markStale, closeExplain } from "../render.js";
import { drawModel, markModelStale, showLayer, firstHead } from "./draw.js";
import { readSafetensors } from "../lib/safetensors.js";

const saved = { steps: null, model: null }; // what each mode drew, kept while the other shows
let mode = "steps";
let models = null; // GET /models
let answer = null; // {body, data, layer}: the POST /model answer drawn, `layer` its trace's
let runs = 0; // a newer Run drops an older one's answer

const tabs = () =>
  /** @type {HTMLButtonElement[]} */ ([...document.querySelectorAll("#mode-tabs [role=tab]")]);

export function startModelMode() {
  for (const tab of tabs()) tab.addEventListener("click", () => showMode(tab.dataset.mode));
  $("mode-tabs").addEventListener("keydown", (e) => {
    if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
    const all = tabs();
    const at = all.indexOf(/** @type {HTMLButtonElement} */ (e.target));
    if (at < 0) return;
    const next = all[(at + (e.key === "ArrowRight" ? 1 : all.length - 1)) % all.length];
    next.focus();
    showMode(next.dataset.mode);
  });
  $("model-form").addEventListener("submit", (e) => {
    e.preventDefault();
    runModel();
  });
  $("model-name").addEventListener("change", describeModel);
  if (location.hash === "#model") showMode("model");
}

// The outcome line and error at the top of the results belong to the mode that wrote them.
function outcome() {
  return {
    status: $("outcome-status").textContent,
    hint: $("outcome-hint").textContent,
    error: $("outcome-error").textContent,
  };
}
function putOutcome(o) {
  $("outcome-status").textContent = o ? o.status : "";
  $("outcome-hint").textContent = o ? o.hint : "";
  $("outcome-error").textContent = o ? o.error : "";
  $("outcome-error").hidden = !(o && o.error);
}

// Resolves once no Run is under way (run.js and runModel set body[data-busy] while one is).
function idle() {
  return new Promise((resolve) => {
    if (!document.body.dataset.busy) return resolve(undefined);
    const watch = new MutationObserver(() => {
      if (document.body.dataset.busy) return;
      watch.disconnect();
      resolve(undefined);
    });
    watch.observe(document.body, { attributes: true, attributeFilter: ["data-busy"] });
  });
}

let switching = Promise.resolve();
/** Shows mode `next` ("steps" or "model"): its form, its answer, the other's kept aside. A Run
 * under way finishes first (its answer is drawn in the mode that asked for it). */
export function showMode(next) {
  switching = switching.then(async () => {
    await idle();
    await switchTo(next);
  });
  return switching;
}

async function switchTo(next) {
  if (next === mode || !(next in saved)) return;
  const results = $("results");
  saved[mode] = {
    result: state.lastResult,
    stale: results.classList.contains("stale"),
    outcome: outcome(),
  };
  mode = next;
  const model = next === "model";
  document.body.classList.toggle("model-mode", model);
  for (const tab of tabs()) {
    const on = tab.dataset.mode === next;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
  }
  $("form").hidden = model;
  $("model-form").hidden = !model;
  $("model-results").hidden = !model || !answer;
  /** @type {HTMLAnchorElement} */ (document.querySelector(".to-inputs")).href = model
    ? "#model-form"
    : "#form";
  history.replaceState(null, "", model ? "#model" : location.pathname + location.search);
  closeExplain();
  const back = saved[next];
  putOutcome(back && back.outcome);
  markStale(false);
  state.lastResult = back ? back.result : null;
  results.hidden = !state.lastResult;
  if (state.lastResult) {
    setupBatch(state.lastResult.ep, state.lastResult.data);
    render();
    markStale(back.stale);
  }
  if (model && models === null) await firstOpen();
}

// The first time the tab opens: the models listed, and the sentence in the box run.
async function firstOpen() {
  models = [];
  say("Loading the models…");
  try {
    const r = await fetch("models");
    models = await r.json();
    if (!r.ok || !Array.isArray(models)) throw new Error(models.message || `HTTP ${r.status}`);
  } catch (e) {
    models = null; // asked again when the tab next opens
    fail(`Could not list the models (GET /models): ${e.message}`, []);
    return;
  }
  const select = $("model-name");
  select.replaceChildren(
    ...models.map((m) => {
      const o = new Option(
        m.installed
          ? `${m.name} — ${count(m.layers, "layer")} × ${count(m.heads, "head")} (${m.kind})`
          : `${m.name} (not installed here)`,
        m.name,
      );
      o.disabled = !m.installed;
      return o;
    }),
  );
  const usable = models.find((m) => m.installed);
  if (usable) select.value = usable.name;
  describeModel();
  await notInstalled();
  $("model-form").dataset.ready = "true";
  if (usable) await runModel();
  else say("No model is installed on this server.");
}

// The models listed but not installed, each with the command that installs it (the 501 that
// POST /model answers for it says which).
async function notInstalled() {
  const missing = models.filter((m) => !m.installed);
  const lines = await Promise.all(
    missing.map(async (m) => {
      let command = null;
      try {
        const r = await fetch("model", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ model: m.name, text: "a", layer: 0 }),
        });
        if (r.status === 501) command = (await r.json()).install_command || null;
      } catch {
        // said below without the command
      }
      const li = document.createElement("li");
      li.dataset.model = m.name;
      li.append(`${m.name} is not installed on this server`);
      if (command) {
        const code = document.createElement("code");
        code.textContent = command;
        li.append(": install it with ", code);
      }
      li.append(".");
      return li;
    }),
  );
  $("model-missing").replaceChildren(...lines);
  $("model-missing").hidden = !lines.length;
}

// What the chosen model is.
function describeModel() {
  const m = (models || []).find((x) => x.name === $("model-name").value);
  const about = $("model-about");
  if (!m) {
    about.textContent = "";
    return;
  }
  about.textContent = `${m.source}. ${m.kind === "decoder" ? "A causal decoder: each token sees only those before it" : "An encoder: every token sees every token"}; d_model ${m.d_model}; tokenizer ${m.tokenizer}; licence ${m.license}.`;
}

function say(text, hint = "") {
  $("model-status").textContent = text;
  $("outcome-status").textContent = text;
  $("outcome-hint").textContent = hint;
}

// An error in words beside the form (with the install command of a 501), at the top of the
// results and under the field it names; the answer drawn before is marked stale.
function fail(message, errors, status = 0, install = null) {
  say(status ? `Error ${status}` : "");
  showErrors(message, errors);
  const box = $("model-error");
  box.replaceChildren(message);
  if (install) {
    const code = document.createElement("code");
    code.textContent = install;
    box.append(" Install it on the server with ", code, ".");
  }
  box.hidden = false;
  const first = document.querySelector(
    "#model-form .has-error textarea, #model-form .has-error select",
  );
  if (first) first.setAttribute("aria-describedby", "model-error");
  markModelStale(true);
}

/** What Run asks for: what the model view draws, not the trace (about 10 MB a layer at 128
 * tokens), which comes when a layer is opened. */
export const FIRST = ["model", "tokens", "attention", "head_roles", "rollout"];
/** What opening a layer asks for: its trace and the weights it was computed from. */
export const LAYER = ["trace", "layer_weights"];

/**
 * POST /model with `body` as safetensors (its arrays as raw float64, not JSON text); returns
 * {ok, status, data}: the answer read back into its JSON shape, or the error's JSON.
 * @param {object} body
 */
async function postModel(body) {
  const response = await fetch("model", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/x-safetensors" },
    body: JSON.stringify(body),
  });
  const binary = (response.headers.get("content-type") || "").includes("safetensors");
  const data = binary ? readSafetensors(await response.arrayBuffer()) : await response.json();
  return { ok: response.ok && binary, status: response.status, data };
}

/**
 * One request with the page's status, busy flag and errors: `say` while it runs, `done(data,
 * ms)` with its answer unless a newer request came since.
 * @param {object} body
 * @param {string} saying
 * @param {(data: any, ms: number) => void} done
 */
async function ask(body, saying, done) {
  clearErrors();
  $("model-error").hidden = true;
  const seq = ++runs;
  document.body.dataset.busy = "true";
  try {
    say(saying);
    const started = performance.now();
    let got;
    try {
      got = await postModel(body);
    } catch (e) {
      if (seq === runs) fail(`The service did not answer: ${e.message}`, []);
      return;
    }
    if (seq !== runs) return;
    const { ok, status, data } = got;
    if (!ok) {
      fail(data.message || `HTTP ${status}`, data.errors || [], status, data.install_command);
      return;
    }
    await loadSpec(); // render.js draws the trace from the schema's views
    done(data, performance.now() - started);
  } finally {
    if (seq === runs) delete document.body.dataset.busy;
  }
}

/** Run: the form's model and text to POST /model, asking for what the model view draws; the
 * answer drawn, no layer open. */
export async function runModel() {
  const body = { model: $("model-name").value, text: $("model-text").value };
  await ask({ ...body, include: FIRST }, "Computing…", (data, ms) => {
    answer = { body, data, layer: null };
    $("model-results").hidden = false;
    markModelStale(false);
    drawModel(answer, openLayer);
    say(
      `Done in ${Math.round(ms)} ms.`,
      "Click a head (or a layer's name) to open its layer: its head view, and its trace step by step.",
    );
  });
}

/**
 * Opens layer `layer` with head `head` chosen (-1: its first head with a role): drawn at once
 * from the answer's weights, and its trace fetched unless the answer holds it already.
 * @param {number} layer
 * @param {number} head
 */
export async function openLayer(layer, head) {
  if (!answer) return;
  const h = head >= 0 ? head : firstHead(layer);
  showLayer(layer, h, true);
  if (answer.layer === layer) return;
  await fetchLayer(layer);
}

/**
 * Layer `layer`'s trace of the text drawn: POST /model with only what the layer needs; the
 * answer's other numbers stay.
 * @param {number} layer
 */
export async function fetchLayer(layer) {
  const { body } = answer;
  await ask({ ...body, layer, include: LAYER }, `Computing layer ${layer}…`, (data, ms) => {
    // layer_weights: the /multihead fields besides x that the trace was computed from
    const { trace, layer_weights } = data;
    answer = { body, data: { ...answer.data, trace, layer_weights }, layer };
    markModelStale(false);
    drawModel(answer, openLayer);
    say(
      `Done in ${Math.round(ms)} ms (layer ${layer}).`,
      "Hover a token of the head view to see only its lines; click a cell of a map to see how it was computed.",
    );
  });
}
