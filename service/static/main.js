// @ts-check
// The attention explorer: builds a request from the form, calls this service's JSON API, and
// draws what comes back. No libraries, no build step, no request outside the service.
//
// Modules, callers above what they call (no module imports one that imports it back):
//   main.js       wires the page: the form's events, Run, the hooks of what render.js draws
//   run.js        Run: sends the form's body, draws the answer (or marks the last one stale)
//   export.js     copy as curl, the whole result as JSON or safetensors
//   compare.js    "compare with my numbers": the boxes and Compare (its answer: verdict.js)
//   verdict.js    the answer's verdicts: the comparison, warnings, check_decode's
//   selection.js  selected queries: attention summed over picked rows of the weights
//   explain.js    what a clicked cell means (loaded on the first click; lib/arithmetic.js)
//   render.js     the results: summary, maps, tables, steps, batch picker, explanation panel
//   heads.js      /multihead's heads side by side
//   heatmap.js    a map's card (SVG when small; mapview.js's zoomable canvas when large)
//   gradients.js  the backward: each gradient's map beside its output, the backward's steps marked
//   backward-explain.js  what a clicked gradient cell means (lib/backward.js: its arithmetic)
//   backward-form.js  grad_output from the form (off, the signed pattern, "sum", an array)
//   request.js    the request body from the form; form.js the form's fields and examples;
//   layers/form.js  the fields of today's layers (v_norm, temperature, k_eq_v, the gate, …)
//   errors.js     errors next to their fields
//   model/        a trained model on your sentence (POST /model): mode.js the tabs, its form and
//                 Run; draw.js its answer (the trace through render.js); grid.js every layer ×
//                 head; lines.js one head's head view
//   layers/explain.js  the explanations of today's layers' cells (norms, RoPE, temperature, gate,
//                 MLA's latents and shared key: layers/latent.js)
//   layers/blocks.js  the online softmax block by block for one row (arithmetic: layers/online.js)
//   lib/          leaves: state, format, fields, files, schema, table, svg, picture, paste,
//                 arithmetic, layers, pick, explain-parts, positions, safetensors, backward (import
//                 nothing above them)
// What render.js's drawing sets off in compare.js, selection.js and verdict.js is registered here
// (whenDrawn), so that render.js imports none of them.
import { showFor, fillForm, loadExamples } from "./form.js";
import { startLayers } from "./layers/form.js";
import { run } from "./run.js";
import { render, closeExplain, whenDrawn } from "./render.js";
import { copyCurl, startExports } from "./export.js";
import { startCompare, afterRender } from "./compare.js";
import { drawDecodeCheck } from "./verdict.js";
import { drawSelection } from "./selection.js";
import { drawOnline } from "./layers/blocks.js";
import { startModelMode } from "./model/mode.js";
import { showGrad } from "./backward-form.js";
import { $, state } from "./lib/state.js";

async function start() {
  $("form").addEventListener("submit", (e) => run(e));
  $("copy-curl").addEventListener("click", copyCurl);
  $("batch").addEventListener("change", render);
  $("mode").addEventListener("change", showFor);
  $("weight_layout").addEventListener("change", showFor); // the weight boxes' shapes
  $("weight_names").addEventListener("change", showFor);
  startLayers(showFor); // today's layers: the gate's and k_eq_v's boxes, settings that turn on
  let examples = {};
  $("endpoint").addEventListener("change", async () => {
    showFor();
    examples = await loadExamples();
  });
  // picking a worked example runs it
  $("example").addEventListener("change", () => {
    const ex = examples[$("example").value];
    if (ex) {
      fillForm(ex.value);
      run();
    }
  });
  $("grad_mode").addEventListener("change", () =>
    showGrad(state.lastResult && state.lastResult.data),
  );
  $("explain-close").addEventListener("click", closeExplain);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !$("explain").hidden) closeExplain();
  });
  whenDrawn(drawSelection);
  whenDrawn(afterRender);
  whenDrawn(drawOnline);
  whenDrawn(drawDecodeCheck);
  startCompare();
  startExports();
  showFor();
  examples = await loadExamples();
  const first = Object.keys(examples)[0];
  if (first) {
    $("example").value = first;
    fillForm(examples[first].value);
    await run(null, { scroll: false }); // the page opens with the first example drawn
  }
  startModelMode(); // its tab (opened at once by a #model address)
  document.body.dataset.ready = "true";
}

start();
