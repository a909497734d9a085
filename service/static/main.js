// @ts-check
// The attention explorer: builds a request from the form, calls this service's JSON API, and
// draws what comes back. No libraries, no build step, no request outside the service.
//
// Modules: request.js (state, form <-> request body, examples), run.js (Run), render.js (the
// results), heatmap.js and mapview.js (maps), cells.js (numbers and colours), compare.js
// ("compare with my numbers"), selection.js (selected queries), export.js (SVG/PNG, curl, CSV,
// JSON, safetensors), explain.js (what a clicked cell means). No module imports one that imports
// it back: what render.js's drawing sets off in compare.js and selection.js is registered here.
import { $, showFor, fillForm, loadExamples } from "./request.js";
import { run } from "./run.js";
import { render, closeExplain, whenDrawn } from "./render.js";
import { copyCurl, startExports } from "./export.js";
import { startCompare, afterRender } from "./compare.js";
import { drawSelection } from "./selection.js";

async function start() {
  $("form").addEventListener("submit", (e) => run(e));
  $("copy-curl").addEventListener("click", copyCurl);
  $("batch").addEventListener("change", render);
  $("mode").addEventListener("change", showFor);
  $("weight_layout").addEventListener("change", showFor); // the weight boxes' shapes
  $("weight_names").addEventListener("change", showFor);
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
  $("explain-close").addEventListener("click", closeExplain);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !$("explain").hidden) closeExplain();
  });
  whenDrawn(drawSelection);
  whenDrawn(afterRender);
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
  document.body.dataset.ready = "true";
}

start();
