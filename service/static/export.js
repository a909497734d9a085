// @ts-check
// Exports beside the form and the results: copy the request as curl, and the whole result as
// JSON or safetensors. (A map's SVG, PNG and CSV: heatmap.js; the files: lib/files.js.)
import { $, state } from "./lib/state.js";
import { download } from "./lib/files.js";
import { formBody } from "./request.js";

// ---- copy as curl -------------------------------------------------------------------------

export function curlCommand(ep, body) {
  const url = new URL(ep, location.href).href;
  const json = JSON.stringify(body).replace(/'/g, "'\\''");
  return `curl -s ${url} -H 'Content-Type: application/json' -d '${json}'`;
}

export async function copyCurl() {
  const body = formBody();
  if (body === undefined) return;
  const cmd = curlCommand($("endpoint").value, body);
  $("curl").textContent = cmd;
  $("curl").hidden = false;
  $("curl").dataset.body = JSON.stringify(body); // whose request it is (render.js: markStale)
  try {
    await navigator.clipboard.writeText(cmd);
    $("status").textContent = "curl command copied";
  } catch {
    $("status").textContent = "curl command shown below (copy it from there)";
  }
}

// ---- the whole result: JSON and safetensors ----------------------------------------------------

function downloadJson() {
  const r = state.lastResult;
  if (!r) return;
  download(
    `${r.ep}.json`,
    new Blob([JSON.stringify(r.data, null, 1)], { type: "application/json" }),
  );
}

// The same request again, answered as safetensors (every array a tensor named by its JSON path).
async function downloadSafetensors() {
  const r = state.lastResult;
  if (!r) return;
  const status = $("export-status");
  status.textContent = "Asking for safetensors…";
  let response;
  try {
    response = await fetch(r.ep, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/x-safetensors" },
      body: JSON.stringify(r.body),
    });
  } catch (e) {
    status.textContent = `The service did not answer: ${e.message}`;
    return;
  }
  if (!response.ok) {
    status.textContent = `Error ${response.status}`;
    return;
  }
  download(`${r.ep}.safetensors`, await response.blob());
  status.textContent = "";
}

export function startExports() {
  $("export-json").addEventListener("click", downloadJson);
  $("export-safetensors").addEventListener("click", downloadSafetensors);
}
